"""The tensor-parallel gated MLP: gate and up fused and column-split, down row-split, one all-reduce."""

from __future__ import annotations

import torch
from torch import nn

from .. import ops
from ..ops.mlp import activation
from ..parallel.layers import MergedColumnParallelLinear, RowParallelLinear


class GatedMLP(nn.Module):
    def __init__(
        self,
        hidden_size: int,
        intermediate_size: int,
        act: str = "silu",
        bias: bool = False,
        *,
        dtype: torch.dtype = torch.float32,
    ):
        super().__init__()
        activation(act)  # fail at build, not at the first forward
        self.act = act
        self.gate_up_proj = MergedColumnParallelLinear(
            hidden_size, [intermediate_size, intermediate_size], bias, dtype=dtype
        )
        self.down_proj = RowParallelLinear(intermediate_size, hidden_size, bias, dtype=dtype)

    def forward(self, x: torch.Tensor, rank: torch.Tensor | None = None) -> torch.Tensor:
        """``rank`` is unused: a dense MLP is the same on every rank (a routed one picks experts by it)."""
        local = ops.gated_mlp(
            x, self.gate_up_proj.weight, self.down_proj.weight, self.act, self.gate_up_proj.bias
        )
        out = self.down_proj.tp.all_reduce(local)
        return out + self.down_proj.bias if self.down_proj.bias is not None else out

    def checkpoint_keys(self, prefix: str) -> dict[str, str | list[str]]:
        """The HF layout: separate ``gate_proj``, ``up_proj`` and ``down_proj`` under ``prefix``."""
        bias = self.down_proj.bias is not None
        keys: dict[str, str | list[str]] = {
            "gate_up_proj.weight": [f"{prefix}gate_proj.weight", f"{prefix}up_proj.weight"],
            "down_proj.weight": f"{prefix}down_proj.weight",
        }
        if bias:
            keys["gate_up_proj.bias"] = [f"{prefix}gate_proj.bias", f"{prefix}up_proj.bias"]
            keys["down_proj.bias"] = f"{prefix}down_proj.bias"
        return keys
