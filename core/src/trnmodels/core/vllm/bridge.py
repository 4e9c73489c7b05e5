"""The vLLM model class for every trnmodels LLM plugin.

vLLM resolves a registered architecture to ``TrnmodelsForCausalLM`` (see ``registration``). It builds the
plugin's own model through the plugin factory, from the checkpoint's ``config.json`` read by our strict
loader, swaps its attention modules for vLLM-backed ones (vLLM owns the KV cache and scheduling), and
loads the weights with the plugin's own key-mapped loaders. vLLM calls it with flat ``input_ids`` and
``positions`` of the step's scheduled tokens, exactly the padded-flat layout our models take.

The class opts into vLLM's compile (``support_torch_compile``), as vLLM's own model classes do: unless
the engine runs eagerly (``enforce_eager``), vLLM traces the forward once with a symbolic token count and
compiles it with Inductor, which fuses the norms, rotary and activations between the matmuls. The
attention calls stay vLLM's custom ops; core's CPU kernels whose choice depends on the call's sizes or
values (the linear layers, the token-sparse MoE) are traced as custom ops that choose when they run
(``ops.dispatch``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import torch
from torch import nn
from vllm.compilation.decorators import support_torch_compile
from vllm.config import VllmConfig
from vllm.distributed import get_tensor_model_parallel_rank, get_tensor_model_parallel_world_size
from vllm.sequence import IntermediateTensors

from ..attention import AttentionMetadata
from ..causal_lm import CausalLM
from ..errors import ConfigError, InputError, ShardingError
from ..hf_config import load_hf_config
from ..neuron.adapters import register_configured_adapters
from ..parallel.state import get_tp_group, init_parallel_state
from ..runtime_config import NeuronConfig
from .attention import swap_attention
from .fused_moe import swap_fused_experts
from .packed_linear import pack_linear_layers, why_not_core_gemm
from .preflight import checkpoint_dir, resolve_plugin

# vLLM configures handlers for its own logger tree only; under it, our lines appear in vLLM's log.
logger = logging.getLogger("vllm.trnmodels")


def init_tensor_parallel() -> int:
    """Join vLLM's tensor-parallel ranks as trnmodels' TP group; returns the TP degree."""
    tp = get_tensor_model_parallel_world_size()
    if tp > 1 and get_tp_group().world_size != tp:
        world = torch.distributed.get_world_size()
        if world != tp:
            raise ShardingError(
                f"trnmodels under vLLM supports tensor parallelism only (tensor_parallel_size={tp}), "
                f"but vLLM's world has {world} ranks (pipeline or data parallelism)"
            )
        init_parallel_state(tp)
    return tp


# The forward's annotations are strings here (postponed), which vLLM cannot read: the dims are explicit.
@support_torch_compile(dynamic_arg_dims={"input_ids": 0, "positions": 0, "inputs_embeds": 0})
class TrnmodelsForCausalLM(nn.Module):
    """A trnmodels ``CausalLM`` behind vLLM's model interface. ``self.model`` is the plugin's model."""

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = ""):
        super().__init__()
        model_config = vllm_config.model_config
        self.checkpoint_dir = checkpoint_dir(vllm_config)
        self.plugin = resolve_plugin(vllm_config)
        hf_config = load_hf_config(self.checkpoint_dir, self.plugin.required_config_fields)
        tp = init_tensor_parallel()
        neuron_config = NeuronConfig(
            tp_degree=tp,
            dtype=model_config.dtype,
            block_size=vllm_config.cache_config.block_size,
            max_model_len=model_config.max_model_len,
        )
        # As build_model: the NKI adapters TRNMODELS_NKI_ADAPTERS names (none bind without the Neuron SDK,
        # but a name that is no adapter fails here as it does there).
        register_configured_adapters()
        self.model: CausalLM = self.plugin.load_factory()(hf_config, neuron_config)
        if model_config.enable_prompt_embeds:
            # Refused here, not at the first request: with prompt embeddings on, vLLM passes every step
            # (token prompts too) as embeddings, so a model that needs token ids could serve nothing.
            why = self.model.why_not_from_embeds()
            if why is not None:
                raise ConfigError(
                    f"plugin {self.plugin.name}: prompt embeddings (enable_prompt_embeds) are not "
                    f"supported for {','.join(hf_config.architectures)}: {why}"
                )
        self.attention_layers = swap_attention(self.model, vllm_config, f"{prefix}model.")
        self.register_buffer(
            "rank", torch.tensor(get_tensor_model_parallel_rank(), dtype=torch.int64), persistent=False
        )
        # The plugin's attention metadata is unused: vLLM's forward context carries the step's layout.
        self._meta = AttentionMetadata(slot_mapping=torch.empty(0, dtype=torch.int64))
        logger.info(
            "trnmodels: %s is served by plugin %s %s (%s.%s, %d vLLM attention layers)",
            ",".join(hf_config.architectures),
            self.plugin.name,
            self.plugin.version,
            type(self.model).__module__,
            type(self.model).__qualname__,
            len(self.attention_layers),
        )

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        """The embeddings ``forward`` starts from (scaled, for a model that scales): with prompt embeddings
        on, vLLM embeds token ids here and passes them to ``forward`` as ``inputs_embeds``."""
        return self.model.embed(input_ids, self.rank)

    get_input_embeddings = embed_input_ids

    def forward(
        self,
        input_ids: torch.Tensor | None,
        positions: torch.Tensor,
        intermediate_tensors: IntermediateTensors | None = None,
        inputs_embeds: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if intermediate_tensors is not None:
            raise InputError(f"plugin {self.plugin.name}: pipeline parallelism is not supported")
        if inputs_embeds is not None:
            return self.model.forward_embeds(inputs_embeds, positions, self._meta, self.rank)
        return self.model(input_ids, positions, self._meta, self.rank)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.model.compute_logits(hidden_states)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Load through the plugin's own loaders from the checkpoint directory (each rank reads only its
        slices); vLLM's iterator, which would read every tensor whole, is left unread."""
        del weights
        self.model.load_weights(self.checkpoint_dir, progress=False)
        # The plugin's loader is strict: it fills every parameter or raises naming what is missing.
        loaded = {name for name, _ in self.named_parameters()}
        # vLLM's own CPU kernels where they compute what core's ops define; the log says where not.
        _log_kernels(
            "MoE layers run vLLM's fused CPU MoE kernel", "core's kernel", swap_fused_experts(self.model)
        )
        packed = pack_linear_layers(self.model)
        why_not_core = why_not_core_gemm() if packed[0] else None
        gemm = "core's BF16 GEMM" if packed[0] and why_not_core is None else "vLLM's CPU GEMM"
        not_core = f" (not core's BF16 GEMM: {why_not_core})" if why_not_core else ""
        _log_kernels(f"linear layers run {gemm}{not_core}", "core's linear op", packed)
        return loaded


def _log_kernels(what: str, otherwise: str, outcome: tuple[int, list[str]]) -> None:
    count, reasons = outcome
    if count or reasons:
        logger.info("trnmodels: %d %s%s", count, what, f"; {otherwise} for {reasons[0]}" if reasons else "")
