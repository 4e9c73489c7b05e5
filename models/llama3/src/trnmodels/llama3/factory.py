"""Builds the Llama 3 variant a checkpoint asks for, after validating its config."""

from __future__ import annotations

from transformers import PretrainedConfig

from trnmodels.core.decoder_config import DenseDecoderConfig, validate_dense
from trnmodels.core.runtime_config import NeuronConfig

from .model import LlamaForCausalLM


def validate(hf_config: PretrainedConfig, neuron_config: NeuronConfig) -> DenseDecoderConfig:
    return validate_dense(
        hf_config,
        neuron_config,
        distribution="trnmodels-llama3",
        model="Llama 3",
        activations=("silu",),
        rope_types=("default", "llama3"),
    )


def build(hf_config: PretrainedConfig, neuron_config: NeuronConfig) -> LlamaForCausalLM:
    return LlamaForCausalLM(validate(hf_config, neuron_config))
