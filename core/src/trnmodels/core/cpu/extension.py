"""Core's C++ CPU kernels (``csrc/``): one library, ``trnmodels_cpu``, built for the instruction set of
this CPU and loaded once per process. Its ops are ``torch.ops.trnmodels_cpu.*``: the BF16 and FP32 GEMMs on
packed weights (``bf16_gemm``, ``fp32_gemm``) and paged decode attention (``attention``), which compiled
graphs call as they call any op of a loaded library.

The library is compiled with the host's C++ compiler the first time a process needs it (about 20 s here,
with ``torch.utils.cpp_extension``, which needs ``ninja``), and cached under ``~/.cache/trnmodels/kernels``
(``$XDG_CACHE_HOME``), one build per torch version and instruction set; ``why_unavailable`` says why it
cannot run. ``TRNMODELS_BF16_GEMM_ISA=avx2`` (the name it had when the GEMM was the only kernel) runs the
AVX2 build on a CPU with AVX512-BF16 (to bisect a difference, and so that its tests run there); any other
value, or one this CPU cannot run, is refused.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable
from pathlib import Path

import torch
from filelock import FileLock

from ..errors import ConfigError
from ..ops.dispatch import environ_reader

logger = logging.getLogger(__name__)

SOURCES = tuple(
    Path(__file__).with_name("csrc") / name
    for name in ("bf16_gemm.cpp", "fp32_gemm.cpp", "decode_attention.cpp")
)
# One build per instruction set, each its own library; the first this CPU has is used.
ISA_FLAGS = {
    "avx512_bf16": ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512bf16"],
    "avx2": ["-mavx2", "-mfma"],
}
ISA_ENV_VAR = "TRNMODELS_BF16_GEMM_ISA"  # one of ISA_FLAGS: that build, to bisect or to test it
_read_isa_setting = environ_reader(ISA_ENV_VAR)

# The shapes of the library's ops for tracing, registered once the library is loaded: (op, fake).
_FAKES: list[tuple[str, Callable[..., torch.Tensor]]] = []


def register_fake(op: str, fake: Callable[..., torch.Tensor]) -> None:
    """Give ``trnmodels_cpu::<op>`` its shape function for tracing, when the library loads (now, if it is
    loaded)."""
    _FAKES.append((op, fake))
    if _loaded:
        torch.library.register_fake(f"trnmodels_cpu::{op}")(fake)


def build_dir(name: str) -> Path:
    """Where the build for the instruction set ``name`` lives (each its own, so neither rebuilds the other)."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "trnmodels" / "kernels" / f"torch-{torch.__version__}" / name


def _cpu_has(isa: str) -> bool:
    # Every x86 CPU with AVX2 also has FMA3.
    return torch.cpu._is_avx512_bf16_supported() if isa == "avx512_bf16" else torch.cpu._is_avx2_supported()


def isa() -> str | None:
    """The instruction set the library is built for here: ``$TRNMODELS_BF16_GEMM_ISA`` if set, else the
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
    """Why the library cannot run in this process (None when it can); builds it on the first call. A bad
    ``$TRNMODELS_BF16_GEMM_ISA`` raises ``ConfigError`` (``isa``).

    Asked on every eager decode-attention call, so the answer is kept and worked out again only when
    ``$TRNMODELS_BF16_GEMM_ISA`` changes: reading it and the CPU's flags each time cost 2-4 us a call."""
    global _answer
    setting = _read_isa_setting()
    if _answer is None or _answer[0] != setting:
        name = isa()  # raises on a bad setting, and nothing is kept
        _answer = (setting, "this CPU has neither AVX512-BF16 nor AVX2" if name is None else _load(name))
    return _answer[1]


@functools.cache
def _load(name: str) -> str | None:
    global _loaded
    from torch.utils import cpp_extension

    from ..compile.cache import make_private_dirs  # the ops import this module, and compile imports ops

    if _loaded and _loaded != name:
        return f"its {_loaded} build is already loaded in this process"
    folder = build_dir(name)
    make_private_dirs(folder)
    logger.info("trnmodels: loading core's CPU kernels for %s (built once into %s)", name, folder)
    try:
        # cpp_extension serialises builds with a plain ``lock`` file that a process killed mid-build
        # leaves behind, and every later build then waits for it forever. An OS lock dies with its
        # holder: whoever holds it is the only builder, so a ``lock`` file left there is stale.
        with FileLock(folder / "trnmodels.lock"):
            (folder / "lock").unlink(missing_ok=True)
            cpp_extension.load(
                name=f"trnmodels_cpu_{name}",
                sources=[str(source) for source in SOURCES],
                extra_cflags=["-O3", "-fopenmp", *ISA_FLAGS[name]],
                extra_ldflags=["-fopenmp"],
                build_directory=str(folder),
                is_python_module=False,
            )
    except (RuntimeError, OSError, ImportError) as e:  # no compiler, no ninja, a failed build
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        return f"its C++ kernels could not be built here ({first})"
    for op, fake in _FAKES:
        torch.library.register_fake(f"trnmodels_cpu::{op}")(fake)
    _loaded = name
    return None


_loaded: str | None = None  # the build this process holds: both define the same ops
# ($TRNMODELS_BF16_GEMM_ISA, ``why_unavailable``'s answer for it).
_answer: tuple[bytes | str | None, str | None] | None = None
