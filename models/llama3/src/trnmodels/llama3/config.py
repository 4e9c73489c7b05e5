"""Llama 3 config: the fields the model reads from the HF config, and the runtime settings it runs with."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import PretrainedConfig

from trnmodels.core.ops import RopeConfig
from trnmodels.core.runtime_config import NeuronConfig


@dataclass(frozen=True)
class LlamaConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope: RopeConfig
    tie_word_embeddings: bool
    attention_bias: bool
    mlp_bias: bool
    hidden_act: str
    tp_degree: int
    dtype: torch.dtype
    block_size: int

    @classmethod
    def from_configs(cls, hf_config: PretrainedConfig, neuron_config: NeuronConfig) -> LlamaConfig:
        num_heads = hf_config.num_attention_heads
        # Llama 3.2 and later publish head_dim explicitly; it need not equal hidden_size / heads.
        head_dim = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // num_heads
        return cls(
            vocab_size=hf_config.vocab_size,
            hidden_size=hf_config.hidden_size,
            intermediate_size=hf_config.intermediate_size,
            num_layers=hf_config.num_hidden_layers,
            num_heads=num_heads,
            num_kv_heads=getattr(hf_config, "num_key_value_heads", None) or num_heads,
            head_dim=head_dim,
            rms_norm_eps=hf_config.rms_norm_eps,
            rope=RopeConfig.from_hf(hf_config, head_dim),
            tie_word_embeddings=bool(hf_config.tie_word_embeddings),
            attention_bias=bool(getattr(hf_config, "attention_bias", False)),
            mlp_bias=bool(getattr(hf_config, "mlp_bias", False)),
            hidden_act=hf_config.hidden_act,
            tp_degree=neuron_config.tp_degree,
            dtype=neuron_config.dtype,
            block_size=neuron_config.block_size,
        )
