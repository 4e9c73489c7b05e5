"""Token-sparse MoE experts: each expert runs on the tokens that chose it, not on every token.

The reference ``ops.experts_ffn`` runs all ``E`` local experts on all ``T`` tokens and weights the
results, which keeps shapes static for graph capture (Neuron, and the runner's AOT-compiled CPU graphs)
but does ``E / k`` times the work. Here the ``(token, expert)`` pairs with a non-zero combine weight are
grouped by expert, and each expert's two matmuls take only its rows. The rows per expert depend on the
routing, so the dispatch runs this kernel on eager calls only (the vLLM bridge, the eager runner).
"""

from __future__ import annotations

import torch

from ..ops.dispatch import register_cpu
from ..ops.moe import expert_activation
from .linear import matmul


def experts_ffn(
    x: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    combine: torch.Tensor,
    *,
    act: str = "swiglu_clamped",
    gate_up_bias: torch.Tensor | None = None,
    down_bias: torch.Tensor | None = None,
    alpha: float = 1.702,
    limit: float = 7.0,
) -> torch.Tensor:
    """``ops.experts_ffn``'s signature and result, token-sparse."""
    tokens, experts = combine.nonzero(as_tuple=True)
    order = experts.argsort(stable=True)
    tokens, experts = tokens[order], experts[order]
    counts = torch.bincount(experts, minlength=combine.shape[1]).tolist()
    # Summed in FP32 and rounded once, as the reference's sum over experts rounds once.
    total = torch.zeros(x.shape, dtype=torch.float32)
    start = 0
    for expert, count in enumerate(counts):
        if count == 0:
            continue
        rows = tokens[start : start + count]
        start += count
        h = matmul(x.index_select(0, rows), gate_up[expert])
        if gate_up_bias is not None:
            h = h + gate_up_bias[expert]
        out = matmul(expert_activation(h, act, alpha, limit), down[expert])
        if down_bias is not None:
            out = out + down_bias[expert]
        total.index_add_(0, rows, (out * combine[rows, expert, None].to(out.dtype)).float())
    return total.to(x.dtype)


register_cpu("moe_experts", experts_ffn)
