"""Core's BF16 GEMM for CPUs with AVX512-BF16 or AVX2: a weight packed once into panels of 32 output
columns, then one C++ kernel (``csrc/bf16_gemm.cpp``) for every row count, FP32 sums rounded once to BF16.

Why our own: at decode sizes a BF16 linear layer only streams its weight, so it should read at the
memory's speed. oneDNN's packed matmul (vLLM's CPU GEMM on a CPU without AMX) does not: on the llama3
bench config's weights it read 17-21 GB/s at one to eight rows in two runs (read streams of 31 and
56 GB/s), ``F.linear`` 9-11. The panel layout makes every panel one sequential stream and needs no
horizontal sums: 22-38 GB/s there, 1.24-1.93x oneDNN's, 1.1x at 16 rows; from 32 rows both are bound
by ``VDPBF16PS`` arithmetic and run as fast (0.94-1.07x; ``docs/benchmarks/bf16-gemm.md``,
``nox -s bench-gemm``). Used by the vLLM bridge and by the runner's eager models (``cpu.packed_layers``).

A CPU without AVX512-BF16 has no BF16 arithmetic. On an AVX2 one (an AMD Zen 3 here) torch's BF16
``F.linear`` converts inside its inner loop, and vLLM's oneDNN matmul cannot be built for BF16, so vLLM
falls back to ``F.linear``: on the same weights it read 14.0 GB/s at one row and 2.1 at eight, a 30.8 GB/s read
stream. The AVX2 build reads the same packed weight. It widens each BF16 pair to FP32 in registers
(a mask and a shift), then does two FMAs in ``VDPBF16PS``'s order; rows share a load two at a time.
It read 22.0 GB/s at one row, 10.2 at eight, and 4.9-7.6x ``F.linear`` from 8 to 512 rows
(``docs/benchmarks/bf16-gemm-avx2.md``).

The kernel is compiled with the host's C++ compiler the first time a process needs it (about 15 s here,
with ``torch.utils.cpp_extension``, which needs ``ninja``), and cached under ``~/.cache/trnmodels/kernels``
(``$XDG_CACHE_HOME``), one build per torch version and instruction set; ``why_unavailable`` says why it
cannot run. ``TRNMODELS_BF16_GEMM_ISA=avx2`` runs the AVX2 build on a CPU with AVX512-BF16 (to bisect a
difference, and so that its tests run there); any other value, or one this CPU cannot run, is refused.
"""

from __future__ import annotations

import functools
import logging
import os
from pathlib import Path

import torch
from filelock import FileLock

from ..compile.cache import make_private_dirs
from ..errors import ConfigError

logger = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("csrc") / "bf16_gemm.cpp"
# One build per instruction set, each its own library; the first this CPU has is used.
ISA_FLAGS = {
    "avx512_bf16": ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512bf16"],
    "avx2": ["-mavx2", "-mfma"],
}
ISA_ENV_VAR = "TRNMODELS_BF16_GEMM_ISA"  # one of ISA_FLAGS: that build, to bisect or to test it


def build_dir(name: str) -> Path:
    """Where the build for the instruction set ``name`` lives (each its own, so neither rebuilds the other)."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "trnmodels" / "kernels" / f"torch-{torch.__version__}" / name


def _cpu_has(isa: str) -> bool:
    # Every x86 CPU with AVX2 also has FMA3.
    return torch.cpu._is_avx512_bf16_supported() if isa == "avx512_bf16" else torch.cpu._is_avx2_supported()


def isa() -> str | None:
    """The instruction set the kernel is built for here: ``$TRNMODELS_BF16_GEMM_ISA`` if set, else the
    first of ``ISA_FLAGS`` this CPU has; None if it has none. A setting that is not one of them, or that
    this CPU cannot run, raises ``ConfigError``: asked for by name, it is not swapped for another."""
    chosen = os.environ.get(ISA_ENV_VAR, "").strip()
    if not chosen:
        return next((name for name in ISA_FLAGS if _cpu_has(name)), None)
    if chosen not in ISA_FLAGS:
        raise ConfigError(f"{ISA_ENV_VAR}: expected one of {', '.join(ISA_FLAGS)}, got {chosen!r}")
    if not _cpu_has(chosen):
        raise ConfigError(f"{ISA_ENV_VAR}={chosen}: this CPU has no {chosen.upper().replace('_', '-')}")
    return chosen


def why_unavailable() -> str | None:
    """Why the kernel cannot run in this process (None when it can); builds it on the first call. A bad
    ``$TRNMODELS_BF16_GEMM_ISA`` raises ``ConfigError`` (``isa``)."""
    name = isa()
    if name is None:
        return "this CPU has neither AVX512-BF16 nor AVX2"
    return _load(name)


@functools.cache
def _load(name: str) -> str | None:
    global _loaded
    from torch.utils import cpp_extension

    if _loaded and _loaded != name:
        return f"its {_loaded} build is already loaded in this process"
    folder = build_dir(name)
    make_private_dirs(folder)
    logger.info("trnmodels: loading core's BF16 GEMM kernel for %s (built once into %s)", name, folder)
    try:
        # cpp_extension serialises builds with a plain ``lock`` file that a process killed mid-build
        # leaves behind, and every later build then waits for it forever. An OS lock dies with its
        # holder: whoever holds it is the only builder, so a ``lock`` file left there is stale.
        with FileLock(folder / "trnmodels.lock"):
            (folder / "lock").unlink(missing_ok=True)
            cpp_extension.load(
                name=f"trnmodels_bf16_gemm_{name}",
                sources=[str(SOURCE)],
                extra_cflags=["-O3", "-fopenmp", *ISA_FLAGS[name]],
                extra_ldflags=["-fopenmp"],
                build_directory=str(folder),
                is_python_module=False,
            )
    except (RuntimeError, OSError, ImportError) as e:  # no compiler, no ninja, a failed build
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        return f"its C++ kernel could not be built here ({first})"
    torch.library.register_fake("trnmodels_cpu::bf16_gemm")(_gemm_shape)
    _loaded = name
    return None


_loaded: str | None = None  # the build this process holds: both define the same ops


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
