"""The CPU model runner: drives any LLM plugin the way a device runner does.

Each step is either a prefill (several waiting prompts, flat and padded to a token bucket) or a decode
(one token for each running sequence, padded to a batch bucket and a context-length bucket); never
both. Every step calls one static-shaped graph, compiled or eager, that samples inside and returns
token ids. Padding tokens write only to the null block, so they never touch a live cache slot.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ..causal_lm import CausalLM
from ..errors import ConfigError, InputError
from ..finite import non_finite_weight
from ..kv_cache import NULL_BLOCK, BlockAllocator, null_slots, slot_mapping
from ..ops.sampling import gumbel_noise
from .config import RunnerConfig, SamplingParams, pick_bucket
from .graphs import DECODE, PREFILL, DecodeStep, GraphSpec, PrefillStep, flat_caches
from .score import NonFiniteLogitsError, check_token_ids

GraphFn = Callable[..., tuple[torch.Tensor, torch.Tensor]]
GREEDY = SamplingParams()


def request_seed(seed: int, index: int) -> int:
    """The generator seed of request ``index`` of a batch sampled with ``seed``: ``(seed, index)`` hashed
    into 64 bits, so every seed in ``[0, 2**64 - 1]`` and every index give a seed torch accepts, and a
    request's draws depend only on the seed and its own index, not on the rest of the batch."""
    data = seed.to_bytes(8, "little") + index.to_bytes(8, "little")
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


@dataclass
class Generation:
    """One request's result: the generated ids and why it stopped (``stop`` or ``length``)."""

    prompt_token_ids: list[int]
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None


@dataclass
class _Sequence:
    index: int
    prompt: list[int]
    params: SamplingParams
    generator: torch.Generator | None
    blocks: list[int]
    result: Generation

    @property
    def length(self) -> int:
        return len(self.prompt) + len(self.result.token_ids)

    @property
    def finished(self) -> bool:
        return self.result.finish_reason is not None


def check_prompt(index: int, prompt: Sequence[int], max_model_len: int, vocab_size: int) -> None:
    if not prompt:
        raise InputError(f"prompt {index} is empty")
    if len(prompt) > max_model_len:
        raise InputError(f"prompt {index} has {len(prompt)} tokens, more than max_model_len={max_model_len}")
    check_token_ids(prompt, vocab_size)


def _padded(values: list[Any], rows: int, fill: Any, dtype: torch.dtype) -> torch.Tensor:
    """``values`` and ``fill`` for each padding row up to ``rows``, as one tensor of ``dtype``."""
    return torch.tensor(values + [fill] * (rows - len(values)), dtype=dtype)


class Runner:
    """Generates for batches of prompts on one rank (every TP rank runs the same loop in lockstep).

    ``graphs`` maps a ``GraphSpec`` to a compiled callable; specs not in it run eagerly.
    """

    def __init__(
        self,
        model: CausalLM,
        config: RunnerConfig,
        *,
        rank: int = 0,
        eos_token_id: int | Sequence[int] | None = None,
        graphs: dict[GraphSpec, GraphFn] | None = None,
    ):
        spec = model.get_kv_spec()
        if spec.block_size != config.block_size:
            raise ConfigError(
                f"block_size: the model caches {spec.block_size} tokens per block, the runner {config.block_size}"
            )
        self.model = model
        self.config = config
        self.vocab_size = model.vocab_size
        self.rank = torch.tensor(rank, dtype=torch.int64)
        eos = (
            []
            if eos_token_id is None
            else [eos_token_id]
            if isinstance(eos_token_id, int)
            else list(eos_token_id)
        )
        self.eos_token_ids = set(eos)
        self.caches = flat_caches(spec, config.num_blocks)
        self.allocator = BlockAllocator(config.num_blocks)
        self.eager = {PREFILL: PrefillStep(model), DECODE: DecodeStep(model)}
        self.graphs = dict(graphs or {})
        self.steps: list[GraphSpec] = []  # which graph every step ran, for tests and stats
        self._no_noise: dict[int, torch.Tensor] = {}  # rows -> the zero noise of an all-greedy step

    # -- public API -------------------------------------------------------------------------------

    @torch.inference_mode()
    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams | Sequence[SamplingParams] = GREEDY,
    ) -> list[Generation]:
        if isinstance(params, SamplingParams):
            params = [params] * len(prompts)
        if len(params) != len(prompts):
            raise InputError(f"got {len(prompts)} prompts but {len(params)} sampling params")
        seqs = [self._admit(i, list(p), sp) for i, (p, sp) in enumerate(zip(prompts, params, strict=True))]
        waiting, running = deque(seqs), []
        try:
            while waiting or running:
                if waiting and len(running) < self.config.max_num_seqs:
                    batch = self._take_prefill_batch(waiting, self.config.max_num_seqs - len(running))
                    self._prefill(batch)
                    running += batch
                else:
                    self._decode(running)
                for s in running:
                    if s.finished and s.blocks:
                        self.allocator.free(s.blocks)
                        s.blocks = []
                running = [s for s in running if not s.finished]
        finally:
            for s in seqs:
                if s.blocks:
                    self.allocator.free(s.blocks)
                    s.blocks = []
        return [s.result for s in seqs]

    # -- scheduling -------------------------------------------------------------------------------

    def _admit(self, index: int, prompt: list[int], params: SamplingParams) -> _Sequence:
        check_prompt(index, prompt, self.config.max_model_len, self.vocab_size)
        generator = None
        if params.temperature > 0:
            seed = params.seed if params.seed is not None else random.randrange(1 << 64)
            generator = torch.Generator().manual_seed(request_seed(seed, index))
        return _Sequence(index, prompt, params, generator, [], Generation(prompt))

    def _take_prefill_batch(self, waiting: deque[_Sequence], free_slots: int) -> list[_Sequence]:
        budget = self.config.num_batched_tokens_buckets[-1]
        batch: list[_Sequence] = []
        tokens = 0
        while waiting and len(batch) < free_slots and tokens + len(waiting[0].prompt) <= budget:
            seq = waiting.popleft()
            final_len = min(len(seq.prompt) + seq.params.max_new_tokens, self.config.max_model_len)
            seq.blocks = self.allocator.allocate(math.ceil(final_len / self.config.block_size))
            tokens += len(seq.prompt)
            batch.append(seq)
        return batch

    def _run(self, spec: GraphSpec, *inputs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(token ids, finite)``: ``finite[i]`` says row i's logits were all finite."""
        self.steps.append(spec)
        fn = self.graphs.get(spec) or self.eager[spec.phase]
        tokens, finite = fn(*inputs, self.rank, *self.caches)
        return tokens, finite

    def _sampling_inputs(self, seqs: list[_Sequence], rows: int) -> tuple[torch.Tensor, ...]:
        temperature = _padded([s.params.temperature for s in seqs], rows, 0.0, torch.float32)
        top_k = _padded([s.params.top_k for s in seqs], rows, 0, torch.int64)
        top_p = _padded([s.params.top_p for s in seqs], rows, 1.0, torch.float32)
        if all(s.generator is None for s in seqs):
            # Greedy rows add no noise; no step writes its inputs, so one zero tensor serves every step.
            if rows not in self._no_noise:
                self._no_noise[rows] = torch.zeros(rows, self.vocab_size)
            return temperature, top_k, top_p, self._no_noise[rows]
        noise = torch.zeros(rows, self.vocab_size)
        for i, s in enumerate(seqs):
            if s.generator is not None:
                noise[i] = gumbel_noise(self.vocab_size, s.generator)
        return temperature, top_k, top_p, noise

    def _prefill(self, batch: list[_Sequence]) -> None:
        total = sum(len(s.prompt) for s in batch)
        bucket = pick_bucket(self.config.num_batched_tokens_buckets, total)
        pad = bucket - total
        ids, positions, seq_ids, slots, last = [], [], [], [], []
        for i, s in enumerate(batch):
            n = len(s.prompt)
            pos = torch.arange(n)
            ids.append(torch.tensor(s.prompt))
            positions.append(pos)
            seq_ids.append(torch.full((n,), i))
            slots.append(slot_mapping(torch.tensor(s.blocks), pos, self.config.block_size))
            last.append(sum(len(t) for t in ids) - 1)
        zeros = torch.zeros(pad, dtype=torch.int64)
        rows = self.config.max_num_seqs
        sample_index = torch.zeros(rows, dtype=torch.int64)
        sample_index[: len(batch)] = torch.tensor(last)
        tokens, finite = self._run(
            GraphSpec(PREFILL, (bucket,)),
            torch.cat([*ids, zeros]),
            torch.cat([*positions, zeros]),
            torch.cat([*seq_ids, torch.full((pad,), -1)]),
            torch.cat([*slots, null_slots(pad, self.config.block_size)]),
            sample_index,
            *self._sampling_inputs(batch, rows),
        )
        self._append(batch, tokens, finite)

    def _decode(self, seqs: list[_Sequence]) -> None:
        # Built from Python lists, one tensor per input: a step's host work is a few tensor calls at any
        # batch, not a few per sequence (about 10 µs each, against a batch-1 step of about 10 ms).
        block_size = self.config.block_size
        rows = pick_bucket(self.config.num_seqs_buckets, len(seqs))
        context = pick_bucket(self.config.context_len_buckets, max(s.length for s in seqs))
        pad = rows - len(seqs)
        width = context // block_size
        # Blocks reserved for later tokens lie past this bucket's context and are not needed yet.
        tables = [s.blocks[:width] for s in seqs]
        positions = [s.length - 1 for s in seqs]
        slots = [slot_mapping(table, p, block_size) for table, p in zip(tables, positions, strict=True)]
        positions_tensor = _padded(positions, rows, 0, torch.int64)
        tokens, finite = self._run(
            GraphSpec(DECODE, (rows, context)),
            _padded([s.result.token_ids[-1] for s in seqs], rows, 0, torch.int64),
            positions_tensor,
            torch.cat([torch.tensor(slots, dtype=torch.int64), null_slots(pad, block_size)]),
            _padded(
                [t + [NULL_BLOCK] * (width - len(t)) for t in tables], rows, [NULL_BLOCK] * width, torch.int64
            ),
            positions_tensor + 1,
            *self._sampling_inputs(seqs, rows),
        )
        self._append(seqs, tokens, finite)

    def _append(self, seqs: list[_Sequence], tokens: torch.Tensor, finite: torch.Tensor) -> None:
        # A token sampled from NaN/inf logits is noise (argmax of NaN is 0): stop, naming where it happened.
        for s, ok in zip(seqs, finite.tolist(), strict=False):
            if not ok:
                raise NonFiniteLogitsError(
                    f"prompt {s.index}, generation step {len(s.result.token_ids)}: logits at position "
                    f"{s.length - 1} are not finite (NaN or inf); the checkpoint's weights, or the dtype's "
                    "range, give non-finite values" + non_finite_weight(self.model)
                )
        for s, token in zip(seqs, tokens.tolist(), strict=False):
            s.result.token_ids.append(token)
            if not s.params.ignore_eos and (token in self.eos_token_ids or token in s.params.stop_token_ids):
                s.result.finish_reason = "stop"
            elif len(s.result.token_ids) >= s.params.max_new_tokens or s.length >= self.config.max_model_len:
                s.result.finish_reason = "length"
