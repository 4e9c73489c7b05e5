"""Llama 3 (3.1, 3.2, 3.3) on trnmodels core: the dense-model template.

To port another dense model, copy this file and change what differs (see docs/porting.md). The model
sees flat, padded tokens and per-step attention metadata; the KV cache lives behind ``PagedAttention``;
every parameter names its checkpoint key(s) in ``checkpoint_keys``.
"""

from __future__ import annotations

import torch
from torch import nn

from trnmodels.core.attention import AttentionMetadata, PagedAttention
from trnmodels.core.causal_lm import PagedCausalLM
from trnmodels.core.modules import GatedMLP, RMSNorm, RotaryEmbedding
from trnmodels.core.ops import apply_rope
from trnmodels.core.parallel import (
    ParallelLMHead,
    QKVParallelLinear,
    RowParallelLinear,
    VocabParallelEmbedding,
    get_tp_group,
)
from trnmodels.core.runtime_config import NeuronConfig
from trnmodels.core.weights import KeyMap, prefixed

from .config import LlamaConfig

KeyDict = dict[str, str | list[str]]


class LlamaAttention(nn.Module):
    def __init__(self, cfg: LlamaConfig, layer_idx: int):
        super().__init__()
        self.bias = cfg.attention_bias
        self.qkv_proj = QKVParallelLinear(
            cfg.hidden_size,
            cfg.head_dim,
            cfg.num_heads,
            cfg.num_kv_heads,
            cfg.attention_bias,
            dtype=cfg.dtype,
        )
        self.o_proj = RowParallelLinear(
            cfg.num_heads * cfg.head_dim, cfg.hidden_size, cfg.attention_bias, dtype=cfg.dtype
        )
        self.attn = PagedAttention(
            f"layers.{layer_idx}.self_attn",
            self.qkv_proj.num_heads,
            self.qkv_proj.num_kv_heads,
            cfg.head_dim,
            dtype=cfg.dtype,
        )

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, meta: AttentionMetadata
    ) -> torch.Tensor:
        q, k, v = self.qkv_proj(x)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        return self.o_proj(self.attn(q, k, v, meta))

    def checkpoint_keys(self, prefix: str) -> KeyDict:
        keys: KeyDict = {
            "qkv_proj.weight": [f"{prefix}{p}_proj.weight" for p in "qkv"],
            "o_proj.weight": f"{prefix}o_proj.weight",
        }
        if self.bias:
            keys["qkv_proj.bias"] = [f"{prefix}{p}_proj.bias" for p in "qkv"]
            keys["o_proj.bias"] = f"{prefix}o_proj.bias"
        return keys


class LlamaDecoderLayer(nn.Module):
    def __init__(self, cfg: LlamaConfig, layer_idx: int):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype=cfg.dtype)
        self.self_attn = LlamaAttention(cfg, layer_idx)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype=cfg.dtype)
        self.mlp = GatedMLP(
            cfg.hidden_size, cfg.intermediate_size, cfg.hidden_act, cfg.mlp_bias, dtype=cfg.dtype
        )
        self.mlp_bias = cfg.mlp_bias

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, meta: AttentionMetadata
    ) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, meta)
        return x + self.mlp(self.post_attention_layernorm(x))

    def checkpoint_keys(self, prefix: str) -> KeyDict:
        return {
            "input_layernorm.weight": f"{prefix}input_layernorm.weight",
            "post_attention_layernorm.weight": f"{prefix}post_attention_layernorm.weight",
            **prefixed("self_attn.", self.self_attn.checkpoint_keys(f"{prefix}self_attn.")),
            **prefixed("mlp.", GatedMLP.checkpoint_keys(f"{prefix}mlp.", self.mlp_bias)),
        }


class LlamaForCausalLM(PagedCausalLM):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.config = cfg
        self.vocab_size = cfg.vocab_size
        self.tp = get_tp_group()
        self.embed_tokens = VocabParallelEmbedding(cfg.vocab_size, cfg.hidden_size, dtype=cfg.dtype)
        self.rotary = RotaryEmbedding(cfg.rope)
        self.layers = nn.ModuleList(LlamaDecoderLayer(cfg, i) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype=cfg.dtype)
        self.lm_head = ParallelLMHead(cfg.vocab_size, cfg.hidden_size, dtype=cfg.dtype)
        if cfg.tie_word_embeddings:
            self.lm_head.tie(self.embed_tokens)

    @classmethod
    def from_configs(cls, hf_config, neuron_config: NeuronConfig) -> LlamaForCausalLM:
        return cls(LlamaConfig.from_configs(hf_config, neuron_config))

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        attn_metadata: AttentionMetadata,
        rank: torch.Tensor,
    ) -> torch.Tensor:
        x = self.embed_tokens(input_ids, rank)
        cos, sin = self.rotary(positions, x.dtype)
        for layer in self.layers:
            x = layer(x, cos, sin, attn_metadata)
        return self.norm(x)

    def checkpoint_keys(self) -> KeyMap:
        keys: KeyDict = {
            "embed_tokens.weight": "model.embed_tokens.weight",
            "norm.weight": "model.norm.weight",
        }
        if not self.config.tie_word_embeddings:  # a tied head is the embedding's table (no key of its own)
            keys["lm_head.weight"] = "lm_head.weight"
        for i, layer in enumerate(self.layers):
            keys.update(prefixed(f"layers.{i}.", layer.checkpoint_keys(f"model.layers.{i}.")))
        return keys

    def ignored_checkpoint_keys(self) -> tuple[str, ...]:
        # Older exports carry RoPE tables; they are recomputed from the config, never loaded.
        return ("*.rotary_emb.inv_freq",)
