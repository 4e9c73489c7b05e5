"""Token-sparse MoE experts: each expert runs on the tokens that chose it, not on every token.

The reference ``ops.experts_ffn`` runs all ``E`` local experts on all ``T`` tokens and weights the
results, which keeps shapes static for graph capture (Neuron, and the runner's AOT-compiled CPU graphs)
but does ``E / k`` times the work. Here the ``(token, expert)`` pairs with a non-zero combine weight are
sorted by expert, so each expert's rows are one slice, and each projection is one grouped matmul over
all experts; the activation, the routing weights and the sum over experts run once over all pairs. The
rows per expert depend on the routing, so the dispatch runs this kernel on eager calls only (the vLLM
bridge, the eager runner).
"""

from __future__ import annotations

import torch

from ..ops.dispatch import register_cpu
from ..ops.moe import expert_activation
from .linear import matmul, upcast_pays


def _grouped_mm_takes(*tensors: torch.Tensor) -> bool:
    """``torch._grouped_mm`` on CPU needs every non-unit stride to be a multiple of 16 bytes."""
    return all(s == 1 or s * t.element_size() % 16 == 0 for t in tensors for s in t.stride())


def grouped_matmul(
    rows: torch.Tensor,
    weights: torch.Tensor,
    counts: list[int],
    bias: torch.Tensor | None,
    experts: torch.Tensor,
) -> torch.Tensor:
    """``rows [P, K]``, sorted by expert with ``counts[e]`` rows for expert ``e`` → ``rows @ weights[e]``
    (+ ``bias[e]``) for each row, ``[P, N]``."""
    largest = rows[: max(counts, default=0)]
    if upcast_pays(largest, weights[0]) or not _grouped_mm_takes(rows, weights):
        # A prefill's groups are large enough that converting to FP32 first pays (``cpu.linear``).
        out = torch.cat([matmul(part, w) for part, w in zip(rows.split(counts), weights, strict=True)])
    else:
        offsets = torch.tensor(counts).cumsum(0).to(torch.int32)
        out = torch._grouped_mm(rows, weights, offs=offsets)
    return out if bias is None else out + bias[experts]


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
    h = grouped_matmul(x.index_select(0, tokens), gate_up, counts, gate_up_bias, experts)
    out = grouped_matmul(expert_activation(h, act, alpha, limit), down, counts, down_bias, experts)
    # Summed in FP32 and rounded once, as the reference's sum over experts rounds once.
    total = torch.zeros(x.shape, dtype=torch.float32)
    total.index_add_(0, tokens, (out * combine[tokens, experts, None].to(out.dtype)).float())
    return total.to(x.dtype)


register_cpu("moe_experts", experts_ffn)
