"""Attention on the CPU: decode attention over the blocks a batch has filled, and unmasked batched
attention through torch's fused kernel.

``ops.decode_attention`` gathers and attends over every block of the bucket's block table, with a mask
hiding the positions past each sequence's length: a static shape for a graph. Eagerly, the blocks past
the batch's longest context are masked for every row, so they can be left out: the same softmax terms
(a masked score's weight is exactly 0), for the gather and the two batched matmuls over what the batch
has filled instead of the bucket (at batch 8, 64 of a 256-token bucket's positions on the bench).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..ops.attention import decode_attention as reference_op
from ..ops.dispatch import register_cpu


def decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    **kwargs: object,
) -> torch.Tensor:
    """``ops.decode_attention`` over the first ``ceil(max(context_lens) / block_size)`` blocks."""
    block_size = k_cache.shape[2]
    live = -(-int(context_lens.max()) // block_size)
    return reference_op.reference(
        q, k_cache, v_cache, block_tables[:, : max(live, 1)], context_lens, **kwargs
    )


register_cpu("decode_attention", decode_attention)


def attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, scale: float, **_: object
) -> torch.Tensor:
    """``ops.attention`` without a mask, softcap or sinks, through torch's fused CPU attention
    (``F.scaled_dot_product_attention``: flash attention in blocks, the scores never materialised).
    The reference's two batched matmuls and softmax over a DiT's whole video took 15.5 ms of a step
    here where the fused kernel took 7.9 ms (8 heads, 320 tokens)."""
    hkv, h = k.shape[2], q.shape[2]
    out = F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), scale=scale, enable_gqa=hkv != h
    )
    return out.transpose(1, 2)


def _plain_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    key_padding_mask: torch.Tensor | None = None,
    causal: bool = False,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
    **_: object,
) -> bool:
    return (
        key_padding_mask is None
        and not causal
        and softcap is None
        and sinks is None
        and q.dtype in (torch.float32, torch.bfloat16)
        and q.dtype == k.dtype == v.dtype
        and v.shape[-1] == q.shape[-1]
    )


register_cpu("attention", attention, supports=_plain_attention, in_graphs=True)
