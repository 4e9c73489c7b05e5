"""The attention swap point, backed by vLLM: vLLM's attention layer takes each ``PagedAttention``'s place.

The model file is untouched: its attention modules are replaced after construction by ``VllmAttention``,
which keeps the same call signature (``q, k, v, meta``) and the same parameters (learned sinks keep their
name, so the plugin's checkpoint key mapping still covers them). vLLM's layer then writes the KV cache it
allocated and attends with its own metadata; ``meta`` is ignored. Each layer carries its own head counts,
head size, scale, sliding window, softcap, sinks and KV-sharing target, so mixed layers (windowed and
global, different head sizes) become vLLM's per-layer KV cache specs.
"""

from __future__ import annotations

import torch
from torch import nn
from vllm.config import VllmConfig
from vllm.model_executor.layers.attention import Attention

from ..attention import AttentionMetadata, PagedAttention, attention_layers
from ..errors import ConfigError


class VllmAttention(nn.Module):
    """One ``PagedAttention``'s configuration, executed by vLLM's ``Attention`` layer named ``layer_name``."""

    def __init__(
        self,
        source: PagedAttention,
        layer_name: str,
        vllm_config: VllmConfig,
        kv_sharing_target_layer_name: str | None = None,
    ):
        super().__init__()
        self.num_heads = source.num_heads
        self.num_kv_heads = source.num_kv_heads
        self.head_dim = source.head_dim
        # The same Parameter object: the plugin's loader fills it in place and vLLM's kernel reads it.
        self.sinks = source.sinks
        self.attn = Attention(
            num_heads=source.num_heads,
            head_size=source.head_dim,
            scale=source.scale,
            num_kv_heads=source.num_kv_heads,
            cache_config=vllm_config.cache_config,
            logits_soft_cap=source.softcap,
            per_layer_sliding_window=source.sliding_window,
            prefix=layer_name,
            kv_sharing_target_layer_name=kv_sharing_target_layer_name,
            **({"sinks": source.sinks} if source.sinks is not None else {}),
        )

    def forward(
        self, q: torch.Tensor, k: torch.Tensor | None, v: torch.Tensor | None, meta: AttentionMetadata
    ) -> torch.Tensor:
        del meta  # vLLM's forward context carries this step's metadata
        # k and v are None in a layer that reads another layer's KV cache (KV sharing).
        k = None if k is None else k.contiguous()
        v = None if v is None else v.contiguous()
        return self.attn(q.contiguous(), k, v)


def swap_attention(model: nn.Module, vllm_config: VllmConfig, prefix: str) -> list[str]:
    """Replace every ``PagedAttention`` in ``model`` by a ``VllmAttention``; returns vLLM's layer names.

    A layer's vLLM name is ``prefix`` plus its module path, so names are unique and carry the layer index
    vLLM reads from them. A KV-sharing layer names its target by the target's vLLM name.
    """
    paths = {id(m): name for name, m in model.named_modules()}
    layers = attention_layers(model)
    vllm_names = {layer.layer_name: f"{prefix}{paths[id(layer)]}" for layer in layers}
    for layer in layers:
        target = getattr(layer, "kv_sharing_target_layer_name", None)
        if target is not None and target not in vllm_names:
            raise ConfigError(f"{layer.layer_name}: shares the KV cache of unknown layer {target!r}")
        shared = None if target is None else vllm_names[target]
        model.set_submodule(
            paths[id(layer)], VllmAttention(layer, vllm_names[layer.layer_name], vllm_config, shared)
        )
    return list(vllm_names.values())
