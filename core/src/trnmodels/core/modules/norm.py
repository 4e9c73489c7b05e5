"""Norm modules over the functional ops; the checkpoint stores their ``weight`` (and ``bias``)."""

from __future__ import annotations

import torch
from torch import nn

from .. import ops


class RMSNorm(nn.Module):
    """RMSNorm; ``weight_offset=1.0`` for checkpoints that store ``w`` of a ``(1 + w)`` scale (Gemma);
    ``with_scale=False`` for a scale-free norm; ``scale_in_float32=True`` applies a plain ``w`` in float32
    before the cast (Gemma 4)."""

    def __init__(
        self,
        dim: int,
        eps: float = 1e-6,
        *,
        weight_offset: float = 0.0,
        with_scale: bool = True,
        scale_in_float32: bool = False,
        dtype: torch.dtype = torch.float32,
    ):
        super().__init__()
        self.eps = eps
        self.weight_offset = weight_offset
        self.scale_in_float32 = scale_in_float32
        self.weight = nn.Parameter(torch.empty(dim, dtype=dtype), requires_grad=False) if with_scale else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ops.rms_norm(x, self.weight, self.eps, self.weight_offset, self.scale_in_float32)


class LayerNorm(nn.Module):
    def __init__(
        self,
        dim: int,
        eps: float = 1e-5,
        *,
        affine: bool = True,
        bias: bool = True,
        dtype: torch.dtype = torch.float32,
    ):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.empty(dim, dtype=dtype), requires_grad=False) if affine else None
        self.bias = (
            nn.Parameter(torch.empty(dim, dtype=dtype), requires_grad=False) if affine and bias else None
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ops.layer_norm(x, self.weight, self.bias, self.eps)
