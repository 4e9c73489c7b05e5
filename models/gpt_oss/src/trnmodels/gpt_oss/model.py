"""gpt-oss (20b, 120b) on trnmodels core: the mixture-of-experts template.

What differs from the dense template (models/llama3): attention has learned sinks, biases and alternates
sliding-window and full layers (``layer_types``; the KV spec carries each layer's window); the MLP is a
top-k routed MoE whose experts are split over EP ranks and TP-split inside (core ``MoEExperts``); expert
weights come as BF16 tensors or MXFP4 blocks/scales, dequantized at load.

The rank arrives as one global tensor; ``ParallelLayout.coord_tensor`` turns it into the TP or EP index,
so one compiled graph serves every rank.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from trnmodels.core import ops
from trnmodels.core.attention import AttentionMetadata, PagedAttention
from trnmodels.core.causal_lm import PagedCausalLM
from trnmodels.core.modules import ExpertsCheckpointFormat, MoEExperts, RMSNorm, RotaryEmbedding
from trnmodels.core.parallel import (
    ParallelLMHead,
    QKVParallelLinear,
    RowParallelLinear,
    VocabParallelEmbedding,
    get_parallel_layout,
    get_tp_group,
)
from trnmodels.core.runtime_config import NeuronConfig
from trnmodels.core.weights import KeyMap, prefixed, set_weight_loader, sharded

from .config import GptOssConfig

KeyDict = dict[str, str | list[str]]


class GptOssAttention(nn.Module):
    def __init__(self, cfg: GptOssConfig, layer_idx: int):
        super().__init__()
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
            sliding_window=cfg.window(layer_idx),
            sinks=True,
            dtype=cfg.dtype,
        )
        # One learned sink logit per query head: a rank holds its heads' sinks.
        set_weight_loader(self.attn.sinks, sharded(0))
        self.bias = cfg.attention_bias

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, meta: AttentionMetadata
    ) -> torch.Tensor:
        q, k, v = self.qkv_proj(x)
        q, k = ops.apply_rope(q, cos, sin), ops.apply_rope(k, cos, sin)
        return self.o_proj(self.attn(q, k, v, meta))

    def checkpoint_keys(self, prefix: str) -> KeyDict:
        keys: KeyDict = {
            "qkv_proj.weight": [f"{prefix}{p}_proj.weight" for p in "qkv"],
            "o_proj.weight": f"{prefix}o_proj.weight",
            "attn.sinks": f"{prefix}sinks",
        }
        if self.bias:
            keys["qkv_proj.bias"] = [f"{prefix}{p}_proj.bias" for p in "qkv"]
            keys["o_proj.bias"] = f"{prefix}o_proj.bias"
        return keys


class GptOssMoE(nn.Module):
    """Router (linear with bias, softmax over the top-k logits) and the expert-parallel experts."""

    def __init__(self, cfg: GptOssConfig):
        super().__init__()
        self.top_k = cfg.experts_per_token
        self.mxfp4 = cfg.mxfp4
        # The router is tiny and every rank needs all of its logits: replicated.
        self.router_weight = nn.Parameter(
            torch.empty(cfg.num_experts, cfg.hidden_size, dtype=cfg.dtype), False
        )
        self.router_bias = nn.Parameter(torch.empty(cfg.num_experts, dtype=cfg.dtype), False)
        self.experts = MoEExperts(
            cfg.num_experts,
            cfg.hidden_size,
            cfg.intermediate_size,
            act="swiglu_clamped",
            bias=True,
            alpha=cfg.swiglu_alpha,
            limit=cfg.swiglu_limit,
            checkpoint_format=ExpertsCheckpointFormat(mxfp4=cfg.mxfp4),
            dtype=cfg.dtype,
        )

    def forward(self, x: torch.Tensor, rank: torch.Tensor) -> torch.Tensor:
        logits = F.linear(x, self.router_weight, self.router_bias)
        weights, experts = ops.route(logits, self.top_k)
        return self.experts(x, weights, experts, rank)

    def checkpoint_keys(self, prefix: str) -> KeyDict:
        def weight(name: str) -> str | list[str]:
            stem = f"{prefix}experts.{name}"
            return [f"{stem}_blocks", f"{stem}_scales"] if self.mxfp4 else stem

        return {
            "router_weight": f"{prefix}router.weight",
            "router_bias": f"{prefix}router.bias",
            "experts.gate_up": weight("gate_up_proj"),
            "experts.gate_up_bias": f"{prefix}experts.gate_up_proj_bias",
            "experts.down": weight("down_proj"),
            "experts.down_bias": f"{prefix}experts.down_proj_bias",
        }


class GptOssDecoderLayer(nn.Module):
    def __init__(self, cfg: GptOssConfig, layer_idx: int):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype=cfg.dtype)
        self.self_attn = GptOssAttention(cfg, layer_idx)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype=cfg.dtype)
        self.mlp = GptOssMoE(cfg)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        meta: AttentionMetadata,
        rank: torch.Tensor,
    ) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, meta)
        return x + self.mlp(self.post_attention_layernorm(x), rank)

    def checkpoint_keys(self, prefix: str) -> KeyDict:
        return {
            "input_layernorm.weight": f"{prefix}input_layernorm.weight",
            "post_attention_layernorm.weight": f"{prefix}post_attention_layernorm.weight",
            **prefixed("self_attn.", self.self_attn.checkpoint_keys(f"{prefix}self_attn.")),
            **prefixed("mlp.", self.mlp.checkpoint_keys(f"{prefix}mlp.")),
        }


class GptOssForCausalLM(PagedCausalLM):
    def __init__(self, cfg: GptOssConfig):
        super().__init__()
        self.config = cfg
        self.vocab_size = cfg.vocab_size
        self.tp = get_tp_group()
        self.layout = get_parallel_layout()
        self.embed_tokens = VocabParallelEmbedding(cfg.vocab_size, cfg.hidden_size, dtype=cfg.dtype)
        self.rotary = RotaryEmbedding(cfg.rope)
        self.layers = nn.ModuleList(GptOssDecoderLayer(cfg, i) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype=cfg.dtype)
        self.lm_head = ParallelLMHead(cfg.vocab_size, cfg.hidden_size, dtype=cfg.dtype)
        if cfg.tie_word_embeddings:
            self.lm_head.tie(self.embed_tokens)

    @classmethod
    def from_configs(cls, hf_config, neuron_config: NeuronConfig) -> GptOssForCausalLM:
        from .factory import validate

        return cls(validate(hf_config, neuron_config))

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        attn_metadata: AttentionMetadata,
        rank: torch.Tensor,
    ) -> torch.Tensor:
        x = self.embed_tokens(input_ids, self.layout.coord_tensor(rank, "tp"))
        cos, sin = self.rotary(positions, x.dtype)
        for layer in self.layers:
            x = layer(x, cos, sin, attn_metadata, rank)
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
