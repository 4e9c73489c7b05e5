"""Mixture-of-experts ops: routing, and the experts' FFN combined by routing weight.

Static shapes: every local expert runs on every token, and a ``[T, E]`` combine matrix (the routing
weight where an expert was chosen, zero elsewhere) decides what counts. Unchosen experts' work is
multiplied by zero, so only the chosen experts reach the output. Under expert parallelism each rank
passes its own experts and its columns of the combine matrix, and the partial outputs are summed.
"""

from __future__ import annotations

import torch

from .dispatch import kernel_op
from .mlp import activation, clamped_swiglu
from .route_trace import active_trace


def route(
    logits: torch.Tensor, top_k: int, *, softmax_first: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """``logits [T, E]`` → ``(weights [T, k], experts [T, k])``.

    gpt-oss: softmax over the k chosen logits (``softmax_first=False``). Mixtral/Gemma style: softmax over
    all experts, keep the top k, renormalise them (``softmax_first=True``). Inside ``tracing_routes`` the
    picks are recorded, or replayed from a recorded run (validation's teacher-forced routing).
    """
    weights, experts = topk_route(logits, top_k, softmax_first=softmax_first)
    trace = active_trace()
    if trace is None:
        return weights, experts
    return trace.apply(logits, weights, experts, softmax_first)


@kernel_op("moe_route")
def topk_route(
    logits: torch.Tensor, top_k: int, *, softmax_first: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """The routing op itself (see ``route``)."""
    if softmax_first:
        probs = torch.softmax(logits.float(), dim=-1)
        weights, experts = probs.topk(top_k, dim=-1)
        return (weights / weights.sum(-1, keepdim=True)).to(logits.dtype), experts
    values, experts = logits.topk(top_k, dim=-1)
    return torch.softmax(values, dim=-1, dtype=values.dtype), experts


def combine_matrix(
    weights: torch.Tensor, experts: torch.Tensor, num_experts: int, first_expert: int = 0
) -> torch.Tensor:
    """``[T, E_local]``: token t's weight for local expert e (global ``first_expert + e``), else 0."""
    # Another rank's experts map to one spare column (-1 and num_experts both land on it), cut off after.
    column = (experts - first_expert).clamp(-1, num_experts).remainder(num_experts + 1)
    combine = weights.new_zeros(weights.shape[0], num_experts + 1).scatter_add_(1, column, weights)
    return combine[:, :num_experts]


def expert_activation(h: torch.Tensor, act: str, alpha: float, limit: float) -> torch.Tensor:
    """``[..., 2I]`` gate/up projections → ``[..., I]``: gpt-oss's interleaved clamped SwiGLU, or
    ``act(gate) * up`` over ``[gate | up]`` halves."""
    if act == "swiglu_clamped":
        return clamped_swiglu(h[..., ::2], h[..., 1::2], alpha, limit)
    gate, up = h.chunk(2, dim=-1)
    return activation(act)(gate) * up


@kernel_op("moe_experts")
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
    """Σ_e combine[t, e] · FFN_e(x_t) for ``x [T, H]``, ``gate_up [E, H, 2I]``, ``down [E, I, H]``.

    ``act="swiglu_clamped"`` is gpt-oss's layout: gate and up interleaved in the ``2I`` columns, clamped
    SwiGLU. Other activations (``silu``, ``gelu_tanh``) take ``[gate | up]`` halves.

    ``top_k`` is how many experts each token chose, at most (the non-zero entries in a row of
    ``combine``): it lets a kernel run only those with static shapes. The reference ignores it.

    This reference runs every expert on every token (static shapes, for graph capture on any backend);
    the CPU kernel (``trnmodels.core.cpu.moe``) runs each expert on its chosen tokens only.
    """
    # Batched matmuls, not einsum: einsum permutes its operands into a copy before its bmm (5x slower in
    # FP32 here), and a BF16 bmm is fast on CPUs without native BF16 only when the weight's reduced dim is
    # contiguous (``MoEExperts`` stores BF16 weights so: [E, out, in] memory), 20-50x otherwise.
    h = torch.bmm(x.expand(gate_up.shape[0], *x.shape), gate_up)
    if gate_up_bias is not None:
        h = h + gate_up_bias[:, None, :]
    out = torch.bmm(expert_activation(h, act, alpha, limit), down)
    if down_bias is not None:
        out = out + down_bias[:, None, :]
    # Each routing weight multiplies in FP32, and the sum over experts rounds once: rounding the weight and
    # each weighted output to BF16 first made the expert block's error 12% larger than transformers'.
    return (out.float() * combine.t().float()[..., None]).sum(0).to(out.dtype)
