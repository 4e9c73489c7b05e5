"""Reject a checkpoint the plugin cannot serve while vLLM builds its config, before any engine starts.

vLLM runs the config hook of an architecture (``verify_and_update_config``) in the process that parses
``vllm serve`` or ``LLM(...)`` arguments. Ours builds the plugin's model on the meta device, which runs
every check the plugin's factory and modules make (unsupported quantization, activations, head counts
that do not split over the TP degree...) without allocating a weight, so the user sees our error naming
the file and field instead of an engine-core failure. vLLM's own hook for the architecture still runs.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from ..errors import ConfigError
from ..hf_config import load_hf_config
from ..plugins import ModelPlugin, plugin_for_architecture
from ..runtime_config import NeuronConfig


def checkpoint_dir(vllm_config: Any) -> Path:
    """The local checkpoint directory vLLM was given; our loaders read it directly."""
    model = Path(vllm_config.model_config.model)
    if not model.is_dir():
        raise ConfigError(
            f"trnmodels serves local checkpoint directories; {str(model)!r} is not a directory "
            "(download the checkpoint first and pass its path)"
        )
    return model


def resolve_plugin(vllm_config: Any) -> ModelPlugin:
    architectures = getattr(vllm_config.model_config.hf_config, "architectures", None) or []
    errors = []
    for arch in architectures:
        try:
            return plugin_for_architecture(arch)
        except ConfigError as e:
            errors.append(str(e))
    raise ConfigError("; ".join(errors) or "config.json names no architectures")


def check_checkpoint(vllm_config: Any) -> None:
    """Build the plugin's model for ``vllm_config``'s checkpoint on the meta device; raises its error."""
    path = checkpoint_dir(vllm_config)
    plugin = resolve_plugin(vllm_config)
    hf_config = load_hf_config(path, plugin.required_config_fields)
    neuron_config = NeuronConfig(
        tp_degree=vllm_config.parallel_config.tensor_parallel_size,
        dtype=vllm_config.model_config.dtype,
        max_model_len=vllm_config.model_config.max_model_len,
    )
    with torch.device("meta"):
        plugin.load_factory()(hf_config, neuron_config)


def config_hook(previous: type | None) -> type:
    """A vLLM ``VerifyAndUpdateConfig`` class that runs ``check_checkpoint``, then ``previous``'s hook."""
    from vllm.model_executor.models.config import VerifyAndUpdateConfig

    base: type = previous or VerifyAndUpdateConfig

    def verify_and_update_config(vllm_config: Any) -> None:
        check_checkpoint(vllm_config)
        previous_hook: Callable[[Any], None] = base.verify_and_update_config
        previous_hook(vllm_config)

    return type(
        "TrnmodelsConfigCheck",
        (base,),
        {"verify_and_update_config": staticmethod(verify_and_update_config)},
    )
