"""What a causal LM plugin provides, and how core builds one from a checkpoint directory."""

from __future__ import annotations

from pathlib import Path
from typing import Protocol, runtime_checkable

import torch
from transformers import PretrainedConfig

from .attention import AttentionMetadata
from .errors import ConfigError, ShardingError
from .hf_config import CONFIG_NAME, load_hf_config, read_config_dict
from .kv_cache import KVSpec
from .parallel.state import get_tp_group
from .plugins import plugin_for_architecture
from .runtime_config import NeuronConfig


@runtime_checkable
class CausalLM(Protocol):
    """The model contract every LLM plugin implements (the runner, CLI and vLLM bridge rely on it).

    ``forward`` sees padded, flat inputs and returns hidden states ``[T, hidden]``; ``compute_logits``
    turns the rows the caller selects into ``[N, vocab]``. ``rank`` is this rank's index as a tensor.
    """

    vocab_size: int

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        attn_metadata: AttentionMetadata,
        rank: torch.Tensor,
    ) -> torch.Tensor: ...

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor: ...

    def get_kv_spec(self) -> KVSpec: ...

    def bind_kv_cache(self, caches: dict[str, list[torch.Tensor]]) -> None: ...

    def load_weights(self, checkpoint_dir: str | Path, progress: bool = True) -> None: ...


def build_model(
    checkpoint_dir: str | Path, neuron_config: NeuronConfig, *, load: bool = True, progress: bool = True
) -> CausalLM:
    """Resolve the checkpoint's architecture to an installed plugin, build the model, load its weights.

    Call after ``init_parallel_state`` on every rank; each rank builds and loads only its shard.
    """
    path = Path(checkpoint_dir) / CONFIG_NAME
    architectures = read_config_dict(checkpoint_dir).get("architectures")
    if not architectures or not isinstance(architectures, list):
        raise ConfigError(f"{path}: missing required field 'architectures' (a list naming the model class)")
    plugin = plugin_for_architecture(architectures[0])
    hf_config: PretrainedConfig = load_hf_config(checkpoint_dir, plugin.required_config_fields)
    tp = get_tp_group()
    if tp.world_size != neuron_config.tp_degree:
        raise ShardingError(
            f"tp_degree={neuron_config.tp_degree} but the parallel state has {tp.world_size} rank(s); "
            "call init_parallel_state (or use parallel.launch.run_on_ranks) first"
        )
    model = plugin.load_factory()(hf_config, neuron_config)
    if load:
        model.load_weights(checkpoint_dir, progress=progress)
    return model
