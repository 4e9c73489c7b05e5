"""The graphs a model runs as: one prefill graph per token bucket, one decode graph per
(batch, context) bucket. Each takes flat tensors only, samples inside, and returns token ids together
with a per-row flag saying whether that row's logits were all finite (NaN/inf logits are never sampled
from silently; the flag costs one reduction in the same graph, not a second pass).

The KV caches are inputs the graph writes in place, the rank is a tensor input, and the weights are
the step module's parameters: so one compiled artifact per graph serves every rank and every start.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from .. import ops
from ..attention import AttentionMetadata, attention_layers
from ..causal_lm import CausalLM
from ..kv_cache import KVSpec, allocate_kv_cache
from .config import RunnerConfig

PREFILL, DECODE = "prefill", "decode"


@dataclass(frozen=True, order=True)
class GraphSpec:
    """One static shape: prefill ``(tokens,)`` or decode ``(batch, context_len)``."""

    phase: str
    bucket: tuple[int, ...]

    @property
    def name(self) -> str:
        return f"{self.phase}_" + "x".join(map(str, self.bucket))


def finite_rows(logits: torch.Tensor) -> torch.Tensor:
    """``[N, V]`` logits -> ``[N]`` bool: every logit of the row is finite."""
    # A row's largest and smallest logits are finite exactly when all are (NaN propagates through both):
    # two vectorised reductions, not a mask of the whole row (eagerly, 13 against 61 us a row of 49152).
    return torch.isfinite(logits.amax(dim=-1)) & torch.isfinite(logits.amin(dim=-1))


def all_graph_specs(config: RunnerConfig) -> list[GraphSpec]:
    prefill = [GraphSpec(PREFILL, (t,)) for t in config.num_batched_tokens_buckets]
    decode = [GraphSpec(DECODE, (b, c)) for b in config.num_seqs_buckets for c in config.context_len_buckets]
    return prefill + decode


class StepGraph(nn.Module):
    """One runner step: bind the caches passed in, run the model, sample from the selected rows."""

    def __init__(self, model: CausalLM):
        super().__init__()
        self.model = model
        self.kv_spec = model.get_kv_spec()
        # The layers that own a cache, in the caches' order: what an eager step checks before rebinding.
        owners = {layer.layer_name: layer for layer in attention_layers(model)}
        self._cache_owners = [owners[layer.name] for layer in self.kv_spec.layers]

    def _bound(self, caches: tuple[torch.Tensor, ...]) -> bool:
        """Whether every layer already holds these caches (a runner passes the same ones every step)."""
        return all(
            layer.k_cache is caches[2 * i] and layer.v_cache is caches[2 * i + 1]
            for i, layer in enumerate(self._cache_owners)
        )

    def step(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        rows: torch.Tensor | None,
        sampling: tuple[torch.Tensor, ...],
        rank: torch.Tensor,
        caches: tuple[torch.Tensor, ...],
    ) -> tuple[torch.Tensor, torch.Tensor]:
        # Eagerly, rebinding the same caches walks every module of the model (0.3 ms of a SmolLM2-135M
        # decode step here); a capture binds its own inputs, always.
        if torch.compiler.is_compiling() or not self._bound(caches):
            self.model.bind_kv_cache(
                {
                    layer.name: [caches[2 * i], caches[2 * i + 1]]
                    for i, layer in enumerate(self.kv_spec.layers)
                }
            )
        hidden = self.model(input_ids, positions, meta, rank)
        logits = self.model.compute_logits(hidden if rows is None else hidden[rows])
        return ops.sample(logits, *sampling), finite_rows(logits)


class PrefillStep(StepGraph):
    """Prefill flat tokens of several prompts, then sample one token for each prompt's last position."""

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        seq_ids: torch.Tensor,
        slot_mapping: torch.Tensor,
        sample_index: torch.Tensor,
        temperature: torch.Tensor,
        top_k: torch.Tensor,
        top_p: torch.Tensor,
        noise: torch.Tensor,
        rank: torch.Tensor,
        *caches: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        meta = AttentionMetadata(slot_mapping=slot_mapping, seq_ids=seq_ids)
        return self.step(
            input_ids, positions, meta, sample_index, (temperature, top_k, top_p, noise), rank, caches
        )


class DecodeStep(StepGraph):
    """One token per sequence against the paged cache, then sample the next."""

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        slot_mapping: torch.Tensor,
        block_tables: torch.Tensor,
        context_lens: torch.Tensor,
        temperature: torch.Tensor,
        top_k: torch.Tensor,
        top_p: torch.Tensor,
        noise: torch.Tensor,
        rank: torch.Tensor,
        *caches: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        meta = AttentionMetadata(
            slot_mapping=slot_mapping, block_tables=block_tables, context_lens=context_lens
        )
        return self.step(input_ids, positions, meta, None, (temperature, top_k, top_p, noise), rank, caches)


def example_inputs(
    spec: GraphSpec, config: RunnerConfig, vocab_size: int, kv_caches: list[torch.Tensor]
) -> tuple[torch.Tensor, ...]:
    """Inputs of the graph's exact shapes and dtypes (values are placeholders) for capture."""
    i64 = dict(dtype=torch.int64)
    if spec.phase == PREFILL:
        (tokens,) = spec.bucket
        rows = config.max_num_seqs
        head = (
            torch.zeros(tokens, **i64),
            torch.arange(tokens),
            torch.zeros(tokens, **i64),
            torch.arange(tokens),
            torch.zeros(rows, **i64),
        )
    else:
        rows, context = spec.bucket
        head = (
            torch.zeros(rows, **i64),
            torch.zeros(rows, **i64),
            torch.zeros(rows, **i64),
            torch.zeros(rows, context // config.block_size, **i64),
            torch.ones(rows, **i64),
        )
    sampling = (torch.zeros(rows), torch.zeros(rows, **i64), torch.ones(rows), torch.zeros(rows, vocab_size))
    return (*head, *sampling, torch.tensor(0, **i64), *kv_caches)


def flat_caches(spec: KVSpec, num_blocks: int) -> list[torch.Tensor]:
    """The KV caches in graph-input order: k0, v0, k1, v1, …"""
    caches = allocate_kv_cache(spec, num_blocks)
    return [t for layer in spec.layers for t in caches[layer.name]]
