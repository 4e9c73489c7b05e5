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

from ..ops import moe as moe_ops
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


def gathers_experts(tokens: int, top_k: int, num_experts: int) -> bool:
    """Whether a captured graph of ``tokens`` rows runs ``gathered_experts_ffn``: while the (token, expert)
    pairs are no more than the local experts, gathering reads fewer weights (one expert's per pair) than
    the reference's batched matmuls (every expert once)."""
    return tokens * top_k <= num_experts


def gathered_experts_ffn(
    x: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    combine: torch.Tensor,
    *,
    top_k: int,
    act: str = "swiglu_clamped",
    gate_up_bias: torch.Tensor | None = None,
    down_bias: torch.Tensor | None = None,
    alpha: float = 1.702,
    limit: float = 7.0,
) -> torch.Tensor:
    """``ops.experts_ffn`` over the ``T * top_k`` (token, expert) pairs, static shapes, for graph capture.

    Each token's ``top_k`` largest combine weights pick its experts (under expert parallelism a token
    with fewer local picks takes zero-weight ones, which add nothing). Each projection is written as a
    product and a sum over the indexed weights, which Inductor fuses into one loop that reads each pair's
    expert weights in place: a batch-1 decode step of gpt-oss reads 2 of 8 experts where the reference's
    batched matmuls read all 8. Products are summed in FP32 and rounded to the input's dtype once per
    projection, as a matmul does.
    """
    tokens, dtype = x.shape[0], x.dtype
    weights, experts = combine.topk(top_k, dim=1)
    pairs = experts.reshape(-1)
    rows = x.repeat_interleave(top_k, dim=0)  # pair p is token p // top_k
    h = (rows.float()[:, :, None] * gate_up[pairs].float()).sum(1).to(dtype)
    if gate_up_bias is not None:
        h = h + gate_up_bias[pairs]
    a = expert_activation(h, act, alpha, limit)
    out = (a.float()[:, :, None] * down[pairs].float()).sum(1).to(dtype)
    if down_bias is not None:
        out = out + down_bias[pairs]
    weighted = out.float().view(tokens, top_k, -1) * weights.float()[..., None]
    return weighted.sum(1).to(dtype)


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
    top_k: int | None = None,
) -> torch.Tensor:
    """``ops.experts_ffn``'s signature and result, token-sparse."""
    if torch.compiler.is_compiling():
        # Graph capture: static shapes only.
        kwargs = dict(act=act, gate_up_bias=gate_up_bias, down_bias=down_bias, alpha=alpha, limit=limit)
        if top_k is not None and gathers_experts(x.shape[0], top_k, combine.shape[1]):
            return gathered_experts_ffn(x, gate_up, down, combine, top_k=top_k, **kwargs)
        return moe_ops.experts_ffn.reference(x, gate_up, down, combine, **kwargs)
    # nonzero lists indices in row-major order, so the pairs of ``combine.T`` come sorted by expert.
    experts, tokens = combine.t().nonzero(as_tuple=True)
    groups = ExpertGroups.from_experts(experts, combine.shape[1])
    h = grouped_matmul(x.index_select(0, tokens), gate_up, groups, gate_up_bias)
    out = grouped_matmul(expert_activation(h, act, alpha, limit), down, groups, down_bias)
    # Weighted and summed in FP32, rounded once, as the reference does.
    total = torch.zeros(x.shape, dtype=torch.float32)
    total.index_add_(0, tokens, out.float() * combine[tokens, experts, None].float())
    return total.to(x.dtype)


def _fake(x: torch.Tensor, *args: object, **kwargs: object) -> torch.Tensor:
    return torch.empty_like(x)


register_cpu("moe_experts", experts_ffn, fake=_fake, in_graphs=True)
