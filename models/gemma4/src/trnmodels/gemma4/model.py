"""Gemma 4's language model on trnmodels core: heterogeneous layers in one short file.

What differs from Llama (see docs/models/gemma4.md):

- each layer is sliding or full attention; full layers have their own head size and KV-head count, and
  with ``attention_k_eq_v`` take V from the K projection (the fused projection holds q and k only);
- q_norm and k_norm scale, v_norm does not; the attention scale is 1.0;
- four sandwich norms per layer, and a checkpointed ``layer_scalar`` multiplying its output;
- RoPE per layer type (default on sliding layers, proportional with partial rotary on full layers);
- the embedding is scaled by sqrt(hidden) and the logits are softcapped;
- per-layer embeddings (PLE): a second, packed embedding plus a projection of the first feed each layer;
- KV sharing: the last ``num_kv_shared_layers`` layers own no cache and read the cache of the last
  earlier layer of their type (``PagedAttention(kv_sharing_target_layer_name=...)``);
- MoE (26B-A4B): a dense MLP and a routed expert block run side by side on the same residual;
- a multimodal checkpoint's image, video and audio placeholder ids, served as text, embed as the pad token
  (in PLE too), as transformers does when no tower features come with them.
"""

from __future__ import annotations

import torch
from torch import nn

from trnmodels.core import ops
from trnmodels.core.attention import AttentionMetadata
from trnmodels.core.causal_lm import DecoderStep, PagedCausalLM
from trnmodels.core.modules import (
    ExpertsCheckpointFormat,
    GatedMLP,
    MoEExperts,
    RMSNorm,
    RotaryEmbedding,
    SelfAttention,
)
from trnmodels.core.ops.mlp import activation
from trnmodels.core.parallel import ReplicatedLinear, VocabParallelEmbedding
from trnmodels.core.weights import KeyDict, KeyMap, prefixed

from .config import Gemma4Config, MoEConfig

CosSin = tuple[torch.Tensor, torch.Tensor]

# Published multimodal checkpoints: the towers and their projections into text space. Serving text, they
# are recognised and skipped; any other key the model does not map still fails loading.
TOWER_KEYS = ("model.vision_tower.*", "model.audio_tower.*", "model.embed_vision.*", "model.embed_audio.*")


def norm(cfg: Gemma4Config, dim: int, with_scale: bool = True) -> RMSNorm:
    # Gemma 4 stores the scale itself (not 1 + w) and applies it in float32 before the cast.
    return RMSNorm(dim, cfg.rms_norm_eps, with_scale=with_scale, scale_in_float32=True, dtype=cfg.dtype)


def linear(cfg: Gemma4Config, in_features: int, out_features: int) -> ReplicatedLinear:
    """A replicated projection (small ones: PLE, router); loaded whole on every rank. Core's layer, not
    ``nn.Linear``: its calls go through core's linear op, so they get its CPU GEMM (vLLM's, when served)."""
    return ReplicatedLinear(in_features, out_features, dtype=cfg.dtype)


def layer_name(i: int) -> str:
    return f"layers.{i}.self_attn"


class Gemma4Attention(SelfAttention):
    """Core attention with q/k norms (scaling) and a scale-free v_norm, and attention scale 1.0; with
    ``attention_k_eq_v`` the checkpoint has no v_proj and V is the (un-normed) K projection."""

    def __init__(self, cfg: Gemma4Config, layer_idx: int):
        layer = cfg.layers[layer_idx]
        super().__init__(
            layer_name(layer_idx),
            cfg.hidden_size,
            cfg.num_heads,
            layer.num_kv_heads,
            layer.head_dim,
            qk_norm=lambda dim: norm(cfg, dim),
            scale=1.0,  # q_norm and k_norm already fix the logit scale
            sliding_window=layer.sliding_window,
            v_is_k=layer.k_eq_v,
            kv_sharing_target_layer_name=None if layer.kv_source is None else layer_name(layer.kv_source),
            dtype=cfg.dtype,
        )
        self.v_norm = None if self.shares_kv else norm(cfg, layer.head_dim, with_scale=False)

    def project(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        q, k, v = super().project(x, cos, sin)
        return q, k, (v if self.v_norm is None else self.v_norm(v))


class Gemma4Router(nn.Module):
    """Scale-free norm, a learned per-channel scale, softmax over all experts, renormalised top-k, and a
    learned per-expert scale on the chosen weights."""

    def __init__(self, cfg: Gemma4Config, moe: MoEConfig):
        super().__init__()
        self.top_k = moe.top_k
        self.root_size = cfg.hidden_size**-0.5
        self.norm = norm(cfg, cfg.hidden_size, with_scale=False)
        self.proj = linear(cfg, cfg.hidden_size, moe.num_experts)
        self.scale = nn.Parameter(torch.empty(cfg.hidden_size, dtype=cfg.dtype), requires_grad=False)
        self.per_expert_scale = nn.Parameter(
            torch.empty(moe.num_experts, dtype=cfg.dtype), requires_grad=False
        )

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self.proj(self.norm(x) * self.scale * self.root_size)
        weights, experts = ops.route(logits.float(), self.top_k, softmax_first=True)
        return weights * self.per_expert_scale[experts], experts

    @staticmethod
    def checkpoint_keys(prefix: str) -> KeyDict:
        return {name: f"{prefix}{name}" for name in ("proj.weight", "scale", "per_expert_scale")}


class Gemma4DecoderLayer(nn.Module):
    def __init__(self, cfg: Gemma4Config, layer_idx: int):
        super().__init__()
        layer = cfg.layers[layer_idx]
        self.layer_type = layer.layer_type
        self.self_attn = Gemma4Attention(cfg, layer_idx)
        self.mlp = GatedMLP(cfg.hidden_size, layer.intermediate_size, cfg.hidden_act, dtype=cfg.dtype)
        self.input_layernorm = norm(cfg, cfg.hidden_size)
        self.post_attention_layernorm = norm(cfg, cfg.hidden_size)
        self.pre_feedforward_layernorm = norm(cfg, cfg.hidden_size)
        self.post_feedforward_layernorm = norm(cfg, cfg.hidden_size)
        self.layer_scalar = nn.Parameter(torch.empty(1, dtype=cfg.dtype), requires_grad=False)
        self.moe = cfg.moe is not None
        if cfg.moe is not None:
            self.router = Gemma4Router(cfg, cfg.moe)
            self.experts = MoEExperts(
                cfg.moe.num_experts,
                cfg.hidden_size,
                cfg.moe.intermediate_size,
                act=cfg.hidden_act,
                checkpoint_format=ExpertsCheckpointFormat(transposed=True),  # [E, out, in] like nn.Linear
                dtype=cfg.dtype,
            )
            self.post_feedforward_layernorm_1 = norm(cfg, cfg.hidden_size)
            self.pre_feedforward_layernorm_2 = norm(cfg, cfg.hidden_size)
            self.post_feedforward_layernorm_2 = norm(cfg, cfg.hidden_size)
        self.ple = cfg.hidden_size_per_layer_input > 0
        if self.ple:
            self.hidden_act = cfg.hidden_act
            self.per_layer_input_gate = linear(cfg, cfg.hidden_size, cfg.hidden_size_per_layer_input)
            self.per_layer_projection = linear(cfg, cfg.hidden_size_per_layer_input, cfg.hidden_size)
            self.post_per_layer_input_norm = norm(cfg, cfg.hidden_size)

    def forward(
        self,
        x: torch.Tensor,
        rope: CosSin,
        per_layer_input: torch.Tensor | None,
        meta: AttentionMetadata,
        rank: torch.Tensor,
    ) -> torch.Tensor:
        x = x + self.post_attention_layernorm(self.self_attn(self.input_layernorm(x), *rope, meta))
        h = self.mlp(self.pre_feedforward_layernorm(x))
        if self.moe:
            # The expert block reads the same residual as the dense MLP; their normed outputs add up.
            weights, experts = self.router(x)
            routed = self.experts(self.pre_feedforward_layernorm_2(x), weights, experts, rank)
            h = self.post_feedforward_layernorm_1(h) + self.post_feedforward_layernorm_2(routed)
        x = x + self.post_feedforward_layernorm(h)
        if self.ple:
            gate = activation(self.hidden_act)(self.per_layer_input_gate(x))
            x = x + self.post_per_layer_input_norm(self.per_layer_projection(gate * per_layer_input))
        return x * self.layer_scalar

    def checkpoint_keys(self, prefix: str) -> KeyDict:
        norms = (
            "input_layernorm",
            "post_attention_layernorm",
            "pre_feedforward_layernorm",
            "post_feedforward_layernorm",
        )
        keys: KeyDict = {f"{n}.weight": f"{prefix}{n}.weight" for n in norms}
        keys["layer_scalar"] = f"{prefix}layer_scalar"
        keys.update(prefixed("self_attn.", self.self_attn.checkpoint_keys(f"{prefix}self_attn.")))
        keys.update(prefixed("mlp.", self.mlp.checkpoint_keys(f"{prefix}mlp.")))
        if self.moe:
            keys.update(prefixed("router.", Gemma4Router.checkpoint_keys(f"{prefix}router.")))
            keys["experts.gate_up"] = f"{prefix}experts.gate_up_proj"
            keys["experts.down"] = f"{prefix}experts.down_proj"
            for n in (
                "post_feedforward_layernorm_1",
                "pre_feedforward_layernorm_2",
                "post_feedforward_layernorm_2",
            ):
                keys[f"{n}.weight"] = f"{prefix}{n}.weight"
        if self.ple:
            for n in ("per_layer_input_gate", "per_layer_projection", "post_per_layer_input_norm"):
                keys[f"{n}.weight"] = f"{prefix}{n}.weight"
        return keys


class PerLayerEmbeddings(nn.Module):
    """PLE: each layer's extra input, ``[T, layers, ple_dim]``, from a packed token embedding (scaled by
    sqrt(ple_dim)) and a normed projection of the main embedding, averaged with weight 1/sqrt(2)."""

    def __init__(self, cfg: Gemma4Config):
        super().__init__()
        self.num_layers, self.dim = cfg.num_layers, cfg.hidden_size_per_layer_input
        packed = self.num_layers * self.dim
        self.embed_tokens_per_layer = VocabParallelEmbedding(
            cfg.vocab_size_per_layer_input, packed, dtype=cfg.dtype
        )
        self.register_buffer("embed_scale", torch.tensor(self.dim**0.5, dtype=cfg.dtype), persistent=False)
        self.per_layer_model_projection = linear(cfg, cfg.hidden_size, packed)
        self.projection_scale = cfg.hidden_size**-0.5
        self.per_layer_projection_norm = norm(cfg, self.dim)

    def forward(self, ids: torch.Tensor, embeds: torch.Tensor, rank: torch.Tensor) -> torch.Tensor:
        shape = (ids.shape[0], self.num_layers, self.dim)
        tokens = (self.embed_tokens_per_layer(ids, rank) * self.embed_scale).reshape(shape)
        projected = (self.per_layer_model_projection(embeds) * self.projection_scale).reshape(shape)
        return (self.per_layer_projection_norm(projected) + tokens) * 2.0**-0.5

    @staticmethod
    def checkpoint_keys(prefix: str) -> KeyDict:
        names = ("embed_tokens_per_layer", "per_layer_model_projection", "per_layer_projection_norm")
        return {f"{n}.weight": f"{prefix}{n}.weight" for n in names}


class Gemma4ForCausalLM(PagedCausalLM):
    def __init__(self, cfg: Gemma4Config):
        super().__init__(
            cfg,
            (Gemma4DecoderLayer(cfg, i) for i in range(cfg.num_layers)),
            norm(cfg, cfg.hidden_size),
            checkpoint_prefix=cfg.checkpoint_prefix,
        )
        # The scale is rounded to the model dtype first, as the reference does (sqrt(3072) → 55.5 in BF16).
        self.register_buffer(
            "embed_scale", torch.tensor(cfg.hidden_size**0.5, dtype=cfg.dtype), persistent=False
        )
        self.per_layer = PerLayerEmbeddings(cfg) if cfg.hidden_size_per_layer_input else None
        self.rotary = nn.ModuleDict({t: RotaryEmbedding(rope) for t, rope in cfg.rope.items()})

    def text_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        """``input_ids`` with each multimodal placeholder (no tower features come here) replaced by the pad
        token; unchanged for a text-only checkpoint, or one without a pad token."""
        ids, pad = self.config.placeholder_token_ids, self.config.pad_token_id
        if not ids or pad is None:
            return input_ids
        mask = input_ids == ids[0]
        for i in ids[1:]:
            mask = mask | (input_ids == i)
        return input_ids.masked_fill(mask, pad)

    def embed(self, input_ids: torch.Tensor, rank: torch.Tensor) -> torch.Tensor:
        return super().embed(self.text_ids(input_ids), rank) * self.embed_scale

    def why_not_from_embeds(self) -> str | None:
        if self.per_layer is None:
            return None
        return (
            f"its per-layer embeddings (hidden_size_per_layer_input={self.per_layer.dim}) are looked up by "
            "token id, which embeddings do not carry"
        )

    def layer_inputs(self, step: DecoderStep, x: torch.Tensor) -> list[tuple[CosSin, torch.Tensor | None]]:
        """Each layer's RoPE table (by its layer type) and its slice of the per-layer embeddings."""
        per_layer = None
        if self.per_layer is not None:
            assert step.input_ids is not None, self.why_not_from_embeds()
            per_layer = self.per_layer(self.text_ids(step.input_ids), x, self.tp_rank(step.rank))
        rope = {t: rotary(step.positions, x.dtype) for t, rotary in self.rotary.items()}
        return [
            (rope[layer.layer_type], per_layer[:, i] if per_layer is not None else None)
            for i, layer in enumerate(self.layers)
        ]

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.lm_head(hidden)
        cap = self.config.final_logit_softcapping
        if cap is not None:
            logits = torch.tanh(logits / cap) * cap
        return logits.float()

    def checkpoint_keys(self) -> KeyMap:
        keys = dict(super().checkpoint_keys())
        if self.per_layer is not None:
            keys.update(prefixed("per_layer.", PerLayerEmbeddings.checkpoint_keys(self.checkpoint_prefix)))
        return keys

    def ignored_checkpoint_keys(self) -> tuple[str, ...]:
        """Keys deliberately unused: the towers (multimodal layout), and K/V weights a KV-shared layer
        would not use if an export kept them (the reference drops them at load too)."""
        p = self.config.checkpoint_prefix
        ignored = list(TOWER_KEYS) if self.config.multimodal else []
        for i, layer in enumerate(self.config.layers):
            if layer.kv_source is not None:
                ignored += [
                    f"{p}layers.{i}.self_attn.{n}.*" for n in ("k_proj", "v_proj", "k_norm", "v_norm")
                ]
        return tuple(ignored)
