"""Llama 3 (3.1, 3.2, 3.3) on trnmodels core: the dense-model template.

To port another dense model, copy this file and change what differs (see docs/porting.md). The model
sees flat, padded tokens and per-step attention metadata; the KV cache lives behind core's
``SelfAttention``; ``PagedCausalLM`` owns the embedding, head, the standard decoder forward and checkpoint
layout. The layers' parameter names are the checkpoint's (HF's; fused projections declare their sources),
so they need no key mapping of their own.
"""

from __future__ import annotations

import torch
from torch import nn

from trnmodels.core.attention import AttentionMetadata
from trnmodels.core.causal_lm import PagedCausalLM
from trnmodels.core.decoder_config import DenseDecoderConfig
from trnmodels.core.modules import GatedMLP, RMSNorm, RotaryEmbedding, SelfAttention


class LlamaDecoderLayer(nn.Module):
    def __init__(self, cfg: DenseDecoderConfig, layer_idx: int):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype=cfg.dtype)
        self.self_attn = SelfAttention.for_layer(cfg, layer_idx)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype=cfg.dtype)
        self.mlp = GatedMLP(
            cfg.hidden_size, cfg.intermediate_size, cfg.hidden_act, cfg.mlp_bias, dtype=cfg.dtype
        )

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        meta: AttentionMetadata,
        rank: torch.Tensor | None = None,  # dense: every rank computes the same layer
    ) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, meta)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaForCausalLM(PagedCausalLM):
    def __init__(self, cfg: DenseDecoderConfig):
        super().__init__(
            cfg,
            (LlamaDecoderLayer(cfg, i) for i in range(cfg.num_layers)),
            RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype=cfg.dtype),
            rotary=RotaryEmbedding(cfg.rope),
        )

    def ignored_checkpoint_keys(self) -> tuple[str, ...]:
        # Older exports carry RoPE tables; they are recomputed from the config, never loaded.
        return ("*.rotary_emb.inv_freq",)
