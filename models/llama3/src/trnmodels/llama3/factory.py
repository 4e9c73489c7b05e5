"""Builds the Llama 3 variant a checkpoint asks for, after validating its config."""

from __future__ import annotations

from transformers import PretrainedConfig

from trnmodels.core.errors import ConfigError
from trnmodels.core.parallel import kv_heads_per_rank
from trnmodels.core.runtime_config import NeuronConfig

from .config import LlamaConfig
from .model import LlamaForCausalLM

SUPPORTED_ACTIVATIONS = ("silu",)
SUPPORTED_ROPE_TYPES = ("default", "llama3")


def validate(hf_config: PretrainedConfig, neuron_config: NeuronConfig) -> LlamaConfig:
    quant = getattr(hf_config, "quantization_config", None)
    if quant:
        method = (
            quant.get("quant_method", "?") if isinstance(quant, dict) else getattr(quant, "quant_method", "?")
        )
        raise ConfigError(
            f"config.json: quantization_config with quant_method={method!r} is not supported by trnmodels-llama3 "
            "(it serves unquantized BF16/FP32 checkpoints only; there is no silent fallback)"
        )
    cfg = LlamaConfig.from_configs(hf_config, neuron_config)
    if cfg.hidden_act not in SUPPORTED_ACTIVATIONS:
        raise ConfigError(
            f"config.json: hidden_act: expected one of {SUPPORTED_ACTIVATIONS}, got {cfg.hidden_act!r}"
        )
    if cfg.rope.rope_type not in SUPPORTED_ROPE_TYPES:
        raise ConfigError(
            f"config.json: rope_parameters.rope_type: expected one of {SUPPORTED_ROPE_TYPES}, got {cfg.rope.rope_type!r}"
        )
    if neuron_config.ep_degree > 1:
        raise ConfigError(
            f"ep_degree={neuron_config.ep_degree}: expert parallelism needs a mixture-of-experts model; "
            "Llama 3 is dense (split it with tp_degree)"
        )
    kv_heads_per_rank(cfg.num_heads, cfg.num_kv_heads, cfg.tp_degree)
    return cfg


def build(hf_config: PretrainedConfig, neuron_config: NeuronConfig) -> LlamaForCausalLM:
    return LlamaForCausalLM(validate(hf_config, neuron_config))
