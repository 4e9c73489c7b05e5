"""Builds the Gemma 4 variant a checkpoint asks for, after validating its config."""

from __future__ import annotations

from transformers import PretrainedConfig

from trnmodels.core.decoder_config import refuse_quantization
from trnmodels.core.errors import ConfigError
from trnmodels.core.modules import experts_per_rank
from trnmodels.core.parallel import check_divisible, kv_heads_per_rank
from trnmodels.core.runtime_config import NeuronConfig

from .config import FULL, LAYER_TYPES, SLIDING, Gemma4Config
from .model import Gemma4ForCausalLM

SUPPORTED_ACTIVATIONS = ("gelu_pytorch_tanh", "gelu_tanh")
SUPPORTED_ROPE_TYPES = {SLIDING: ("default",), FULL: ("default", "proportional")}
# "vision" (the published 26B-A4B and 31B-it) only lets an image's own tokens attend bidirectionally;
# the plugin serves text, whose attention is causal under both values.
SUPPORTED_BIDIRECTIONAL = (None, "vision")


def _text_config(hf_config: PretrainedConfig) -> PretrainedConfig:
    return hf_config.get_text_config() if getattr(hf_config, "model_type", "") == "gemma4" else hf_config


def _check_text_config(text: PretrainedConfig, where: str) -> None:
    layer_types = list(getattr(text, "layer_types", None) or [])
    if len(layer_types) != text.num_hidden_layers:
        raise ConfigError(
            f"{where}layer_types: has {len(layer_types)} entries but num_hidden_layers is "
            f"{text.num_hidden_layers}; expected one type per layer"
        )
    unknown = sorted({t for t in layer_types if t not in LAYER_TYPES})
    if unknown:
        raise ConfigError(f"{where}layer_types: expected entries among {LAYER_TYPES}, got {unknown}")
    bidirectional = getattr(text, "use_bidirectional_attention", None)
    if bidirectional not in SUPPORTED_BIDIRECTIONAL:
        raise ConfigError(
            f"{where}use_bidirectional_attention={bidirectional!r} is not supported: 'all' makes every token "
            "attend in both directions (an encoder, not a text generator); trnmodels-gemma4 serves causal "
            "generation and accepts null or 'vision' (where only an image's own tokens attend both ways, "
            "so text stays causal)"
        )
    if getattr(text, "attention_bias", False):
        raise ConfigError(f"{where}attention_bias=True is not supported (Gemma 4 checkpoints have none)")
    if text.hidden_activation not in SUPPORTED_ACTIVATIONS:
        raise ConfigError(
            f"{where}hidden_activation: expected one of {SUPPORTED_ACTIVATIONS}, got {text.hidden_activation!r}"
        )
    ple = text.hidden_size_per_layer_input or 0
    if ple and text.vocab_size_per_layer_input < text.vocab_size:
        raise ConfigError(
            f"{where}vocab_size_per_layer_input={text.vocab_size_per_layer_input} is smaller than "
            f"vocab_size={text.vocab_size}: some token ids would have no per-layer embedding"
        )
    if text.enable_moe_block:
        for name in ("num_experts", "top_k_experts", "moe_intermediate_size"):
            if not getattr(text, name, None):
                raise ConfigError(
                    f"{where}enable_moe_block=True needs {name}, got {getattr(text, name, None)!r}"
                )


def validate(hf_config: PretrainedConfig, neuron_config: NeuronConfig) -> Gemma4Config:
    refuse_quantization(hf_config, "trnmodels-gemma4")
    multimodal = getattr(hf_config, "model_type", "") == "gemma4"
    where = "config.json: text_config." if multimodal else "config.json: "
    text = _text_config(hf_config)
    _check_text_config(text, where)
    cfg = Gemma4Config.from_configs(hf_config, neuron_config)
    for layer_type, rope in cfg.rope.items():
        if rope.rope_type not in SUPPORTED_ROPE_TYPES[layer_type]:
            raise ConfigError(
                f"{where}rope_parameters.{layer_type}.rope_type: expected one of "
                f"{SUPPORTED_ROPE_TYPES[layer_type]}, got {rope.rope_type!r}"
            )
        if rope.rope_type == "default" and rope.partial_rotary_factor != 1.0:
            raise ConfigError(
                f"{where}rope_parameters.{layer_type}: partial_rotary_factor={rope.partial_rotary_factor} "
                "with rope_type 'default' is not supported (the reference rotates the whole head there)"
            )
    pad = cfg.pad_token_id
    if cfg.placeholder_token_ids and pad is not None and not 0 <= pad < cfg.vocab_size:
        raise ConfigError(
            f"{where}pad_token_id: the multimodal placeholders {list(cfg.placeholder_token_ids)} are embedded "
            f"as the pad token, expected an id in [0, {cfg.vocab_size}), got {pad}"
        )
    for i, layer in enumerate(cfg.layers):
        if layer.kv_source == -1:
            raise ConfigError(
                f"{where}num_kv_shared_layers={text.num_kv_shared_layers}: layer {i} ({layer.layer_type}) shares "
                "KV, but no earlier non-shared layer of that type exists to share it from"
            )
        kv_heads_per_rank(cfg.num_heads, layer.num_kv_heads, cfg.tp_degree)
        check_divisible("intermediate_size", layer.intermediate_size, cfg.tp_degree)
    if cfg.moe is not None:
        experts_per_rank(cfg.moe.num_experts, cfg.ep_degree)
        check_divisible("moe_intermediate_size", cfg.moe.intermediate_size, cfg.tp_degree)
    elif cfg.ep_degree > 1:
        raise ConfigError(
            f"ep_degree={cfg.ep_degree}: expert parallelism needs the MoE variant (enable_moe_block=True)"
        )
    return cfg


def build(hf_config: PretrainedConfig, neuron_config: NeuronConfig) -> Gemma4ForCausalLM:
    return Gemma4ForCausalLM(validate(hf_config, neuron_config))
