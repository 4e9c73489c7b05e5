"""Core's BF16 GEMM for CPUs with AVX512-BF16: a weight packed once into panels of 32 output columns,
then one C++ kernel (``csrc/bf16_gemm.cpp``) for every row count, FP32 sums rounded once to BF16.

Why our own: at decode sizes a BF16 linear layer only streams its weight, so it should read at the
memory's speed. oneDNN's packed matmul (vLLM's CPU GEMM on a CPU without AMX) does not: on the llama3
bench config's weights it read 17-21 GB/s at one to eight rows in two runs (read streams of 31 and
56 GB/s), ``F.linear`` 9-11. The panel layout makes every panel one sequential stream and needs no
horizontal sums: 22-38 GB/s there, 1.24-1.93x oneDNN's, 1.1x at 16 rows; from 32 rows both are bound
by ``VDPBF16PS`` arithmetic and run as fast (0.94-1.07x; ``docs/benchmarks/bf16-gemm.md``,
``nox -s bench-gemm``). Used by the vLLM bridge and by the runner's eager models (``cpu.packed_layers``).

The kernel is compiled with the host's C++ compiler the first time a process needs it (about 15 s here,
with ``torch.utils.cpp_extension``, which needs ``ninja``), and cached under ``~/.cache/trnmodels/kernels``
(``$XDG_CACHE_HOME``), one build per torch version; ``why_unavailable`` says why it cannot run.
"""

from __future__ import annotations

import functools
import logging
import os
from pathlib import Path

import torch
from filelock import FileLock

from ..compile.cache import make_private_dirs

logger = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("csrc") / "bf16_gemm.cpp"
_FLAGS = ["-O3", "-fopenmp", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512bf16"]


def build_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "trnmodels" / "kernels" / f"torch-{torch.__version__}"


def why_unavailable() -> str | None:
    """Why the kernel cannot run in this process (None when it can); builds it on the first call."""
    if not torch.cpu._is_avx512_bf16_supported():
        return "this CPU has no AVX512-BF16"
    return _load()


@functools.cache
def _load() -> str | None:
    from torch.utils import cpp_extension

    folder = build_dir()
    make_private_dirs(folder)
    logger.info("trnmodels: loading core's BF16 GEMM kernel (built once into %s)", folder)
    try:
        # cpp_extension serialises builds with a plain ``lock`` file that a process killed mid-build
        # leaves behind, and every later build then waits for it forever. An OS lock dies with its
        # holder: whoever holds it is the only builder, so a ``lock`` file left there is stale.
        with FileLock(folder / "trnmodels.lock"):
            (folder / "lock").unlink(missing_ok=True)
            cpp_extension.load(
                name="trnmodels_bf16_gemm",
                sources=[str(SOURCE)],
                extra_cflags=_FLAGS,
                extra_ldflags=["-fopenmp"],
                build_directory=str(folder),
                is_python_module=False,
            )
    except (RuntimeError, OSError, ImportError) as e:  # no compiler, no ninja, a failed build
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        return f"its C++ kernel could not be built here ({first})"
    torch.library.register_fake("trnmodels_cpu::bf16_gemm")(_gemm_shape)
    return None


def _gemm_shape(x: torch.Tensor, packed: torch.Tensor, n: int) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], n))


def pack(weight: torch.Tensor) -> torch.Tensor:
    """``weight`` [N, K] (BF16) in the kernel's layout: [ceil(N/32), ceil(K/2), 32, 2], zero-padded."""
    _require()
    return torch.ops.trnmodels_cpu.bf16_gemm_pack(weight)


def gemm(x: torch.Tensor, packed: torch.Tensor, n: int) -> torch.Tensor:
    """``x @ weight.T`` for ``packed = pack(weight)`` and ``n = weight.shape[0]``; ``x`` [..., K] BF16."""
    return torch.ops.trnmodels_cpu.bf16_gemm(x, packed, n)


def _require() -> None:
    reason = why_unavailable()
    if reason is not None:
        raise RuntimeError(f"core's BF16 GEMM cannot run: {reason}")
