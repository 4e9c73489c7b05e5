"""The rotary embedding module: frequencies computed once at build, cos/sin per step in the graph."""

from __future__ import annotations

import torch
from torch import nn

from ..ops.rope import RopeConfig, cos_sin, inv_freq


class RotaryEmbedding(nn.Module):
    def __init__(self, config: RopeConfig):
        super().__init__()
        freqs, self.scaling = inv_freq(config)
        self.register_buffer("inv_freq", freqs, persistent=False)

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        return cos_sin(self.inv_freq, positions, self.scaling, dtype)
