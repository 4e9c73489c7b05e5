"""Token-sparse MoE experts: each expert runs on the tokens that chose it, not on every token.

The reference ``ops.experts_ffn`` runs all ``E`` local experts on all ``T`` tokens and weights the
results, which keeps shapes static for graph capture (Neuron, and the runner's AOT-compiled CPU graphs)
but does ``E / k`` times the work. Here the ``(token, expert)`` pairs with a non-zero combine weight are
sorted by expert, so each expert's rows are one slice, and each projection is one grouped matmul over
all experts; the activation, the routing weights and the sum over experts run once over all pairs. The
rows per expert depend on the routing, so graph capture keeps the reference; eager calls (the eager runner, the vLLM
bridge) run this kernel, and so does vLLM's compile of the bridge, through the custom op
``trnmodels::moe_experts`` that runs it when the graph runs (see ``ops.dispatch``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..ops.dispatch import register_cpu
from ..ops.moe import expert_activation
from .linear import matmul, upcast_pays


def _grouped_mm_takes(*tensors: torch.Tensor) -> bool:
    """``torch._grouped_mm`` on CPU needs every non-unit stride to be a multiple of 16 bytes."""
    return all(s == 1 or s * t.element_size() % 16 == 0 for t in tensors for s in t.stride())


@dataclass(frozen=True)
class ExpertGroups:
    """(token, expert) pairs sorted by expert: pair ``p`` belongs to ``experts[p]``; expert ``e`` owns
    ``counts[e]`` consecutive pairs, which end at ``offsets[e]``."""

    experts: torch.Tensor
    counts: list[int]
    offsets: torch.Tensor  # int32, as torch._grouped_mm takes them

    @classmethod
    def from_experts(cls, experts: torch.Tensor, num_experts: int) -> ExpertGroups:
        counts = torch.bincount(experts, minlength=num_experts)
        return cls(experts, counts.tolist(), counts.cumsum(0, dtype=torch.int32))


def grouped_matmul(
    rows: torch.Tensor, weights: torch.Tensor, groups: ExpertGroups, bias: torch.Tensor | None
) -> torch.Tensor:
    """``rows [P, K]`` → ``rows[p] @ weights[e] (+ bias[e])`` for each pair ``p`` of expert ``e``, ``[P, N]``."""
    largest = rows[: max(groups.counts, default=0)]
    if upcast_pays(largest, weights[0]) or not _grouped_mm_takes(rows, weights):
        # A prefill's groups are large enough that converting to FP32 first pays (``cpu.linear``).
        parts = rows.split(groups.counts)
        out = torch.cat([matmul(part, w) for part, w in zip(parts, weights, strict=True)])
    else:
        out = torch._grouped_mm(rows, weights, offs=groups.offsets)
    return out if bias is None else out + bias[groups.experts]


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
    # nonzero lists indices in row-major order, so the pairs of ``combine.T`` come sorted by expert.
    experts, tokens = combine.t().nonzero(as_tuple=True)
    groups = ExpertGroups.from_experts(experts, combine.shape[1])
    h = grouped_matmul(x.index_select(0, tokens), gate_up, groups, gate_up_bias)
    out = grouped_matmul(expert_activation(h, act, alpha, limit), down, groups, down_bias)
    # Summed in FP32 and rounded once, as the reference's sum over experts rounds once.
    total = torch.zeros(x.shape, dtype=torch.float32)
    total.index_add_(0, tokens, (out * combine[tokens, experts, None].to(out.dtype)).float())
    return total.to(x.dtype)


def _fake(x: torch.Tensor, *args: object, **kwargs: object) -> torch.Tensor:
    return torch.empty_like(x)


register_cpu("moe_experts", experts_ffn, fake=_fake)
