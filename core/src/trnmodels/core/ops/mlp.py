"""MLP ops: the gated MLP (SiLU or GELU-tanh) and the clamped SwiGLU of gpt-oss."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .dispatch import kernel_op
from .linear import linear


@kernel_op("gelu_tanh")
def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    """GELU with the tanh approximation (``gelu_pytorch_tanh``): Gemma's MLPs, Wan's FFNs and encoders."""
    return F.gelu(x, approximate="tanh")


ACTIVATIONS = {
    "silu": F.silu,
    "gelu_tanh": gelu_tanh,
    "gelu_pytorch_tanh": gelu_tanh,
}


def activation(name: str):
    try:
        return ACTIVATIONS[name]
    except KeyError:
        raise ValueError(f"activation: expected one of {sorted(ACTIVATIONS)}, got {name!r}") from None


@kernel_op("gated_mlp")
def gated_mlp(
    x: torch.Tensor,
    gate_up_weight: torch.Tensor,
    down_weight: torch.Tensor,
    act: str = "silu",
    gate_up_bias: torch.Tensor | None = None,
    down_bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """``down(act(gate(x)) * up(x))`` with gate and up fused as ``[gate; up]`` rows of one weight.

    Under TP the caller passes this rank's slices and reduces the result; the op itself is local.
    """
    gate, up = linear(x, gate_up_weight, gate_up_bias).chunk(2, dim=-1)
    return linear(activation(act)(gate) * up, down_weight, down_bias)


def clamped_swiglu(
    gate: torch.Tensor, up: torch.Tensor, alpha: float = 1.702, limit: float = 7.0
) -> torch.Tensor:
    """gpt-oss's activation: gate clamped above, up clamped both ways, and the ``(up + 1)`` form."""
    gate = gate.clamp(max=limit)
    up = up.clamp(min=-limit, max=limit)
    return (up + 1) * (gate * torch.sigmoid(gate * alpha))
