"""Gemma 4 config: what the text model reads from the HF config, resolved per layer, plus runtime settings.

Gemma 4's layers differ from one another, so the config is a list of ``LayerConfig``: each layer's
attention type, head size, KV heads, window, whether V comes from the K projection, which earlier layer's
KV cache it reads (KV sharing), and its MLP width.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import PretrainedConfig

from trnmodels.core.hf_config import refuse_non_finite
from trnmodels.core.ops import RopeConfig
from trnmodels.core.runtime_config import NeuronConfig

SLIDING, FULL = "sliding_attention", "full_attention"
LAYER_TYPES = (SLIDING, FULL)


@dataclass(frozen=True)
class LayerConfig:
    layer_type: str
    head_dim: int
    num_kv_heads: int
    sliding_window: int | None
    k_eq_v: bool
    # The earlier layer whose KV cache this layer reads (None: it computes and stores its own).
    kv_source: int | None
    intermediate_size: int


@dataclass(frozen=True)
class MoEConfig:
    num_experts: int
    top_k: int
    intermediate_size: int


@dataclass(frozen=True)
class Gemma4Config:
    vocab_size: int
    hidden_size: int
    num_heads: int
    rms_norm_eps: float
    hidden_act: str
    layers: tuple[LayerConfig, ...]
    rope: dict[str, RopeConfig]
    final_logit_softcapping: float | None
    tie_word_embeddings: bool
    # Per-layer embeddings (PLE): 0 when the variant has none.
    hidden_size_per_layer_input: int
    vocab_size_per_layer_input: int
    moe: MoEConfig | None
    # "model.language_model." (Gemma4ForConditionalGeneration) or "model." (Gemma4ForCausalLM).
    checkpoint_prefix: str
    multimodal: bool
    # The image, video and audio placeholder ids a multimodal checkpoint's text may hold, and the id each
    # is embedded as without its tower's features (the pad token's, as transformers does).
    placeholder_token_ids: tuple[int, ...]
    pad_token_id: int | None
    tp_degree: int
    ep_degree: int
    dtype: torch.dtype
    block_size: int

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @classmethod
    def from_configs(cls, hf_config: PretrainedConfig, neuron_config: NeuronConfig) -> Gemma4Config:
        refuse_non_finite(hf_config)
        multimodal = hasattr(hf_config, "text_config") and getattr(hf_config, "model_type", "") == "gemma4"
        text = hf_config.get_text_config() if multimodal else hf_config
        num_layers = text.num_hidden_layers
        layer_types = list(text.layer_types)
        first_shared = num_layers - (text.num_kv_shared_layers or 0)
        layers = []
        for i, layer_type in enumerate(layer_types):
            resolved = text.per_layer_config[i]
            kv_source = None
            if i >= first_shared:
                # A shared layer reads the cache of the last non-shared layer of its own type.
                earlier = [j for j in range(first_shared) if layer_types[j] == layer_type]
                kv_source = earlier[-1] if earlier else -1  # -1: no source; the factory reports it
            double = bool(text.use_double_wide_mlp) and i >= first_shared > 0
            layers.append(
                LayerConfig(
                    layer_type=layer_type,
                    head_dim=resolved.head_dim,
                    num_kv_heads=resolved.num_key_value_heads,
                    sliding_window=text.sliding_window if layer_type == SLIDING else None,
                    k_eq_v=bool(text.attention_k_eq_v) and layer_type != SLIDING,
                    kv_source=kv_source,
                    intermediate_size=text.intermediate_size * (2 if double else 1),
                )
            )
        rope = {}
        for layer_type in sorted(set(layer_types) & set(LAYER_TYPES)):
            head_dim = next(layer.head_dim for layer in layers if layer.layer_type == layer_type)
            rope[layer_type] = RopeConfig.from_hf(text, head_dim, layer_type)
        moe = None
        if text.enable_moe_block:
            moe = MoEConfig(text.num_experts, text.top_k_experts, text.moe_intermediate_size)
        ple = text.hidden_size_per_layer_input or 0
        placeholders = ()
        if multimodal:
            names = ("image_token_id", "video_token_id", "audio_token_id")
            placeholders = tuple(i for i in (getattr(hf_config, n, None) for n in names) if i is not None)
        return cls(
            vocab_size=text.vocab_size,
            hidden_size=text.hidden_size,
            num_heads=text.num_attention_heads,
            rms_norm_eps=text.rms_norm_eps,
            hidden_act=text.hidden_activation,
            layers=tuple(layers),
            rope=rope,
            final_logit_softcapping=text.final_logit_softcapping,
            tie_word_embeddings=bool(hf_config.tie_word_embeddings),
            hidden_size_per_layer_input=ple,
            vocab_size_per_layer_input=text.vocab_size_per_layer_input if ple else 0,
            moe=moe,
            checkpoint_prefix="model.language_model." if multimodal else "model.",
            multimodal=multimodal,
            placeholder_token_ids=placeholders,
            pad_token_id=text.pad_token_id,
            tp_degree=neuron_config.tp_degree,
            ep_degree=neuron_config.ep_degree,
            dtype=neuron_config.dtype,
            block_size=neuron_config.block_size,
        )
