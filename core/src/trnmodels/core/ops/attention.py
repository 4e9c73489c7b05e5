"""Attention ops, written once for every model in the set.

One core, ``scaled_dot_product``, covers GQA/MQA (grouped without copying K/V), a query scale override,
logit softcapping, learned attention sinks and any boolean mask. Three entry points build the mask:

- ``prefill_attention``: causal self-attention over a flat batch of ragged prompts, optionally within a
  sliding window (tokens see only their own sequence);
- ``decode_attention``: one query per sequence against its paged KV cache;
- ``attention``: batched non-causal or cross attention (DiT blocks, encoders) with a key padding mask.

All shapes are static and masks replace data-dependent slicing, so each traces into one graph.
"""

from __future__ import annotations

import torch

from .dispatch import kernel_op


@kernel_op("attention_matmul")
def attention_matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b``, batched, in the operands' dtype: attention's scores and its weighted sum of values."""
    return torch.matmul(a, b)


def scaled_dot_product(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    *,
    scale: float,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention on ``q [B, H, Tq, D]``, ``k [B, Hkv, Tk, D]``, ``v [B, Hkv, Tk, Dv]``; H a multiple of Hkv.

    ``mask`` is boolean, broadcastable to ``[B, H, Tq, Tk]`` (True = may attend). ``sinks`` ``[H]`` adds one
    learned logit per head to the softmax's denominator only. Softmax runs in float32.
    """
    b, h, tq, d = q.shape
    hkv = k.shape[1]
    # A group's query heads become extra query rows of their shared K/V head: a plain batched matmul.
    # Broadcasting K/V over a group dimension instead would have matmul copy them once per head.
    qg = q.reshape(b, hkv, h // hkv * tq, d)
    scores = attention_matmul(qg, k.transpose(-1, -2)).float().reshape(b, hkv, h // hkv, tq, -1) * scale
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    if mask is not None:
        mask = mask.expand(b, h, tq, mask.shape[-1]).reshape(b, hkv, h // hkv, tq, mask.shape[-1])
        scores = scores.masked_fill(~mask, float("-inf"))
    if sinks is not None:
        sink = sinks.float().reshape(1, hkv, h // hkv, 1, 1).expand(b, hkv, h // hkv, tq, 1)
        probs = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1]
    else:
        probs = torch.softmax(scores, dim=-1)
    out = attention_matmul(probs.to(v.dtype).reshape(b, hkv, h // hkv * tq, -1), v)
    return out.reshape(b, h, tq, v.shape[-1])


@kernel_op("prefill_attention")
def prefill_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    seq_ids: torch.Tensor,
    *,
    scale: float,
    sliding_window: int | None = None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal attention over flat tokens ``q [T, H, D]``, ``k/v [T, Hkv, D]`` of several prompts.

    A sequence's tokens are contiguous and in order, so token i sees token j iff both belong to the same
    sequence (``seq_ids``, -1 marks padding), j ≤ i, and, with a window W, ``i - j < W``. Every token
    sees itself, so padding rows stay finite.
    """
    same_seq = (seq_ids[:, None] == seq_ids[None, :]) & (seq_ids[:, None] >= 0)
    index = torch.arange(q.shape[0], device=q.device)
    delta = index[:, None] - index[None, :]
    visible = same_seq & (delta >= 0)
    if sliding_window is not None:
        visible = visible & (delta < sliding_window)
    visible = visible | torch.eye(q.shape[0], dtype=torch.bool, device=q.device)
    out = scaled_dot_product(
        q.transpose(0, 1)[None],
        k.transpose(0, 1)[None],
        v.transpose(0, 1)[None],
        visible[None, None],
        scale=scale,
        softcap=softcap,
        sinks=sinks,
    )
    return out[0].transpose(0, 1)


def gather_paged(cache: torch.Tensor, block_tables: torch.Tensor) -> torch.Tensor:
    """``cache [num_blocks, Hkv, block_size, D]`` → ``[B, Hkv, max_blocks * block_size, D]`` per sequence."""
    b, max_blocks = block_tables.shape
    _, hkv, block_size, d = cache.shape
    # index_select, not advanced indexing: the same copy, at half the host cost of an eager call.
    blocks = cache.index_select(0, block_tables.reshape(-1)).view(b, max_blocks, hkv, block_size, d)
    return blocks.transpose(1, 2).reshape(b, hkv, max_blocks * block_size, d)


def decode_visible(
    context_lens: torch.Tensor, length: int, sliding_window: int | None = None
) -> torch.Tensor:
    """``[B, length]`` bool: cache position p is visible to sequence b iff ``p < context_lens[b]`` and, with
    a window W, ``context_lens[b] - 1 - p < W``."""
    key_pos = torch.arange(length, device=context_lens.device)
    last = (context_lens - 1)[:, None]
    visible = key_pos[None, :] <= last
    if sliding_window is not None:
        visible = visible & (last - key_pos[None, :] < sliding_window)
    return visible


@kernel_op("decode_attention")
def decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    *,
    scale: float,
    sliding_window: int | None = None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """One query per sequence, ``q [B, H, D]``, against the paged cache (already holding this token's K/V).

    Sequence b sees cache positions ``p < context_lens[b]``, and with a window W only
    ``context_lens[b] - 1 - p < W``.
    """
    k = gather_paged(k_cache, block_tables)
    v = gather_paged(v_cache, block_tables)
    visible = decode_visible(context_lens, k.shape[2], sliding_window)
    out = scaled_dot_product(
        q[:, :, None, :], k, v, visible[:, None, None, :], scale=scale, softcap=softcap, sinks=sinks
    )
    return out[:, :, 0, :]


@kernel_op("attention")
def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    scale: float,
    key_padding_mask: torch.Tensor | None = None,
    causal: bool = False,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """Batched attention ``q [B, Tq, H, D]``, ``k/v [B, Tk, Hkv, D]`` → ``[B, Tq, H, Dv]``.

    Non-causal by default (DiT self-attention, encoders); with different Tq and Tk it is cross attention.
    ``key_padding_mask [B, Tk]`` is True for real keys.
    """
    mask = None
    if key_padding_mask is not None:
        mask = key_padding_mask[:, None, None, :].bool()
    if causal:
        tq, tk = q.shape[1], k.shape[1]
        tri = torch.ones(tq, tk, dtype=torch.bool, device=q.device).tril(tk - tq)[None, None]
        mask = tri if mask is None else mask & tri
    out = scaled_dot_product(
        q.transpose(1, 2),
        k.transpose(1, 2),
        v.transpose(1, 2),
        mask,
        scale=scale,
        softcap=softcap,
        sinks=sinks,
    )
    return out.transpose(1, 2)
