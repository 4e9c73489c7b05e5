"""vLLM's own CPU GEMM behind the plugin's linear layers, when the bridge serves BF16 weights on a CPU.

vLLM's linear layers choose a CPU GEMM once, after loading (``dispatch_cpu_unquantized_gemm``): sgl-kernel's
packed GEMM on a CPU with AMX, else a oneDNN matmul primitive built for the weight, which reorders it once
into oneDNN's layout, else ``F.linear``. Core's ``linear`` op calls ``F.linear``, which hands oneDNN the
weight as stored on every call: on this machine's AVX512-BF16 CPU, 2-3x slower at decode sizes (one to
eight rows; 1.05-1.35x at 128). So after loading, the bridge asks vLLM's dispatch for each BF16 linear
weight's GEMM and registers it with core (``cpu.packed``), where the linear op runs it, in the layers'
own calls and in the fused ops' (``ops.gated_mlp``). Weights only the linear layers read are released,
as vLLM releases its own (the GEMM holds the packed copy); the LM head's, which a tied embedding reads
too, is kept, as vLLM keeps its own.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch import nn

from ..cpu.packed import PackedGemm, pack
from ..ops.dispatch import cpu_kernel_enabled
from ..parallel.layers import LINEAR_LAYERS, ParallelLMHead


def why_not_packed(weight: torch.Tensor) -> str | None:
    """Why vLLM's GEMM does not take ``weight``; None when it does."""
    if not cpu_kernel_enabled("linear"):
        return "the linear CPU kernel is turned off (TRNMODELS_KERNEL_BACKEND / TRNMODELS_CPU_KERNELS)"
    if weight.device.type != "cpu" or weight.dtype != torch.bfloat16 or weight.dim() != 2:
        return f"weights are {weight.dtype} on {weight.device}, not 2-D bfloat16 on the CPU"
    return None


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
    probe = torch.randn(1, weight.shape[1], generator=torch.Generator().manual_seed(0)).to(weight.dtype)
    try:
        # A packed GEMM holds its own copy and ignores the weight argument; F.linear needs it.
        got = run(probe, None, None)
    except (TypeError, RuntimeError):
        return None, "vLLM's dispatch chose F.linear for it"
    expected = F.linear(probe.float(), weight.float())
    # BF16 output rounding (2**-8 relative), with room for FP32 sums in another order.
    error = float((got.float() - expected).abs().max())
    bound = 2**-7 * float(expected.abs().max())
    if got.shape != expected.shape or not error <= bound:
        return None, f"vLLM's GEMM is {error:.3g} from F.linear on a probe row (bound {bound:.3g})"
    return (lambda x: run(x, None, None)), None


def pack_linear_layers(model: nn.Module) -> tuple[int, list[str]]:
    """Register vLLM's GEMM for every linear layer's weight in ``model``; returns how many were packed
    and why the others were not."""
    shared = _shared_parameters(model)
    packed, reasons = 0, []
    for path, module in model.named_modules():
        if not isinstance(module, (*LINEAR_LAYERS, ParallelLMHead)):
            continue
        reason = why_not_packed(module.weight)
        if reason is not None:
            reasons.append(f"{path}: {reason}")
            continue
        weight = module.weight
        gemm, reason = vllm_gemm(weight.detach())
        if gemm is None:
            reasons.append(f"{path}: {reason}")
            continue
        keep = isinstance(module, ParallelLMHead) or id(weight) in shared
        # vLLM traces its GEMMs in its own compiled classes: so may its compile of the bridge.
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
