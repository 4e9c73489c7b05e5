"""Builds the gpt-oss variant a checkpoint asks for (BF16 or MXFP4 experts), after validating its config."""

from __future__ import annotations

from transformers import PretrainedConfig

from trnmodels.core.decoder_config import refuse_quantization
from trnmodels.core.errors import ConfigError
from trnmodels.core.modules import experts_per_rank
from trnmodels.core.parallel import check_divisible, kv_heads_per_rank
from trnmodels.core.runtime_config import NeuronConfig

from .config import GptOssConfig
from .model import GptOssForCausalLM

SUPPORTED_ROPE_TYPES = ("default", "yarn")


def validate(hf_config: PretrainedConfig, neuron_config: NeuronConfig) -> GptOssConfig:
    """``quantization_config`` picks the variant: none is BF16; ``mxfp4`` dequantizes the experts at load."""
    method = refuse_quantization(
        hf_config,
        "trnmodels-gpt-oss",
        served=("mxfp4",),
        what="it serves BF16 checkpoints and the published MXFP4 form",
    )
    cfg = GptOssConfig.from_configs(hf_config, neuron_config, mxfp4=method == "mxfp4")
    if cfg.rope.rope_type not in SUPPORTED_ROPE_TYPES:
        raise ConfigError(
            f"config.json: rope_parameters.rope_type: expected one of {SUPPORTED_ROPE_TYPES}, "
            f"got {cfg.rope.rope_type!r}"
        )
    if not 1 <= cfg.experts_per_token <= cfg.num_experts:
        raise ConfigError(
            f"config.json: num_experts_per_tok={cfg.experts_per_token} must be between 1 and "
            f"num_local_experts={cfg.num_experts}"
        )
    if "sliding_attention" in cfg.layer_types and not cfg.sliding_window:
        raise ConfigError(
            "config.json: layer_types has sliding_attention layers but sliding_window is not set"
        )
    kv_heads_per_rank(cfg.num_heads, cfg.num_kv_heads, cfg.tp_degree)
    experts_per_rank(cfg.num_experts, cfg.ep_degree)
    check_divisible("intermediate_size", cfg.intermediate_size, cfg.tp_degree)
    return cfg


def build(hf_config: PretrainedConfig, neuron_config: NeuronConfig) -> GptOssForCausalLM:
    return GptOssForCausalLM(validate(hf_config, neuron_config))
