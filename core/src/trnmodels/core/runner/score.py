"""Teacher-forced scoring: the logits at every position of a token sequence, through prefill then decode.

The first ``prefill_len`` tokens run as one prefill; each later token runs as its own decode step
against the paged cache, exactly as serving would. This is what ``trnmodels logits`` and the model-level
accuracy tests run.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from ..attention import AttentionMetadata
from ..causal_lm import CausalLM
from ..errors import InputError, NonFiniteOutputError
from ..finite import non_finite_weight
from ..kv_cache import allocate_kv_cache, read_sequence_kv, slot_mapping
from ..ops.route_trace import RouteTrace, tracing_routes
from ..parallel.launch import run_on_ranks
from ..parallel.state import ParallelLayout, get_parallel_layout


class NonFiniteLogitsError(NonFiniteOutputError):
    """The model produced NaN or inf logits (bad weights, or values past the dtype's range)."""


def check_finite_logits(logits: torch.Tensor, model: torch.nn.Module | None = None) -> None:
    """Refuse ``[T, vocab]`` logits with a non-finite value, naming the first such position (and, given
    the model, the first weight holding NaN or inf)."""
    bad = (~torch.isfinite(logits).all(dim=-1)).nonzero()
    if len(bad):
        raise NonFiniteLogitsError(
            f"logits at position {int(bad[0])} are not finite (NaN or inf) ({len(bad)} of {len(logits)} "
            "positions); the checkpoint's weights, or the dtype's range, give non-finite values"
            + (non_finite_weight(model) if model is not None else "")
        )


def check_sequence_fits(hf_config, num_tokens: int) -> None:
    """A sequence longer than ``max_position_embeddings`` is refused (as ``generate`` refuses such a
    ``max_model_len``): positions past it were never trained, and some rope scalings are undefined there."""
    text = hf_config.get_text_config()
    limit = getattr(text, "max_position_embeddings", None)
    if limit and num_tokens > limit:
        raise InputError(f"{num_tokens} token ids exceed the model's max_position_embeddings={limit}")


def check_token_ids(token_ids: Sequence[int], vocab_size: int) -> None:
    if not token_ids:
        raise InputError("token ids: need at least one id")
    for i, t in enumerate(token_ids):
        if not 0 <= t < vocab_size:
            raise InputError(f"token ids: id {t} at position {i} is out of range for vocab size {vocab_size}")


@torch.no_grad()
def teacher_forced_logits(
    model: CausalLM,
    token_ids: Sequence[int],
    prefill_len: int | None = None,
    *,
    rank: int = 0,
    return_kv: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, dict[str, tuple[torch.Tensor, torch.Tensor]]]:
    """Float32 logits ``[T, vocab]``: position i holds the prediction after ``token_ids[: i + 1]``.

    With ``return_kv`` also this rank's cached K/V per layer, ``[kv_heads, T, head_dim]`` each.
    """
    check_token_ids(token_ids, model.vocab_size)
    total = len(token_ids)
    prefill_len = total if prefill_len is None else prefill_len
    if not 1 <= prefill_len <= total:
        raise InputError(f"prefill length: expected 1..{total} (the number of token ids), got {prefill_len}")
    spec = model.get_kv_spec()
    num_seq_blocks = math.ceil(total / spec.block_size)
    # Block 0 is the null block; this sequence owns blocks 1..n.
    caches = allocate_kv_cache(spec, num_seq_blocks + 1)
    model.bind_kv_cache(caches)
    block_table = torch.arange(1, num_seq_blocks + 1)
    ids = torch.tensor(list(token_ids), dtype=torch.int64)
    positions = torch.arange(total)
    rank_t = torch.tensor(rank, dtype=torch.int64)

    prefill = AttentionMetadata(
        slot_mapping=slot_mapping(block_table, positions[:prefill_len], spec.block_size),
        seq_ids=torch.zeros(prefill_len, dtype=torch.int64),
    )
    hidden = model.forward(ids[:prefill_len], positions[:prefill_len], prefill, rank_t)
    logits = [model.compute_logits(hidden)]
    for p in range(prefill_len, total):
        step = AttentionMetadata(
            slot_mapping=slot_mapping(block_table, positions[p : p + 1], spec.block_size),
            block_tables=block_table[None],
            context_lens=torch.tensor([p + 1]),
        )
        hidden = model.forward(ids[p : p + 1], positions[p : p + 1], step, rank_t)
        logits.append(model.compute_logits(hidden))
    logits = torch.cat(logits).float()
    if not return_kv:
        return logits
    kv = {
        name: (
            read_sequence_kv(k, block_table, total).float(),
            read_sequence_kv(v, block_table, total).float(),
        )
        for name, (k, v) in caches.items()
    }
    return logits, kv


@dataclass(frozen=True)
class ScoreJob:
    """One checkpoint and token sequence to score (see ``teacher_forced_logits``)."""

    checkpoint_dir: str
    token_ids: tuple[int, ...]
    prefill_len: int | None = None
    dtype: str = "float32"
    return_kv: bool = False
    require_finite: bool = False  # raise NonFiniteLogitsError instead of returning NaN/inf logits
    # Record the expert picks into a copy of this trace, or replay them (``ops.route_trace``); the job's
    # result is then ``(result, trace)`` with the copy rank 0 filled.
    route_trace: RouteTrace | None = None


def _score_on_rank(rank: int, world_size: int, jobs: list[ScoreJob]) -> list:
    from ..causal_lm import build_model
    from ..runtime_config import NeuronConfig

    layout = get_parallel_layout()
    results = []
    for job in jobs:
        config = NeuronConfig(tp_degree=layout.tp, ep_degree=layout.ep, dtype=job.dtype)
        model = build_model(job.checkpoint_dir, config, progress=rank == 0)
        trace = copy.deepcopy(job.route_trace)
        with tracing_routes(trace):
            result = teacher_forced_logits(
                model, job.token_ids, job.prefill_len, rank=rank, return_kv=job.return_kv
            )
        if job.require_finite:
            check_finite_logits(result[0] if job.return_kv else result, model)
        results.append(result if trace is None else (result, trace))
    return results


def check_score_job(job: ScoreJob, tp: int = 1, ep: int = 1) -> None:
    """What a job's ranks would refuse, checked from the config alone (before any rank starts)."""
    from ..causal_lm import check_model_config
    from ..runtime_config import NeuronConfig

    hf_config = check_model_config(
        job.checkpoint_dir, NeuronConfig(tp_degree=tp, ep_degree=ep, dtype=job.dtype)
    )
    check_token_ids(job.token_ids, hf_config.get_text_config().vocab_size)
    check_sequence_fits(hf_config, len(job.token_ids))
    total = len(job.token_ids)
    if job.prefill_len is not None and not 1 <= job.prefill_len <= total:
        raise InputError(
            f"prefill length: expected 1..{total} (the number of token ids), got {job.prefill_len}"
        )


def score_many(jobs: Sequence[ScoreJob], tp: int = 1, ep: int = 1) -> list:
    """Score several jobs in one launch of ``tp * ep`` local ranks (spawning ranks costs seconds).

    Every job is checked against its config first, so a bad mesh or sequence fails before any rank starts.
    """
    for job in jobs:
        check_score_job(job, tp, ep)
    return run_on_ranks(_score_on_rank, ParallelLayout(tp=tp, ep=ep), list(jobs))


def score_checkpoint(
    checkpoint_dir: str | Path,
    token_ids: Sequence[int],
    prefill_len: int | None = None,
    *,
    tp: int = 1,
    ep: int = 1,
    dtype: str = "float32",
    return_kv: bool = False,
    route_trace: RouteTrace | None = None,
):
    """Build the checkpoint's model on ``tp * ep`` local ranks and score ``token_ids`` (rank 0's result;
    with ``route_trace``, ``(result, trace)`` as ``ScoreJob`` says).

    Non-finite logits raise ``NonFiniteLogitsError`` naming the first bad position: they are never returned.
    """
    job = ScoreJob(str(checkpoint_dir), tuple(token_ids), prefill_len, dtype, return_kv, True, route_trace)
    return score_many([job], tp, ep)[0]
