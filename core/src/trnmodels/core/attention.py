"""The attention swap point: KV-cache write plus attention, as one module per layer.

A model calls ``PagedAttention`` with projected, rotated q/k/v and the step's ``AttentionMetadata``.
Everything about where K/V live and how the step is batched stays behind this call, so an engine that
owns the cache (vLLM's attention layer) can take this module's place without touching the model file.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from . import ops
from .errors import ConfigError
from .kv_cache import KVSpec, LayerSpec, read_kv, write_kv


@dataclass
class AttentionMetadata:
    """One step's batch layout. Prefill and decode are never mixed in a step.

    - ``slot_mapping [T]``: the cache slot each token's K/V is written to (padding → the null block).
    - prefill: ``seq_ids [T]`` (sequence index per token, -1 for padding); tokens attend within their
      sequence only. ``block_tables``/``context_lens`` are None.
    - decode: one token per sequence; ``block_tables [B, max_blocks]`` and ``context_lens [B]`` (cached
      tokens including this one; padding rows use the null block and length 1).
    """

    slot_mapping: torch.Tensor
    seq_ids: torch.Tensor | None = None
    block_tables: torch.Tensor | None = None
    context_lens: torch.Tensor | None = None

    @property
    def is_prefill(self) -> bool:
        return self.block_tables is None


class PagedAttention(nn.Module):
    """Writes this step's K/V to the layer's paged cache, then attends (prefill or decode).

    ``q [T, H, D]``, ``k/v [T, Hkv, D]`` → ``[T, H * D]``. Heads are this rank's. Options cover the model
    set: a sliding window, logit softcapping, a query scale, and learned sinks (a ``[H]`` parameter the
    owning model maps to its checkpoint key).

    KV sharing (Gemma 4's last ``num_kv_shared_layers``): a layer built with
    ``kv_sharing_target_layer_name`` owns no cache. It is bound to the target layer's cache, writes
    nothing, and is called with ``k = v = None``: in prefill it reads back this step's K/V, which the
    target layer (earlier in the same forward) wrote at ``slot_mapping``; in decode it attends over the
    target's cache as usual. Its KV-head count and head size must equal the target's.
    """

    def __init__(
        self,
        layer_name: str,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        *,
        scale: float | None = None,
        sliding_window: int | None = None,
        softcap: float | None = None,
        sinks: bool = False,
        dtype: torch.dtype = torch.float32,
        kv_sharing_target_layer_name: str | None = None,
    ):
        super().__init__()
        self.layer_name = layer_name
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.scale = head_dim**-0.5 if scale is None else scale
        self.sliding_window = sliding_window
        self.softcap = softcap
        self.dtype = dtype
        self.kv_sharing_target_layer_name = kv_sharing_target_layer_name
        self.sinks = nn.Parameter(torch.empty(num_heads, dtype=dtype), requires_grad=False) if sinks else None
        self.k_cache: torch.Tensor | None = None
        self.v_cache: torch.Tensor | None = None

    def layer_spec(self) -> LayerSpec:
        return LayerSpec(self.layer_name, self.num_kv_heads, self.head_dim, self.dtype, self.sliding_window)

    def bind(self, k_cache: torch.Tensor, v_cache: torch.Tensor) -> None:
        expected = (self.num_kv_heads, self.head_dim)
        got = (k_cache.shape[1], k_cache.shape[3])
        if k_cache.shape != v_cache.shape or got != expected:
            raise ConfigError(
                f"KV cache for {self.layer_name}: expected [blocks, {expected[0]}, block_size, {expected[1]}], "
                f"got K {list(k_cache.shape)} and V {list(v_cache.shape)}"
            )
        self.k_cache, self.v_cache = k_cache, v_cache

    def forward(
        self, q: torch.Tensor, k: torch.Tensor | None, v: torch.Tensor | None, meta: AttentionMetadata
    ) -> torch.Tensor:
        if self.k_cache is None or self.v_cache is None:
            raise ConfigError(f"{self.layer_name}: no KV cache bound (call bind_kv_cache first)")
        if self.kv_sharing_target_layer_name is None:
            write_kv(self.k_cache, self.v_cache, k, v, meta.slot_mapping)
        elif meta.is_prefill:
            k, v = read_kv(self.k_cache, self.v_cache, meta.slot_mapping)
        options = dict(
            scale=self.scale, sliding_window=self.sliding_window, softcap=self.softcap, sinks=self.sinks
        )
        if meta.is_prefill:
            out = ops.prefill_attention(q, k, v, meta.seq_ids, **options)
        else:
            out = ops.decode_attention(
                q, self.k_cache, self.v_cache, meta.block_tables, meta.context_lens, **options
            )
        return out.reshape(q.shape[0], self.num_heads * self.head_dim)


def attention_layers(model: nn.Module) -> list[PagedAttention]:
    return [m for m in model.modules() if isinstance(m, PagedAttention)]


def collect_kv_spec(model: nn.Module, block_size: int) -> KVSpec:
    """The model's ``KVSpec``: one ``LayerSpec`` per attention layer that owns a cache, in model order.

    Layers that share another layer's KV (``kv_sharing_target_layer_name``) own none and are left out.
    """
    layers = attention_layers(model)
    owners = {layer.layer_name: layer for layer in layers if layer.kv_sharing_target_layer_name is None}
    for layer in layers:
        target = layer.kv_sharing_target_layer_name
        if target is None:
            continue
        if target not in owners:
            raise ConfigError(
                f"{layer.layer_name}: shares the KV cache of {target!r}, which is not an attention layer "
                f"that owns a cache (owners: {sorted(owners)})"
            )
        if (layer.num_kv_heads, layer.head_dim) != (owners[target].num_kv_heads, owners[target].head_dim):
            raise ConfigError(
                f"{layer.layer_name}: shares the KV cache of {target!r} but has "
                f"{layer.num_kv_heads} KV heads × head_dim {layer.head_dim}, the target "
                f"{owners[target].num_kv_heads} × {owners[target].head_dim}"
            )
    return KVSpec(tuple(layer.layer_spec() for layer in owners.values()), block_size)


def bind_kv_caches(model: nn.Module, caches: Mapping[str, Sequence[torch.Tensor]]) -> None:
    """Bind ``{layer_name: [k, v]}``; a missing or unknown layer name is an error, not a silent skip.

    ``caches`` holds the layers that own a cache; a KV-sharing layer is bound to its target's cache.
    """
    all_layers = attention_layers(model)
    layers = {layer.layer_name: layer for layer in all_layers if layer.kv_sharing_target_layer_name is None}
    missing = sorted(set(layers) - set(caches))
    unknown = sorted(set(caches) - set(layers))
    if missing or unknown:
        raise ConfigError(
            f"bind_kv_cache: caches missing for layers {missing}; caches for unknown layers {unknown}"
        )
    for name, layer in layers.items():
        k, v = caches[name]
        layer.bind(k, v)
    for layer in all_layers:
        target = layer.kv_sharing_target_layer_name
        if target is not None:
            if target not in layers:
                raise ConfigError(
                    f"bind_kv_cache: {layer.layer_name} shares the KV cache of unknown layer {target!r}"
                )
            layer.bind(*caches[target])
