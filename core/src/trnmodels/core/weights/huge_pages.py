"""A model's parameters in transparent huge pages, placed before its weights are read.

A batch-1 decode step reads every weight from memory once, in long row-major streams. In 4 KiB pages a
stream crosses a page every 4 KiB, each a TLB entry to walk, and the CPU's prefetchers start over at
every page boundary; in 2 MiB pages it crosses one every 2 MiB. This machine's kernel gives huge pages
only to memory that asks for them (``/sys/kernel/mm/transparent_hugepage/enabled`` is ``madvise``), and
torch's allocator asks only under ``THP_MEM_ALLOC_ENABLE=1``, read once when torch first allocates.

So ``place_in_huge_pages`` moves a freshly built model's parameters into one private anonymous mapping,
2 MiB-aligned and advised ``MADV_HUGEPAGE``, before any of it is written: the loader's writes then fault
it in as huge pages. Measured here, in one process, the same compiled graphs bound to a model placed so
and to one in torch's own allocations, taking turns (medians of 9, ms a batch-1 decode step, the same
tokens): the llama3 bench config 12.25 → 11.45, SmolLM2-135M 16.73 → 14.56. Batch 8 (compiled, where
the step computes more than it reads) and the eager steps moved within the noise.

It is opt-in (``TRNMODELS_HUGE_PAGES=1``, read by ``causal_lm.build_model``) because of what the first
write costs on this machine, a Firecracker VM with a virtio balloon: the guest hands free 2 MiB blocks
back to the host, and a huge page is such a block, which the host then provides again at its first
touch. Filling 400 MiB took 0.7–1.6 s in huge pages against about 0.1 s in 4 KiB pages (at other times
22 ms against 80 ms), and loading the llama3 bench checkpoint just after writing it went from 0.20 s to
0.6–2.4 s, all of it in ``preadv``: the loading target (≥ 0.8× a plain safetensors read) would be lost
for a step 7–13% faster. A host whose memory is not ballooned pays none of that.

Only the runner's models are placed: under vLLM the bridge hands many weights to vLLM's packed GEMMs and
frees them, which one shared mapping would not give back.
"""

from __future__ import annotations

import mmap
import os

import torch

from ..errors import ConfigError

HUGE_PAGES_ENV_VAR = "TRNMODELS_HUGE_PAGES"
HUGE_PAGE = 2 << 20
_ALIGN = 64  # a cache line: each storage starts on its own, as torch's allocator places them
_MADV_HUGEPAGE = getattr(mmap, "MADV_HUGEPAGE", None)  # Linux only


def huge_pages_supported() -> bool:
    """Whether this platform can advise memory for transparent huge pages (Linux)."""
    return _MADV_HUGEPAGE is not None


def huge_pages_requested() -> bool:
    """Whether ``TRNMODELS_HUGE_PAGES`` asks for the runner's weights in huge pages: ``1`` yes, ``0`` or
    unset no; anything else is refused, naming the variable."""
    value = os.environ.get(HUGE_PAGES_ENV_VAR, "0").strip()
    if value not in ("0", "1"):
        raise ConfigError(f"{HUGE_PAGES_ENV_VAR}={value!r}: expected 1 (weights in huge pages) or 0 (not)")
    return value == "1"


def place_in_huge_pages(module: torch.nn.Module) -> int:
    """Move every CPU parameter of ``module`` into one mapping advised for huge pages; return its bytes.

    The parameters' values are not kept: call this on a model about to be loaded. Shapes, strides,
    dtypes and sharing are: parameters that were views of one storage stay views of one, and a
    parameter shared by two modules is still one object. Without huge-page support nothing moves (0).
    """
    if not huge_pages_supported():
        return 0
    storages: dict[int, tuple[int, list[torch.nn.Parameter]]] = {}
    for param in module.parameters():
        if param.device.type != "cpu":
            continue
        storage = param.untyped_storage()
        storages.setdefault(storage.data_ptr(), (storage.nbytes(), []))[1].append(param)
    offsets, total = {}, 0
    for ptr, (nbytes, _) in storages.items():
        offsets[ptr] = total
        total += -(-nbytes // _ALIGN) * _ALIGN
    if total == 0:
        return 0
    mapping = mmap.mmap(-1, total + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    mapping.madvise(_MADV_HUGEPAGE)
    # The tensor holds the mapping: it is unmapped when the last parameter viewing it is freed.
    raw = torch.frombuffer(mapping, dtype=torch.uint8)
    # A multiple of the 4 KiB pages mmap aligns to, and each offset of 64: both divide by any dtype's size.
    start = -raw.data_ptr() % HUGE_PAGE
    for ptr, (_, params) in storages.items():
        for param in params:
            # as_strided's offset counts from the mapping's first byte, in elements of the parameter's dtype.
            first = (start + offsets[ptr]) // param.element_size() + param.storage_offset()
            param.data = raw.view(param.dtype).as_strided(param.shape, param.stride(), first)
    return total
