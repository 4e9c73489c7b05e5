"""vLLM's fused CPU MoE kernel behind the plugin's MoE experts, when the bridge serves them on a CPU.

vLLM's own MoE layers on a CPU run ``cpu_fused_moe``, a C++ kernel of vLLM's ``_C`` library: it reads
each chosen expert's weights once for all the tokens routed to it, with the activation fused. Core's
token-sparse kernel (``trnmodels.core.cpu.moe``) is built from torch ops, whose BF16 matmul on a CPU
without BF16 arithmetic passes over the weight once per row, and pays a per-op cost a fused kernel does
not. So after loading, the bridge swaps each ``MoEExperts`` module that vLLM's kernel computes as
``ops.experts_ffn`` defines it for a ``VllmFusedExperts`` holding the same weights in the kernel's
packed layout. Any other experts module keeps core's kernel.
"""

from __future__ import annotations

import platform

import torch
from torch import nn
from vllm import _custom_ops as vllm_ops

from ..modules.moe import MoEExperts
from ..ops.dispatch import cpu_kernel_enabled

# Our activation name -> vLLM's ``MoEActivation`` value. gpt-oss's clamped SwiGLU is vLLM's
# ``swigluoai`` (gate and up interleaved, as we store them) with its constants, which vLLM's kernel fixes;
# the others take ``[gate | up]`` halves on both sides.
ACTIVATIONS = {
    "swiglu_clamped": "swigluoai",
    "silu": "silu",
    "gelu_tanh": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
}
SWIGLUOAI_CONSTANTS = (1.702, 7.0)  # (alpha, limit)
ALIGNMENT = 32  # both kernels' output block (and the AMX one's reduction block): sizes must be multiples


def kernel_isa() -> str:
    """The kernel vLLM's own unquantized experts pick on this CPU: ``"amx"`` (AMX tiles) on an x86 CPU
    that has them, else ``"vec"``, the portable vector kernel. On a 2-vCPU Xeon with AMX, serving the gpt-oss
    bench config in BF16, the vector kernel left the plugin at 0.84× vLLM's own output throughput (time to
    first token 3.2× theirs) where both ran the same kernel on an AMD EPYC (1.04×)."""
    x86 = platform.machine().lower() in ("x86_64", "amd64")
    return "amx" if x86 and torch.cpu._is_amx_tile_supported() else "vec"


def why_not_fused(experts: MoEExperts) -> str | None:
    """Why vLLM's kernel cannot run ``experts`` exactly as core's op does; None when it can."""
    if not hasattr(torch.ops._C, "cpu_fused_moe"):
        return "this vLLM build has no cpu_fused_moe kernel"
    if not cpu_kernel_enabled("moe_experts"):
        return "the moe_experts CPU kernel is turned off (TRNMODELS_KERNEL_BACKEND / TRNMODELS_CPU_KERNELS)"
    if experts.gate_up.device.type != "cpu" or experts.gate_up.dtype != torch.bfloat16:
        return f"weights are {experts.gate_up.dtype} on {experts.gate_up.device}, not bfloat16 on the CPU"
    if experts.act not in ACTIVATIONS:
        return f"activation {experts.act!r} has no vLLM counterpart"
    if experts.act == "swiglu_clamped" and (experts.alpha, experts.limit) != SWIGLUOAI_CONSTANTS:
        return (
            f"clamped SwiGLU with (alpha, limit) = {(experts.alpha, experts.limit)}, not vLLM's fixed values"
        )
    if experts.num_local != experts.num_experts:
        return "expert parallelism"
    hidden, intermediate = experts.down.shape[2], experts.down.shape[1]
    if hidden % ALIGNMENT or intermediate % ALIGNMENT:
        return f"hidden {hidden} and intermediate {intermediate} per rank are not multiples of {ALIGNMENT}"
    return None


class VllmFusedExperts(nn.Module):
    """``MoEExperts``' forward on vLLM's fused kernel, with its weights packed for it."""

    def __init__(self, experts: MoEExperts, isa: str | None = None):
        super().__init__()
        self.world = experts.world
        self.act = ACTIVATIONS[experts.act]
        self.isa = kernel_isa() if isa is None else isa
        # BF16 experts are stored [E, out, in] in memory (``MoEExperts``), the kernel's input layout.
        self.register_buffer("w13", vllm_ops.cpu_prepack_moe_weight(_out_in(experts.gate_up), self.isa))
        self.register_buffer("w2", vllm_ops.cpu_prepack_moe_weight(_out_in(experts.down), self.isa))
        # Buffers, not parameters: vLLM checks that every parameter left after loading came from the
        # checkpoint, under its name then. Each TP rank holds the whole down bias; only rank 0 adds it,
        # so the all-reduce counts it once.
        self.register_buffer("w13_bias", _data(experts.gate_up_bias))
        self.register_buffer("w2_bias", _data(experts.down_bias) if experts.tp.rank == 0 else None)

    def forward(
        self, x: torch.Tensor, weights: torch.Tensor, experts: torch.Tensor, rank: torch.Tensor
    ) -> torch.Tensor:
        del rank  # every expert is local (no EP), and the bias rank is fixed at the swap
        out = torch.empty_like(x)
        topk_ids = experts.to(torch.int32)
        vllm_ops.cpu_fused_moe(
            out, x.contiguous(), self.w13, self.w2, self.w13_bias, self.w2_bias,
            weights.float(), topk_ids, self.act, self.isa,
        )  # fmt: skip
        return self.world.all_reduce(out)


def _data(param: nn.Parameter | None) -> torch.Tensor | None:
    return None if param is None else param.data


def _out_in(weight: torch.Tensor) -> torch.Tensor:
    """``[E, in, out]`` stored ``[E, out, in]`` → the contiguous ``[E, out, in]`` tensor, no copy."""
    return weight.transpose(1, 2).contiguous()


def swap_fused_experts(model: nn.Module) -> tuple[int, list[str]]:
    """Swap every ``MoEExperts`` in ``model`` that vLLM's kernel can run; returns how many were swapped
    and why the others were not."""
    swapped, reasons = 0, []
    for path, module in list(model.named_modules()):
        if not isinstance(module, MoEExperts):
            continue
        reason = why_not_fused(module)
        if reason is not None:
            reasons.append(f"{path}: {reason}")
            continue
        model.set_submodule(path, VllmFusedExperts(module))
        swapped += 1
    return swapped, reasons
