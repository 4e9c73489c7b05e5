"""Decode attention over the blocks a batch has filled, not the whole context bucket.

``ops.decode_attention`` gathers and attends over every block of the bucket's block table, with a mask
hiding the positions past each sequence's length: a static shape for a graph. Eagerly, the blocks past
the batch's longest context are masked for every row, so they can be left out: the same softmax terms
(a masked score's weight is exactly 0), for the gather and the two batched matmuls over what the batch
has filled instead of the bucket (at batch 8, 64 of a 256-token bucket's positions on the bench).
"""

from __future__ import annotations

import torch

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
