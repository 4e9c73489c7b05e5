"""A packed CPU GEMM behind the plugin's linear layers, when the bridge serves BF16 weights on a CPU.

vLLM's linear layers choose a CPU GEMM once, after loading (``dispatch_cpu_unquantized_gemm``): sgl-kernel's
packed GEMM on a CPU with AMX, else a oneDNN matmul primitive built for the weight, which reorders it once
into oneDNN's layout, else ``F.linear``. Core's ``linear`` op calls ``F.linear``, which hands oneDNN the
weight as stored on every call: on this machine's AVX512-BF16 CPU, 2-3x slower at decode sizes (one to
eight rows; 1.05-1.35x at 128). So after loading, the bridge packs each BF16 linear weight for a GEMM and
registers it with core (``cpu.packed``), where the linear op runs it, in the layers' own calls and in the
fused ops' (``ops.gated_mlp``): core's BF16 GEMM (``cpu.bf16_gemm``) on a CPU with AVX512-BF16, which
reads a weight 1.2-1.4x faster than vLLM's oneDNN GEMM at 1 to 8 rows and as fast from 32 rows up
(0.94-1.01x, where both are bound by arithmetic), else (or with ``TRNMODELS_BF16_GEMM=vllm``) vLLM's own choice. Weights only the linear layers read are released, as
vLLM releases its own (the GEMM holds the packed copy); the LM head's, which a tied embedding reads too,
is kept, as vLLM keeps its own.
"""

from __future__ import annotations

import os
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch import nn

from ..cpu import bf16_gemm
from ..cpu.packed import PackedGemm, pack
from ..errors import ConfigError
from ..ops.dispatch import cpu_kernel_enabled
from ..parallel.layers import LINEAR_LAYERS, ParallelLMHead

GEMM_ENV_VAR = "TRNMODELS_BF16_GEMM"
GEMMS = ("core", "vllm")


def why_not_packed(weight: torch.Tensor) -> str | None:
    """Why no packed GEMM takes ``weight``; None when one does."""
    if not cpu_kernel_enabled("linear"):
        return "the linear CPU kernel is turned off (TRNMODELS_KERNEL_BACKEND / TRNMODELS_CPU_KERNELS)"
    if weight.device.type != "cpu" or weight.dtype != torch.bfloat16 or weight.dim() != 2:
        return f"weights are {weight.dtype} on {weight.device}, not 2-D bfloat16 on the CPU"
    return None


def chosen_gemm() -> str:
    """Which GEMM the bridge packs BF16 linear weights for: ``core`` where core's kernel runs (unless
    ``TRNMODELS_BF16_GEMM=vllm``), else ``vllm``."""
    return "core" if why_not_core_gemm() is None else "vllm"


def why_not_core_gemm() -> str | None:
    """Why the bridge does not pack for core's BF16 GEMM; None when it does."""
    if gemm_setting() != "core":
        return f"{GEMM_ENV_VAR}={gemm_setting()}"
    return bf16_gemm.why_unavailable()


def gemm_setting() -> str:
    """``TRNMODELS_BF16_GEMM`` (default ``core``), refused unless one of ``GEMMS``."""
    choice = os.environ.get(GEMM_ENV_VAR, "core")
    if choice not in GEMMS:
        raise ConfigError(f"{GEMM_ENV_VAR}: expected one of {', '.join(GEMMS)}, got {choice!r}")
    return choice


def core_gemm(weight: torch.Tensor) -> tuple[PackedGemm | None, str | None]:
    """Core's BF16 GEMM for ``weight`` (``x -> x @ weight.T``), holding its own packed copy, or None and why
    not (it disagrees with ``F.linear`` on a probe row)."""
    packed, n = bf16_gemm.pack(weight), weight.shape[0]
    return _checked(lambda x: bf16_gemm.gemm(x, packed, n), weight, "core's BF16 GEMM", "failed on it")


def vllm_gemm(weight: torch.Tensor) -> tuple[PackedGemm | None, str | None]:
    """vLLM's CPU GEMM for ``weight`` as its own linear layers choose it (``x -> x @ weight.T``), or
    None and why not: vLLM falls back to ``F.linear``, or its GEMM disagrees with ``F.linear`` on a
    probe row (checked once per weight, at load)."""
    from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

    # vLLM's dispatch reads ``weight`` and ``bias`` from the layer and sets ``cpu_linear`` on it. It gets
    # a stand-in: the bias is added by the caller, so vLLM's dispatch never converts ours in place.
    layer = SimpleNamespace(weight=weight, bias=None)
    dispatch_cpu_unquantized_gemm(layer, remove_weight=False)
    run = layer.cpu_linear
    # A packed GEMM holds its own copy and ignores the weight argument; F.linear needs it.
    return _checked(lambda x: run(x, None, None), weight, "vLLM's GEMM", "fell back to F.linear for it")


def _checked(
    gemm: PackedGemm, weight: torch.Tensor, name: str, failed: str
) -> tuple[PackedGemm | None, str | None]:
    """``gemm`` if it agrees with ``F.linear`` on a probe row (checked once per weight, at load)."""
    probe = torch.randn(1, weight.shape[1], generator=torch.Generator().manual_seed(0)).to(weight.dtype)
    try:
        got = gemm(probe)
    except (TypeError, RuntimeError):
        return None, f"{name} {failed}"
    expected = F.linear(probe.float(), weight.float())
    # BF16 output rounding (2**-8 relative), with room for FP32 sums in another order.
    error = float((got.float() - expected).abs().max())
    bound = 2**-7 * float(expected.abs().max())
    if got.shape != expected.shape or not error <= bound:
        return None, f"{name} is {error:.3g} from F.linear on a probe row (bound {bound:.3g})"
    return gemm, None


def pack_linear_layers(model: nn.Module) -> tuple[int, list[str]]:
    """Register a packed GEMM (``chosen_gemm``) for every linear layer's weight in ``model``; returns how
    many were packed and why the others were not."""
    gemm_setting()  # a bad setting is refused even where no weight is BF16
    shared = _shared_parameters(model)
    gemm_for = None  # chosen at the first weight that can be packed (core's may have to be built first)
    packed, reasons = 0, []
    for path, module in model.named_modules():
        if not isinstance(module, (*LINEAR_LAYERS, ParallelLMHead)):
            continue
        reason = why_not_packed(module.weight)
        if reason is not None:
            reasons.append(f"{path}: {reason}")
            continue
        weight = module.weight
        gemm_for = gemm_for or (core_gemm if chosen_gemm() == "core" else vllm_gemm)
        gemm, reason = gemm_for(weight.detach())
        if gemm is None:
            reasons.append(f"{path}: {reason}")
            continue
        keep = isinstance(module, ParallelLMHead) or id(weight) in shared
        # vLLM traces its GEMMs in its own compiled classes, and core's is a torch op: so may vLLM's compile
        # of the bridge.
        pack(weight, gemm, release=not keep, traceable=True)
        packed += 1
    return packed, reasons


def _shared_parameters(model: nn.Module) -> set[int]:
    """The parameters held under more than one name (a tied LM head and embedding)."""
    seen: set[int] = set()
    shared: set[int] = set()
    for _, p in model.named_parameters(remove_duplicate=False):
        (shared if id(p) in seen else seen).add(id(p))
    return shared
