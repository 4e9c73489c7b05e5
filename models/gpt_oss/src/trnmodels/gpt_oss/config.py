"""gpt-oss config: the fields the model reads from the HF config, and the runtime settings it runs with."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import PretrainedConfig

from trnmodels.core.errors import ConfigError
from trnmodels.core.ops import RopeConfig
from trnmodels.core.runtime_config import NeuronConfig

LAYER_TYPES = ("sliding_attention", "full_attention")


@dataclass(frozen=True)
class GptOssConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    num_experts: int
    experts_per_token: int
    sliding_window: int | None
    layer_types: tuple[str, ...]
    rms_norm_eps: float
    rope: RopeConfig
    swiglu_alpha: float
    swiglu_limit: float
    attention_bias: bool
    tie_word_embeddings: bool
    mxfp4: bool
    tp_degree: int
    ep_degree: int
    dtype: torch.dtype
    block_size: int

    @classmethod
    def from_configs(
        cls, hf_config: PretrainedConfig, neuron_config: NeuronConfig, *, mxfp4: bool = False
    ) -> GptOssConfig:
        num_layers = hf_config.num_hidden_layers
        layer_types = tuple(
            getattr(hf_config, "layer_types", None)
            or ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(num_layers)]
        )
        if len(layer_types) != num_layers:
            raise ConfigError(
                f"config.json: layer_types has {len(layer_types)} entries, expected num_hidden_layers={num_layers}"
            )
        unknown = sorted(set(layer_types) - set(LAYER_TYPES))
        if unknown:
            raise ConfigError(f"config.json: layer_types: expected entries in {LAYER_TYPES}, got {unknown}")
        head_dim = (
            getattr(hf_config, "head_dim", None) or hf_config.hidden_size // hf_config.num_attention_heads
        )
        return cls(
            vocab_size=hf_config.vocab_size,
            hidden_size=hf_config.hidden_size,
            intermediate_size=hf_config.intermediate_size,
            num_layers=num_layers,
            num_heads=hf_config.num_attention_heads,
            num_kv_heads=hf_config.num_key_value_heads,
            head_dim=head_dim,
            num_experts=hf_config.num_local_experts,
            experts_per_token=hf_config.num_experts_per_tok,
            sliding_window=getattr(hf_config, "sliding_window", None),
            layer_types=layer_types,
            rms_norm_eps=hf_config.rms_norm_eps,
            rope=RopeConfig.from_hf(hf_config, head_dim),
            swiglu_alpha=float(getattr(hf_config, "swiglu_alpha", 1.702)),
            swiglu_limit=float(getattr(hf_config, "swiglu_limit", 7.0)),
            attention_bias=bool(getattr(hf_config, "attention_bias", True)),
            tie_word_embeddings=bool(hf_config.tie_word_embeddings),
            mxfp4=mxfp4,
            tp_degree=neuron_config.tp_degree,
            ep_degree=neuron_config.ep_degree,
            dtype=neuron_config.dtype,
            block_size=neuron_config.block_size,
        )

    def window(self, layer_idx: int) -> int | None:
        return self.sliding_window if self.layer_types[layer_idx] == "sliding_attention" else None
