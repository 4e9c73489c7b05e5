"""The inputs the runner hands a decode step, against values worked out by hand."""

from __future__ import annotations

import torch

from trnmodels.core.causal_lm import build_model
from trnmodels.core.compile import CompileTarget
from trnmodels.core.runner.config import SamplingParams
from trnmodels.core.runner.engine import Runner
from trnmodels.core.testing.conformance import RUNNER  # block_size 8, batch buckets (2, 4), context (32, 64)


def _decode_inputs(runner: Runner, seqs: list) -> tuple[torch.Tensor, ...]:
    captured: list[tuple[torch.Tensor, ...]] = []

    def run(spec, *inputs):
        captured.append((spec, *inputs))
        rows = spec.bucket[0]
        return torch.zeros(rows, dtype=torch.int64), torch.ones(rows, dtype=torch.bool)

    runner._run = run
    runner._decode(seqs)
    return captured[0]


def test_decode_inputs_of_a_padded_batch_across_block_boundaries(llama_checkpoint):
    model = build_model(llama_checkpoint, CompileTarget(str(llama_checkpoint), RUNNER).neuron_config())
    runner = Runner(model, RUNNER)
    params = [SamplingParams(), SamplingParams(temperature=1, top_k=5, top_p=0.5, seed=3), SamplingParams()]
    prompts = [list(range(3, 3 + n)) for n in (8, 16, 34)]
    seqs = [runner._admit(i, p, sp) for i, (p, sp) in enumerate(zip(prompts, params, strict=True))]
    seqs[0].blocks, seqs[1].blocks, seqs[2].blocks = [7, 2], [4, 9, 1], [3, 5, 6, 8, 10, 11]
    for s, token in zip(seqs, (40, 41, 42), strict=True):
        s.result.token_ids.append(token)  # lengths 9, 17, 35: the first two open a new block

    spec, ids, positions, slots, tables, context_lens, temperature, top_k, top_p, noise, *_ = _decode_inputs(
        runner, seqs
    )
    # 3 sequences pad to the batch bucket 4; the longest (35 tokens) needs the 64-token context bucket.
    assert spec.bucket == (4, 64)
    assert ids.tolist() == [40, 41, 42, 0]
    assert positions.tolist() == [8, 16, 34, 0]
    assert context_lens.tolist() == [9, 17, 35, 1]
    # Slot = block of the position × 8 + offset; the padding row writes slot 0 of the null block 0.
    assert slots.tolist() == [2 * 8 + 0, 1 * 8 + 0, 10 * 8 + 2, 0]
    assert tables.tolist() == [
        [7, 2, 0, 0, 0, 0, 0, 0],
        [4, 9, 1, 0, 0, 0, 0, 0],
        [3, 5, 6, 8, 10, 11, 0, 0],
        [0] * 8,
    ]
    assert [t.dtype for t in (ids, positions, slots, tables, context_lens, top_k)] == [torch.int64] * 6
    assert temperature.tolist() == [0.0, 1.0, 0.0, 0.0] and temperature.dtype == torch.float32
    assert top_k.tolist() == [0, 5, 0, 0]
    assert top_p.tolist() == [1.0, 0.5, 1.0, 1.0] and top_p.dtype == torch.float32
    assert noise.shape == (4, model.vocab_size)
    assert noise[1].abs().sum() > 0 and noise[[0, 2, 3]].abs().sum() == 0

    # An all-greedy step: zero noise, and integer temperatures still arrive as float32.
    for s in seqs:
        s.params, s.generator = SamplingParams(temperature=0, top_p=1), None
    *_, temperature, _, top_p, noise = _decode_inputs(runner, seqs)
    assert temperature.dtype == top_p.dtype == torch.float32
    assert noise.shape == (4, model.vocab_size) and noise.abs().sum() == 0
