"""Phase 2 on Trainium: nki-library's ``attention_cte`` kernel behind the ``prefill_attention`` op.

The onboarding guide's phase-2 example is this kernel on Gemma 4 (a 40% TTFT gain at 16k tokens or
fewer). This module is a thin binding: it converts our op's arguments to the kernel's layouts and back.
It is registered only when the runtime configuration names it (``neuron.adapters``), and only where the
Neuron SDK imports; dispatch then follows core's switch (``TRNMODELS_KERNEL_BACKEND`` = auto | torch | nki).

NOT EXERCISED HERE: no Neuron SDK or device exists on the machines this project is built on, so nothing
in this repository has run this adapter against the kernel. Its tests check the argument conversion
against a stand-in kernel with the documented layouts (nki-library 2.32 API reference); treat the
binding as unverified until it has run on a Trainium host.
"""

from __future__ import annotations

import torch

KERNEL_MODULE, KERNEL_NAME = "nkilib.core.attention.attention_cte", "attention_cte"
MAX_HEAD_DIM = 128  # the kernel's documented limit on d


def supports(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    seq_ids: torch.Tensor,
    *,
    scale: float,
    sliding_window: int | None = None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
) -> bool:
    """Calls the kernel can take: head size ≤ 128, no logit softcap, no learned sinks, and no window of 1
    (it would map to the kernel's 0, which means no window)."""
    return q.shape[-1] <= MAX_HEAD_DIM and softcap is None and sinks is None and sliding_window != 1


def sequence_bounds(seq_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per token of a flat batch of packed prompts, the first and last key index it may see (inclusive):
    its prompt's first token and itself. Padding (-1) sees only itself. Static shapes, no sync."""
    index = torch.arange(seq_ids.shape[0], device=seq_ids.device)
    starts = torch.ones_like(seq_ids, dtype=torch.bool)
    starts[1:] = seq_ids[1:] != seq_ids[:-1]
    first = torch.cummax(torch.where(starts, index, torch.zeros_like(index)), dim=0).values
    first = torch.where(seq_ids >= 0, first, index)
    return first, index


def attention_cte_adapter(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    seq_ids: torch.Tensor,
    *,
    scale: float,
    sliding_window: int | None = None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
    kernel=None,
) -> torch.Tensor:
    """``prefill_attention``'s arguments → ``attention_cte`` → ``[T, H, D]``.

    Heads become the kernel's batch (GQA natively: K/V keep ``Hkv``); packed prompts become per-query KV
    bounds; the query scale is folded into q, because the kernel requires ``scale=1.0`` with a sliding
    window; our window W (key visible iff ``i - j < W``) is the kernel's ``W - 1`` (masked iff
    ``|i - j| > window``).
    """
    if kernel is None:
        import importlib

        kernel = getattr(importlib.import_module(KERNEL_MODULE), KERNEL_NAME)
    heads = q.shape[1]
    low, high = sequence_bounds(seq_ids)
    out = kernel(
        (q * scale).transpose(0, 1).contiguous(),
        k.transpose(0, 1).contiguous(),
        v.transpose(0, 1).contiguous(),
        scale=1.0,
        causal_mask=True,
        sliding_window=None if sliding_window is None else sliding_window - 1,
        tp_q=True,
        tp_k=True,
        tp_out=False,
        bound_min=low[None].expand(heads, -1).contiguous(),
        bound_max=high[None].expand(heads, -1).contiguous(),
    )
    return out.transpose(0, 1)
