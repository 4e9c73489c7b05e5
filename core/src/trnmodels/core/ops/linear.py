"""The linear op: ``x @ weight.T + bias``, the matmul every projection of a model runs through."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .dispatch import kernel_op


@kernel_op("linear")
def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear``: an op of its own so a backend can run it its own way (see ``cpu.linear``)."""
    return F.linear(x, weight, bias)
