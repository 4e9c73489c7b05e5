"""The standard dense decoder's config (Llama's shape) and the checks every plugin runs before building.

A plugin whose checkpoints use the common HF fields (hidden size, heads, KV heads, head_dim, RoPE,
RMSNorm eps, tying, biases, a gated MLP activation) reads them with ``DenseDecoderConfig.from_configs``
and validates them with ``validate_dense``; a model with more fields keeps a config of its own.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

import torch
from transformers import PretrainedConfig

from .errors import ConfigError
from .hf_config import refuse_non_finite
from .ops import RopeConfig
from .parallel import kv_heads_per_rank
from .runtime_config import NeuronConfig

UNQUANTIZED_ONLY = "it serves unquantized BF16/FP32 checkpoints only; there is no silent fallback"


def quant_method(hf_config: PretrainedConfig) -> str | None:
    """The checkpoint's ``quantization_config.quant_method`` (``"?"`` when it names none), or None."""
    quant: Any = getattr(hf_config, "quantization_config", None)
    if not quant:
        return None
    method = quant.get("quant_method") if isinstance(quant, dict) else getattr(quant, "quant_method", None)
    return str(method) if method is not None else "?"


def refuse_quantization(
    hf_config: PretrainedConfig, distribution: str, served: Collection[str] = (), what: str = UNQUANTIZED_ONLY
) -> str | None:
    """The quantization method when the plugin serves it (None: unquantized); any other is an error."""
    method = quant_method(hf_config)
    if method is not None and method not in served:
        raise ConfigError(
            f"config.json: quantization_config with quant_method={method!r} is not supported by "
            f"{distribution} ({what})"
        )
    return method


@dataclass(frozen=True)
class DecoderConfig:
    """What every decoder reads for its embedding, attention, norms and head, and how it runs (TP degree,
    dtype, KV block size). A model config adds its MLP's fields (``DenseDecoderConfig``, or an MoE's)."""

    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope: RopeConfig
    tie_word_embeddings: bool
    attention_bias: bool
    tp_degree: int
    dtype: torch.dtype
    block_size: int

    @staticmethod
    def common_fields(hf_config: PretrainedConfig, neuron_config: NeuronConfig) -> dict[str, Any]:
        """This dataclass's fields from the standard HF names (a subclass's ``from_configs`` adds its own)."""
        refuse_non_finite(hf_config)
        num_heads = hf_config.num_attention_heads
        # Llama 3.2 and later publish head_dim explicitly; it need not equal hidden_size / heads.
        head_dim = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // num_heads
        return dict(
            vocab_size=hf_config.vocab_size,
            hidden_size=hf_config.hidden_size,
            num_layers=hf_config.num_hidden_layers,
            num_heads=num_heads,
            num_kv_heads=getattr(hf_config, "num_key_value_heads", None) or num_heads,
            head_dim=head_dim,
            rms_norm_eps=hf_config.rms_norm_eps,
            rope=RopeConfig.from_hf(hf_config, head_dim),
            tie_word_embeddings=bool(hf_config.tie_word_embeddings),
            attention_bias=bool(getattr(hf_config, "attention_bias", False)),
            tp_degree=neuron_config.tp_degree,
            dtype=neuron_config.dtype,
            block_size=neuron_config.block_size,
        )


@dataclass(frozen=True)
class DenseDecoderConfig(DecoderConfig):
    intermediate_size: int
    mlp_bias: bool
    hidden_act: str

    @classmethod
    def from_configs(cls, hf_config: PretrainedConfig, neuron_config: NeuronConfig) -> DenseDecoderConfig:
        return cls(
            **cls.common_fields(hf_config, neuron_config),
            intermediate_size=hf_config.intermediate_size,
            mlp_bias=bool(getattr(hf_config, "mlp_bias", False)),
            hidden_act=hf_config.hidden_act,
        )


def validate_dense(
    hf_config: PretrainedConfig,
    neuron_config: NeuronConfig,
    *,
    distribution: str,
    model: str,
    activations: Collection[str] = ("silu",),
    rope_types: Collection[str] = ("default", "llama3"),
) -> DenseDecoderConfig:
    """What a dense plugin refuses before building: quantized checkpoints, an activation or RoPE type it
    does not implement, expert parallelism, and a TP degree the heads cannot split over."""
    refuse_quantization(hf_config, distribution)
    cfg = DenseDecoderConfig.from_configs(hf_config, neuron_config)
    if cfg.hidden_act not in activations:
        raise ConfigError(
            f"config.json: hidden_act: expected one of {tuple(activations)}, got {cfg.hidden_act!r}"
        )
    if cfg.rope.rope_type not in rope_types:
        raise ConfigError(
            f"config.json: rope_parameters.rope_type: expected one of {tuple(rope_types)}, "
            f"got {cfg.rope.rope_type!r}"
        )
    if neuron_config.ep_degree > 1:
        raise ConfigError(
            f"ep_degree={neuron_config.ep_degree}: expert parallelism needs a mixture-of-experts model; "
            f"{model} is dense (split it with tp_degree)"
        )
    kv_heads_per_rank(cfg.num_heads, cfg.num_kv_heads, cfg.tp_degree)
    return cfg
