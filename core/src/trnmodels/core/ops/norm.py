"""Normalisation ops: RMSNorm (plain, and the ``(1 + w)`` form Gemma checkpoints store) and LayerNorm."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .dispatch import kernel_op


@kernel_op("rms_norm")
def rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    eps: float,
    weight_offset: float = 0.0,
    scale_in_float32: bool = False,
) -> torch.Tensor:
    """RMSNorm over the last dim, statistics in float32.

    ``weight_offset=1.0`` is the Gemma form (checkpoints store ``w`` and the scale is ``1 + w``), applied in
    float32 before the cast as Gemma does; the plain form casts first and then scales, as Llama does, so
    both round exactly like their references in BF16. ``scale_in_float32`` keeps the plain ``w`` scale but
    applies it in float32 before the cast (Gemma 4's norms). ``weight=None`` is a scale-free norm (Gemma 4
    v_norm).
    """
    dtype = x.dtype
    xf = x.float()
    normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    if weight is None:
        return normed.to(dtype)
    if scale_in_float32 and not weight_offset:
        # Type promotion applies ``w`` in float32. No weight-only subexpression (like ``w.float()``) is
        # written, because AOT compilation would constant-fold it from the tracing model's weights.
        return (normed * weight).to(dtype)
    if weight_offset:
        return (normed * (weight_offset + weight.float())).to(dtype)
    return weight * normed.to(dtype)


@kernel_op("layer_norm")
def layer_norm(
    x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, eps: float
) -> torch.Tensor:
    """LayerNorm over the last dim, computed in float32 (the Wan DiT and UMT5 keep norms in float32)."""
    w = weight.float() if weight is not None else None
    b = bias.float() if bias is not None else None
    return F.layer_norm(x.float(), (x.shape[-1],), w, b, eps).to(x.dtype)
