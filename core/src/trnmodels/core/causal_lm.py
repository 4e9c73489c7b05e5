"""What a causal LM plugin provides, and how core builds one from a checkpoint directory."""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch
from torch import nn
from transformers import PretrainedConfig

from .attention import AttentionMetadata, bind_kv_caches, collect_kv_spec
from .errors import ConfigError, InputError, ShardingError
from .hf_config import CONFIG_NAME, load_hf_config, read_config_dict
from .kv_cache import KVSpec
from .modules.norm import RMSNorm
from .modules.rotary import RotaryEmbedding
from .neuron.adapters import register_configured_adapters
from .ops.dispatch import cpu_kernels_enabled
from .parallel import (
    ParallelLMHead,
    ProcessGroupHandle,
    VocabParallelEmbedding,
    get_parallel_layout,
    get_tp_group,
)
from .plugins import ModelPlugin, plugin_for_architecture
from .runtime_config import NeuronConfig
from .weights import (
    KeyDict,
    KeyMap,
    huge_pages_requested,
    identity_keys,
    load_checkpoint_dir,
    place_in_huge_pages,
    prefixed,
)


@runtime_checkable
class CausalLM(Protocol):
    """The model contract every LLM plugin implements (the runner, CLI and vLLM bridge rely on it).

    ``forward`` sees padded, flat inputs and returns hidden states ``[T, hidden]``; ``embed`` is its first
    step, and ``forward_embeds`` the rest, from given embeddings, unless ``why_not_from_embeds`` says why
    the model needs the token ids themselves; ``compute_logits`` turns the rows the caller selects into
    ``[N, vocab]``. ``rank`` is this rank's index as a tensor.
    """

    vocab_size: int

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        attn_metadata: AttentionMetadata,
        rank: torch.Tensor,
    ) -> torch.Tensor: ...

    def embed(self, input_ids: torch.Tensor, rank: torch.Tensor) -> torch.Tensor: ...

    def forward_embeds(
        self,
        inputs_embeds: torch.Tensor,
        positions: torch.Tensor,
        attn_metadata: AttentionMetadata,
        rank: torch.Tensor,
    ) -> torch.Tensor: ...

    def why_not_from_embeds(self) -> str | None: ...

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor: ...

    def get_kv_spec(self) -> KVSpec: ...

    def bind_kv_cache(self, caches: dict[str, list[torch.Tensor]]) -> None: ...

    def load_weights(self, checkpoint_dir: str | Path, progress: bool = True) -> None: ...


class CausalLMConfig(Protocol):
    """What ``PagedCausalLM`` reads from a plugin's config dataclass."""

    vocab_size: int
    hidden_size: int
    rms_norm_eps: float
    tie_word_embeddings: bool
    dtype: torch.dtype
    block_size: int


@dataclass(frozen=True)
class DecoderStep:
    """The inputs of one forward the per-layer inputs are computed from (flat tokens, their positions,
    the global rank). ``input_ids`` is None for a forward from embeddings (``forward_embeds``)."""

    input_ids: torch.Tensor | None
    positions: torch.Tensor
    rank: torch.Tensor


class PagedCausalLM(nn.Module):
    """What every decoder-only plugin model repeats, so a model file holds only its math.

    It owns the config, the TP group and layout, the vocab-parallel embedding, the LM head (tied to the
    embedding when ``tie_word_embeddings``), the decoder ``layers`` and the final ``norm`` it is given
    (default: an RMSNorm with the config's ``rms_norm_eps``),
    and the standard checkpoint layout: ``{prefix}embed_tokens.weight``, ``{prefix}norm.weight``,
    ``lm_head.weight`` (absent when tied) and each layer's own ``checkpoint_keys(f"{prefix}layers.{i}.")``.

    ``forward`` is the standard decoder: ``embed``, then ``layer(x, *inputs, attn_metadata, rank)`` for
    each layer and its ``layer_inputs`` (given a ``rotary`` embedding: the one RoPE table ``(cos, sin)``),
    then the final norm. ``forward_embeds`` starts from given embeddings instead (vLLM's prompt
    embeddings), unless ``why_not_from_embeds`` names why the model cannot. A model scales its embedding
    by overriding ``embed`` (which indexes the vocab split by the TP coordinate of the global rank, so EP
    ranks are right too) and feeds its layers more by overriding ``layer_inputs``. A subclass extends ``checkpoint_keys()`` for parameters
    outside the standard layout, overrides ``ignored_checkpoint_keys()`` for keys it deliberately leaves
    unread, and ``compute_logits`` if its logits need more than the head.
    """

    def __init__(
        self,
        config: CausalLMConfig,
        layers: Iterable[nn.Module],
        norm: nn.Module | None = None,
        *,
        rotary: RotaryEmbedding | None = None,
        checkpoint_prefix: str = "model.",
    ):
        super().__init__()
        self.config = config
        self.vocab_size = config.vocab_size
        self.tp: ProcessGroupHandle = get_tp_group()
        self.layout = get_parallel_layout()
        self.checkpoint_prefix = checkpoint_prefix
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size, dtype=config.dtype)
        self.layers = nn.ModuleList(layers)
        self.norm = (
            norm if norm is not None else RMSNorm(config.hidden_size, config.rms_norm_eps, dtype=config.dtype)
        )
        self.rotary = rotary
        self.lm_head = ParallelLMHead(config.vocab_size, config.hidden_size, dtype=config.dtype)
        if config.tie_word_embeddings:
            self.lm_head.tie(self.embed_tokens)

    def tp_rank(self, rank: torch.Tensor) -> torch.Tensor:
        """This rank's TP coordinate, the index into every TP-sharded table (the rank is global: TP x EP)."""
        return self.layout.coord_tensor(rank, "tp")

    def embed(self, input_ids: torch.Tensor, rank: torch.Tensor) -> torch.Tensor:
        """``[T]`` token ids → ``[T, hidden]``, the vocab split indexed by the TP coordinate of ``rank``."""
        return self.embed_tokens(input_ids, self.tp_rank(rank))

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        attn_metadata: AttentionMetadata,
        rank: torch.Tensor,
    ) -> torch.Tensor:
        return self.decode(
            self.embed(input_ids, rank), DecoderStep(input_ids, positions, rank), attn_metadata
        )

    def forward_embeds(
        self,
        inputs_embeds: torch.Tensor,
        positions: torch.Tensor,
        attn_metadata: AttentionMetadata,
        rank: torch.Tensor,
    ) -> torch.Tensor:
        """``forward`` from ``[T, hidden]`` embeddings as ``embed`` gives them (scaled, for a model that
        scales), in place of token ids."""
        why = self.why_not_from_embeds()
        if why is not None:
            raise InputError(f"{type(self).__name__} cannot run from embeddings: {why}")
        return self.decode(inputs_embeds, DecoderStep(None, positions, rank), attn_metadata)

    def why_not_from_embeds(self) -> str | None:
        """Why this model needs token ids beyond their embeddings (None: it does not). A model whose
        ``layer_inputs`` reads ``step.input_ids`` overrides this."""
        return None

    def decode(self, x: torch.Tensor, step: DecoderStep, attn_metadata: AttentionMetadata) -> torch.Tensor:
        """The decoder layers and the final norm over the step's embeddings ``x``."""
        for layer, inputs in zip(self.layers, self.layer_inputs(step, x), strict=True):
            x = layer(x, *inputs, attn_metadata, step.rank)
        return self.norm(x)

    def layer_inputs(self, step: DecoderStep, x: torch.Tensor) -> Iterable[tuple[Any, ...]]:
        """What each layer takes between the hidden states and ``(attn_metadata, rank)``: by default the
        RoPE table ``(cos, sin)`` every layer shares. A model with per-layer inputs (RoPE per layer type,
        per-layer embeddings) overrides this."""
        if self.rotary is None:
            raise NotImplementedError(
                f"{type(self).__name__}: the standard forward needs the rotary embedding shared by every "
                "layer (pass rotary= to PagedCausalLM.__init__), or the model overrides layer_inputs"
            )
        return itertools.repeat(self.rotary(step.positions, x.dtype), len(self.layers))

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden).float()

    def get_kv_spec(self) -> KVSpec:
        return collect_kv_spec(self, self.config.block_size)

    def bind_kv_cache(self, caches: dict[str, list[torch.Tensor]]) -> None:
        bind_kv_caches(self, caches)

    def checkpoint_keys(self) -> KeyMap:
        p = self.checkpoint_prefix
        keys: KeyDict = {"embed_tokens.weight": f"{p}embed_tokens.weight", "norm.weight": f"{p}norm.weight"}
        if not self.config.tie_word_embeddings:  # a tied head is the embedding's table (no key of its own)
            keys["lm_head.weight"] = "lm_head.weight"
        for i, layer in enumerate(self.layers):
            # A layer whose parameter names are the checkpoint's needs no mapping of its own.
            layer_keys = getattr(layer, "checkpoint_keys", partial(identity_keys, layer))
            keys.update(prefixed(f"layers.{i}.", layer_keys(f"{p}layers.{i}.")))
        return keys

    def ignored_checkpoint_keys(self) -> tuple[str, ...]:
        return ()

    def load_weights(self, checkpoint_dir: str | Path, progress: bool = True) -> None:
        keys, ignore = self.checkpoint_keys(), self.ignored_checkpoint_keys()
        load_checkpoint_dir(self, checkpoint_dir, keys, self.tp, ignore=ignore, progress=progress)


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
    cpu_kernels_enabled()  # a bad TRNMODELS_CPU_KERNELS is refused here, not at the first forward
    huge_pages_requested()  # and a bad TRNMODELS_HUGE_PAGES here, not on every rank after it builds
    return hf_config


def build_model(
    checkpoint_dir: str | Path, neuron_config: NeuronConfig, *, load: bool = True, progress: bool = True
) -> CausalLM:
    """Resolve the checkpoint's architecture to an installed plugin, build the model, load its weights.

    Call after ``init_parallel_state`` on every rank; each rank builds and loads only its shard. With
    ``TRNMODELS_HUGE_PAGES=1`` the parameters live in huge pages (``weights.huge_pages``).
    """
    plugin, hf_config = resolve_checkpoint(checkpoint_dir)
    cpu_kernels_enabled()  # a bad TRNMODELS_CPU_KERNELS is refused before any weight loads
    layout = get_parallel_layout()
    if (layout.tp, layout.ep) != (neuron_config.tp_degree, neuron_config.ep_degree):
        raise ShardingError(
            f"tp_degree={neuron_config.tp_degree}, ep_degree={neuron_config.ep_degree} but the parallel "
            f"state is {layout.describe()}; call init_parallel_state (or use parallel.launch.run_on_ranks) first"
        )
    register_configured_adapters()  # only the NKI adapters the runtime configuration names, never per model
    model = plugin.load_factory()(hf_config, neuron_config)
    if huge_pages_requested():
        place_in_huge_pages(model)  # before the first write, so the loader faults it in as huge pages
    if load:
        model.load_weights(checkpoint_dir, progress=progress)
    return model
