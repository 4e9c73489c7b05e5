"""What a causal LM plugin provides, and how core builds one from a checkpoint directory."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch
from torch import nn
from transformers import PretrainedConfig

from .attention import AttentionMetadata, bind_kv_caches, collect_kv_spec
from .errors import ConfigError, ShardingError
from .hf_config import CONFIG_NAME, load_hf_config, read_config_dict
from .kv_cache import KVSpec
from .parallel.state import ProcessGroupHandle, get_parallel_layout
from .plugins import ModelPlugin, plugin_for_architecture
from .runtime_config import NeuronConfig
from .weights import KeyMap, SafetensorsCheckpoint, load_parameters


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


class PagedCausalLM(nn.Module):
    """The contract's plumbing every decoder-only plugin model shares, so a model file holds only its math.

    A subclass sets ``self.config`` (with ``block_size``), ``self.tp`` (its TP group) and ``self.lm_head``,
    and defines ``forward`` and ``checkpoint_keys()``; it overrides ``ignored_checkpoint_keys()`` for keys
    it deliberately leaves unread, and ``compute_logits`` if its logits need more than the head.
    """

    config: Any
    tp: ProcessGroupHandle
    lm_head: nn.Module

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden).float()

    def get_kv_spec(self) -> KVSpec:
        return collect_kv_spec(self, self.config.block_size)

    def bind_kv_cache(self, caches: dict[str, list[torch.Tensor]]) -> None:
        bind_kv_caches(self, caches)

    def checkpoint_keys(self) -> KeyMap:
        raise NotImplementedError(f"{type(self).__name__} must map its parameters to checkpoint keys")

    def ignored_checkpoint_keys(self) -> tuple[str, ...]:
        return ()

    def load_weights(self, checkpoint_dir: str | Path, progress: bool = True) -> None:
        with SafetensorsCheckpoint(checkpoint_dir) as checkpoint:
            load_parameters(
                self,
                checkpoint,
                self.checkpoint_keys(),
                rank=self.tp.rank,
                world_size=self.tp.world_size,
                ignore=self.ignored_checkpoint_keys(),
                progress=progress,
            )


def resolve_checkpoint(checkpoint_dir: str | Path) -> tuple[ModelPlugin, PretrainedConfig]:
    """The plugin serving the checkpoint's ``architectures[0]`` and its transformers config, after checking
    that ``model_type`` is the one the plugin declares for that architecture (transformers would otherwise
    build whatever config class ``model_type`` names, whatever the architecture says)."""
    path = Path(checkpoint_dir) / CONFIG_NAME
    raw = read_config_dict(checkpoint_dir)
    architectures = raw.get("architectures")
    if not architectures or not isinstance(architectures, list):
        raise ConfigError(f"{path}: missing required field 'architectures' (a list naming the model class)")
    plugin = plugin_for_architecture(architectures[0])
    if "model_type" in raw:
        plugin.check_model_type(architectures[0], raw["model_type"], where=f"{path}: ")
    return plugin, load_hf_config(checkpoint_dir, plugin.required_config_fields)


def check_model_config(checkpoint_dir: str | Path, neuron_config: NeuronConfig) -> PretrainedConfig:
    """Everything ``build_model`` refuses before it allocates a weight: the config, and the plugin's own
    validation against ``neuron_config`` (TP/EP degrees the model cannot split over, an unsupported
    variant). Needs no weights and no parallel state, so a launcher calls it before starting any rank."""
    plugin, hf_config = resolve_checkpoint(checkpoint_dir)
    plugin.validate(hf_config, neuron_config)
    return hf_config


def build_model(
    checkpoint_dir: str | Path, neuron_config: NeuronConfig, *, load: bool = True, progress: bool = True
) -> CausalLM:
    """Resolve the checkpoint's architecture to an installed plugin, build the model, load its weights.

    Call after ``init_parallel_state`` on every rank; each rank builds and loads only its shard.
    """
    plugin, hf_config = resolve_checkpoint(checkpoint_dir)
    layout = get_parallel_layout()
    if (layout.tp, layout.ep) != (neuron_config.tp_degree, neuron_config.ep_degree):
        raise ShardingError(
            f"tp_degree={neuron_config.tp_degree}, ep_degree={neuron_config.ep_degree} but the parallel "
            f"state is {layout.describe()}; call init_parallel_state (or use parallel.launch.run_on_ranks) first"
        )
    model = plugin.load_factory()(hf_config, neuron_config)
    if load:
        model.load_weights(checkpoint_dir, progress=progress)
    return model
