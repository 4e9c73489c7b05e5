"""One model per rank for a whole evaluation: a scoring and generation service over the runner.

lm_eval hands a model thousands of requests; building the model (spawning ranks, loading weights) costs
seconds, so it happens once. ``RankPool`` starts ``tp * ep`` ranks through ``run_on_ranks`` (world size 1
runs in-process), each rank builds a ``RankWorker`` and then serves commands in lockstep until closed:

- ``score``: teacher-forced log-probs of target tokens, many sequences per step. The sequences are packed
  flat into one eager prefill over the paged KV cache (each sequence owns its own blocks, ``seq_ids``
  keep them apart), exactly as the runner prefills prompts; the logits are read at the target positions
  only. The compiled graphs sample inside and return token ids, not logits, so scoring runs eagerly.
- ``generate``: the runner (compiled graphs when the artifact cache holds them for this configuration,
  unless ``eager``), with stop strings ended as soon as they appear in the decoded text.
"""

from __future__ import annotations

import atexit
import math
import queue
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..attention import AttentionMetadata
from ..errors import ConfigError, InputError
from ..kv_cache import slot_mapping
from ..parallel.launch import rank_context, run_on_ranks
from ..parallel.state import ParallelLayout, get_parallel_layout
from ..runner.config import RunnerConfig, SamplingParams
from ..runner.engine import Runner
from ..runner.score import check_token_ids


@dataclass(frozen=True)
class ModelSpec:
    """What every rank builds: the checkpoint at a dtype, its runner settings, and where graphs live."""

    checkpoint_dir: str
    runner: RunnerConfig
    dtype: str = "float32"
    tp: int = 1
    ep: int = 1
    eager: bool = False
    cache_dir: str | None = None
    # Scoring packs sequences into one prefill up to this many tokens (the prefill attention mask is
    # dense over the step's tokens, so a larger step is not cheaper per token).
    max_batched_tokens: int | None = None
    # At most this many sequences per scoring step (None: as many as the KV cache's blocks hold).
    max_batch_seqs: int | None = None

    @property
    def layout(self) -> ParallelLayout:
        return ParallelLayout(tp=self.tp, ep=self.ep)

    @property
    def batched_tokens(self) -> int:
        return max(self.max_batched_tokens or self.runner.max_model_len, self.runner.max_model_len)


@dataclass(frozen=True)
class ScoreRequest:
    """``input_ids`` fed to the model; the logits at its last ``len(targets)`` positions predict
    ``targets`` (lm_eval's causal convention: ``input_ids = (context + continuation)[:-1]``)."""

    input_ids: tuple[int, ...]
    targets: tuple[int, ...]


@dataclass(frozen=True)
class Score:
    logprobs: tuple[float, ...]  # one per target token
    greedy: bool  # every target token is the argmax at its position

    @property
    def total(self) -> float:
        return math.fsum(self.logprobs)


def eos_token_ids(checkpoint_dir: str) -> list[int]:
    """The generation config's EOS ids (else config.json's), as the runner's ``generate`` uses."""
    from transformers import GenerationConfig

    from ..hf_config import read_config_dict

    try:
        eos = GenerationConfig.from_pretrained(checkpoint_dir).eos_token_id
    except OSError:
        eos = read_config_dict(checkpoint_dir).get("eos_token_id")
    return [] if eos is None else [eos] if isinstance(eos, int) else list(eos)


class StopStringRunner(Runner):
    """The runner, plus stop strings: a sequence finishes (``stop``) once its decoded text holds one.

    The caller still cuts the text at the first stop string, so output never depends on this early
    exit; it only saves the decode steps after the stop.
    """

    def __init__(self, *args: Any, tokenizer: Any = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.tokenizer = tokenizer
        self.stop_strings: list[str] = []
        self.stopped_early = 0

    def generate_until(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams, stop: Sequence[str]
    ) -> list[list[int]]:
        self.stop_strings = [s for s in stop if s]
        self.stopped_early = 0
        try:
            return [g.token_ids for g in self.generate(prompts, params)]
        finally:
            self.stop_strings = []

    def _append(self, seqs, *args: Any, **kwargs: Any) -> None:
        # The runner's per-step hook (private: only its first argument, the step's sequences, is used).
        super()._append(seqs, *args, **kwargs)
        if not self.stop_strings or self.tokenizer is None:
            return
        for s in seqs:
            if s.result.finish_reason is None:
                text = self.tokenizer.decode(s.result.token_ids, skip_special_tokens=True)
                if any(stop in text for stop in self.stop_strings):
                    s.result.finish_reason = "stop"
                    self.stopped_early += 1


class RankWorker:
    """One rank's model, runner and KV cache; every rank calls the same methods in the same order."""

    def __init__(self, spec: ModelSpec, rank: int):
        from transformers import AutoTokenizer

        from ..causal_lm import build_model
        from ..compile import CompileTarget, runner_graphs

        layout = get_parallel_layout()
        target = CompileTarget(spec.checkpoint_dir, spec.runner, tp=layout.tp, dtype=spec.dtype, ep=layout.ep)
        self.spec = spec
        self.model = build_model(spec.checkpoint_dir, target.neuron_config(), progress=rank == 0)
        self.graphs = runner_graphs(target, self.model, spec.cache_dir, eager=spec.eager)
        tokenizer = AutoTokenizer.from_pretrained(spec.checkpoint_dir, local_files_only=True)
        self.runner = StopStringRunner(
            self.model,
            spec.runner,
            rank=rank,
            eos_token_id=eos_token_ids(spec.checkpoint_dir),
            graphs=self.graphs,
            tokenizer=tokenizer,
        )
        self.rank = torch.tensor(rank, dtype=torch.int64)
        kv_layers = self.model.get_kv_spec().layers
        caches = self.runner.caches  # the runner's paged cache, k0, v0, k1, v1, ... (shared, not copied)
        self.kv = {layer.name: [caches[2 * i], caches[2 * i + 1]] for i, layer in enumerate(kv_layers)}
        self.block_size = spec.runner.block_size
        self.free_blocks = spec.runner.num_blocks - 1  # block 0 is the null block

    def info(self) -> dict[str, Any]:
        return {
            "compiled_graphs": len(self.graphs),
            "graph_steps": sum(1 for s in self.runner.steps if s in self.graphs),
            "steps": len(self.runner.steps),
        }

    # -- scoring ----------------------------------------------------------------------------------

    def _batches(self, requests: Sequence[ScoreRequest]) -> list[list[int]]:
        """Consecutive request indices packed under the token, block and sequence limits."""
        limit_tokens, limit_seqs = self.spec.batched_tokens, self.spec.max_batch_seqs
        batches: list[list[int]] = []
        current: list[int] = []
        tokens = blocks = 0
        for i, r in enumerate(requests):
            n = len(r.input_ids)
            need = math.ceil(n / self.block_size)
            full = (
                tokens + n > limit_tokens
                or blocks + need > self.free_blocks
                or (limit_seqs is not None and len(current) >= limit_seqs)
            )
            if current and full:
                batches.append(current)
                current, tokens, blocks = [], 0, 0
            current.append(i)
            tokens += n
            blocks += need
        if current:
            batches.append(current)
        return batches

    @torch.inference_mode()
    def score(self, requests: Sequence[ScoreRequest]) -> list[Score]:
        max_len = self.spec.runner.max_model_len
        for r in requests:
            if not r.targets or len(r.targets) > len(r.input_ids):
                raise InputError(
                    f"score: {len(r.targets)} target tokens for {len(r.input_ids)} input tokens "
                    "(need 1 ≤ targets ≤ inputs)"
                )
            if len(r.input_ids) > max_len:
                raise InputError(f"score: {len(r.input_ids)} input tokens, more than max_model_len={max_len}")
            check_token_ids(r.input_ids, self.model.vocab_size)
            check_token_ids(r.targets, self.model.vocab_size)
        results: list[Score] = []
        for batch in self._batches(requests):
            results += self._score_step([requests[i] for i in batch])
        return results

    def _score_step(self, batch: list[ScoreRequest]) -> list[Score]:
        ids, positions, seq_ids, slots, rows = [], [], [], [], []
        next_block, offset = 1, 0
        for i, r in enumerate(batch):
            n = len(r.input_ids)
            need = math.ceil(n / self.block_size)
            blocks = torch.arange(next_block, next_block + need)
            next_block += need
            pos = torch.arange(n)
            ids.append(torch.tensor(r.input_ids, dtype=torch.int64))
            positions.append(pos)
            seq_ids.append(torch.full((n,), i, dtype=torch.int64))
            slots.append(slot_mapping(blocks, pos, self.block_size))
            rows.append(torch.arange(offset + n - len(r.targets), offset + n))
            offset += n
        meta = AttentionMetadata(slot_mapping=torch.cat(slots), seq_ids=torch.cat(seq_ids))
        self.model.bind_kv_cache(self.kv)
        hidden = self.model.forward(torch.cat(ids), torch.cat(positions), meta, self.rank)
        logits = self.model.compute_logits(hidden[torch.cat(rows)]).float()
        logprobs = torch.log_softmax(logits, dim=-1)
        greedy = logits.argmax(dim=-1)
        targets = torch.tensor([t for r in batch for t in r.targets], dtype=torch.int64)
        picked = logprobs.gather(1, targets[:, None])[:, 0].double().tolist()
        hits = (greedy == targets).tolist()
        out, start = [], 0
        for r in batch:
            end = start + len(r.targets)
            out.append(Score(tuple(picked[start:end]), all(hits[start:end])))
            start = end
        return out

    # -- generation -------------------------------------------------------------------------------

    def generate(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams, stop: Sequence[str]
    ) -> list[list[int]]:
        return self.runner.generate_until(prompts, params, stop)


# -- the rank pool ---------------------------------------------------------------------------------


def _build_local(rank: int, world_size: int, spec: ModelSpec) -> RankWorker:
    return RankWorker(spec, rank)


def _serve(rank: int, world_size: int, spec: ModelSpec, inboxes: list, outbox: Any) -> None:
    worker = RankWorker(spec, rank)
    if rank == 0:
        outbox.put(("ready", None))
    while (message := inboxes[rank].get()) is not None:
        method, args = message
        result = getattr(worker, method)(*args)
        if rank == 0:
            outbox.put(("ok", result))


class RankPool:
    """``tp * ep`` ranks that keep their model for the pool's life: ``call(method, *args)`` runs a
    ``RankWorker`` method on every rank and returns rank 0's result. World size 1 runs in-process."""

    def __init__(self, spec: ModelSpec):
        self.spec = spec
        self.world_size = spec.layout.world_size
        self._closed = False
        if self.world_size == 1:
            self._local: RankWorker | None = run_on_ranks(_build_local, spec.layout, spec)
            return
        self._local = None
        ctx = rank_context()
        self._inboxes = [ctx.Queue() for _ in range(self.world_size)]
        self._outbox = ctx.Queue()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="trnmodels-rank-pool", daemon=True)
        self._thread.start()
        atexit.register(self.close)
        self._receive()  # "ready": every rank has built its model

    def _run(self) -> None:
        try:
            run_on_ranks(_serve, self.spec.layout, self.spec, self._inboxes, self._outbox)
        except BaseException as e:  # handed to the caller by _receive
            self._error = e

    def _receive(self) -> Any:
        while True:
            try:
                _, result = self._outbox.get(timeout=0.5)
                return result
            except queue.Empty:
                if not self._thread.is_alive():
                    self._closed = True
                    if self._error is not None:
                        raise self._error from None
                    raise ConfigError("the model ranks exited before answering") from None

    def call(self, method: str, *args: Any) -> Any:
        if self._closed:
            raise ConfigError("the model ranks are closed")
        if self._local is not None:
            return getattr(self._local, method)(*args)
        for inbox in self._inboxes:
            inbox.put((method, args))
        return self._receive()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._local is not None:
            self._local = None
            return
        if self._thread.is_alive():
            for inbox in self._inboxes:
                inbox.put(None)
            self._thread.join()
