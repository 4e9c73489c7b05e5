"""The runner end to end beyond the conformance suite: EOS, seeded sampling, the compile cache, bad input."""

from __future__ import annotations

import pytest
import transformers

from trnmodels.core.accuracy import greedy_teacher_sequence
from trnmodels.core.causal_lm import build_model
from trnmodels.core.compile import CompileTarget, compile_all, load_compiled_graphs
from trnmodels.core.compile import driver as compile_driver
from trnmodels.core.errors import ConfigError, InputError
from trnmodels.core.runner.config import RunnerConfig, SamplingParams
from trnmodels.core.runner.engine import Runner
from trnmodels.core.runner.score import NonFiniteLogitsError
from trnmodels.core.testing.conformance import RUNNER


def hf_greedy(hf: transformers.PreTrainedModel, prompt: list[int], new_tokens: int) -> list[int]:
    return greedy_teacher_sequence(hf, prompt, new_tokens)[len(prompt) :]


def test_sequences_finish_at_different_steps_on_eos_and_max_tokens(make_checkpoint):
    ckpt, hf = make_checkpoint(seed=3)
    model = build_model(ckpt, CompileTarget(str(ckpt), RUNNER).neuron_config(), progress=False)
    prompts = [[5, 6, 7], [8, 9, 10, 11]]
    reference = [hf_greedy(hf, p, 8) for p in prompts]
    eos = reference[0][2]  # the first prompt's third token acts as EOS
    runner = Runner(model, RUNNER, eos_token_id=eos)
    results = runner.generate(prompts, [SamplingParams(max_new_tokens=8), SamplingParams(max_new_tokens=5)])
    assert results[0].token_ids == reference[0][: reference[0].index(eos) + 1]
    assert results[0].finish_reason == "stop"
    expected_second = reference[1][:5]
    if eos in expected_second:
        expected_second = expected_second[: expected_second.index(eos) + 1]
    assert results[1].token_ids == expected_second
    assert runner.allocator.num_free == RUNNER.num_blocks - 1  # every block returned, null block kept


def test_seeded_sampling_is_reproducible(make_checkpoint):
    ckpt, _ = make_checkpoint(seed=4)
    model = build_model(ckpt, CompileTarget(str(ckpt), RUNNER).neuron_config(), progress=False)
    runner = Runner(model, RUNNER)
    prompts = [[1, 2, 3], [4, 5, 6, 7, 8]]
    params = SamplingParams(max_new_tokens=10, temperature=1.0, top_k=40, top_p=0.95, seed=1234)
    first = [r.token_ids for r in runner.generate(prompts, params)]
    again = [r.token_ids for r in runner.generate(prompts, params)]
    other = [r.token_ids for r in runner.generate(prompts, SamplingParams(**{**params.__dict__, "seed": 99}))]
    greedy = [r.token_ids for r in runner.generate(prompts, SamplingParams(max_new_tokens=10))]
    assert first == again
    assert first != other and first != greedy
    # Batching does not change a request's draws: each request owns its generator.
    alone = runner.generate([prompts[0]], params)[0].token_ids
    assert alone == first[0]


def test_sampling_accepts_any_64_bit_seed_and_none(make_checkpoint):
    """Issue 17: seeds past 2**63 (and the random seed drawn without one) overflowed the generator seed."""
    ckpt, _ = make_checkpoint(seed=4)
    model = build_model(ckpt, CompileTarget(str(ckpt), RUNNER).neuron_config(), progress=False)
    runner = Runner(model, RUNNER)
    prompts = [[1, 2, 3], [4, 5, 6, 7, 8]]
    unseeded = SamplingParams(max_new_tokens=3, temperature=1.0, ignore_eos=True)
    assert [len(r.token_ids) for r in runner.generate(prompts, unseeded)] == [3, 3]
    draws = {}
    for seed in (2**63 - 1, 2**63, 2**64 - 1):
        params = SamplingParams(max_new_tokens=6, temperature=1.0, seed=seed, ignore_eos=True)
        draws[seed] = [r.token_ids for r in runner.generate(prompts, params)]
        assert draws[seed] == [r.token_ids for r in runner.generate(prompts, params)]
        assert runner.generate([prompts[0]], params)[0].token_ids == draws[seed][0]
    assert len({str(d) for d in draws.values()}) == 3


def _one_bucket_runner(rows: int, tokens: int) -> RunnerConfig:
    """A runner compiling two graphs: one prefill of ``tokens`` and one decode of ``rows`` sequences."""
    return RunnerConfig(
        max_num_seqs=rows, max_model_len=32, block_size=8, num_batched_tokens_buckets=(tokens,),
        num_seqs_buckets=(rows,), context_len_buckets=(32,),
    )  # fmt: skip


@pytest.mark.slow  # AOT compiles
def test_compiled_graphs_match_eager_and_a_second_compile_only_hits(make_checkpoint, tmp_path, monkeypatch):
    ckpt, _ = make_checkpoint(seed=5)
    runner_cfg = _one_bucket_runner(rows=2, tokens=32)
    target = CompileTarget(str(ckpt), runner_cfg)
    cache = str(tmp_path / "cache")
    cold = compile_all(target, cache, jobs=2)
    assert [(r.name, r.cache) for r in cold] == [("prefill_32", "miss"), ("decode_2x32", "miss")]

    def no_compiling(*args, **kwargs):
        raise AssertionError("a warm compile must not compile anything")

    monkeypatch.setattr(compile_driver, "_compile_to", no_compiling)
    warm = compile_all(target, cache, jobs=2)
    assert [r.cache for r in warm] == ["hit", "hit"] and [r.path for r in warm] == [r.path for r in cold]

    model = build_model(ckpt, target.neuron_config(), progress=False)
    graphs = load_compiled_graphs(target, model, cache)
    assert len(graphs) == 2
    prompts = [[3, 1, 4, 1, 5], [9, 2, 6], [5, 3, 5, 8, 9, 7, 9]]
    params = SamplingParams(max_new_tokens=9, ignore_eos=True)
    compiled = Runner(model, runner_cfg, graphs=graphs)
    eager = Runner(model, runner_cfg)
    assert [r.token_ids for r in compiled.generate(prompts, params)] == [
        r.token_ids for r in eager.generate(prompts, params)
    ]
    sampled = SamplingParams(max_new_tokens=9, temperature=0.7, top_k=20, seed=5)
    assert [r.token_ids for r in compiled.generate(prompts, sampled)] == [
        r.token_ids for r in eager.generate(prompts, sampled)
    ]


def test_bad_requests_are_refused(make_checkpoint):
    ckpt, _ = make_checkpoint(seed=6)
    model = build_model(ckpt, CompileTarget(str(ckpt), RUNNER).neuron_config(), progress=False)
    runner = Runner(model, RUNNER)
    with pytest.raises(InputError, match="prompt 1 is empty"):
        runner.generate([[1, 2], []])
    with pytest.raises(InputError, match="prompt 0 has 65 tokens, more than max_model_len=64"):
        runner.generate([[1] * 65])
    vocab = model.config.vocab_size
    with pytest.raises(InputError, match=f"id {vocab} at position 1 is out of range"):
        runner.generate([[1, vocab]])
    assert runner.allocator.num_free == RUNNER.num_blocks - 1


def test_non_finite_logits_stop_generation_naming_prompt_step_and_position(make_checkpoint):
    """Issue 17: NaN logits used to sample token 0 at every step; the step graph flags them instead."""
    ckpt, _ = make_checkpoint(seed=6)
    model = build_model(ckpt, CompileTarget(str(ckpt), RUNNER).neuron_config(), progress=False)
    compute_logits, calls = model.compute_logits, []

    def nan_in_second_row_of_third_step(hidden):
        logits = compute_logits(hidden)
        calls.append(len(calls))
        if len(calls) == 3:
            logits[1, 5] = float("nan")
        return logits

    model.compute_logits = nan_in_second_row_of_third_step
    runner = Runner(model, RUNNER)
    # Step 1 prefills both prompts, steps 2 and 3 decode: prompt 1 (4 tokens) gets NaN at its second decode.
    with pytest.raises(
        NonFiniteLogitsError, match=r"prompt 1, generation step 2: logits at position 5 are not"
    ):
        runner.generate([[1, 2, 3], [4, 5, 6, 7]], SamplingParams(max_new_tokens=4, ignore_eos=True))
    assert runner.allocator.num_free == RUNNER.num_blocks - 1


def test_runner_refuses_a_block_size_the_model_does_not_use(make_checkpoint):
    ckpt, _ = make_checkpoint(seed=6)
    model = build_model(ckpt, CompileTarget(str(ckpt), RUNNER).neuron_config(), load=False)
    with pytest.raises(ConfigError, match="block_size"):
        Runner(model, RunnerConfig(max_num_seqs=2, max_model_len=64, block_size=16))


@pytest.mark.slow  # AOT compiles
def test_compiled_graphs_of_eight_rows_match_eager(make_checkpoint, tmp_path):
    """Eight rows in a graph (the prefill's sampled rows, a batch-8 decode step) take core's few-row
    reduction for every projection and the LM head, where the eager steps run SGEMM: the same tokens.
    (Its first form returned the LM head's logits transposed from the prefill graph.)"""
    ckpt, _ = make_checkpoint(seed=6)
    runner_cfg = _one_bucket_runner(rows=8, tokens=64)
    target = CompileTarget(str(ckpt), runner_cfg)
    cache = str(tmp_path / "cache")
    compile_all(target, cache)
    model = build_model(ckpt, target.neuron_config(), progress=False)
    graphs = load_compiled_graphs(target, model, cache)
    prompts = [[3, 1, 4, 1, 5], [9, 2, 6], [5, 3, 5, 8, 9, 7, 9], [2, 7], [1, 8, 2, 8], [4]]
    params = SamplingParams(max_new_tokens=9, ignore_eos=True)
    compiled = Runner(model, runner_cfg, graphs=graphs).generate(prompts, params)
    eager = Runner(model, runner_cfg).generate(prompts, params)
    assert [r.token_ids for r in compiled] == [r.token_ids for r in eager]


def test_runners_sharing_a_model_each_step_on_their_own_caches(make_checkpoint, monkeypatch):
    """An eager step binds its runner's caches only when the layers hold others: once for a runner's
    first step, and again after another runner on the same model has stepped."""
    ckpt, hf = make_checkpoint(seed=5)
    model = build_model(ckpt, CompileTarget(str(ckpt), RUNNER).neuron_config(), progress=False)
    first, second = Runner(model, RUNNER), Runner(model, RUNNER)
    binds: list[int] = []
    bind = model.bind_kv_cache
    monkeypatch.setattr(model, "bind_kv_cache", lambda caches: binds.append(1) or bind(caches))
    prompt, params = [5, 6, 7, 8], SamplingParams(max_new_tokens=6, ignore_eos=True)
    expected = hf_greedy(hf, prompt, 6)

    assert first.generate([prompt], params)[0].token_ids == expected
    assert len(binds) == 1  # a prefill and 5 decode steps, one bind
    assert second.generate([prompt], params)[0].token_ids == expected
    layer = next(m for m in model.modules() if hasattr(m, "k_cache") and m.k_cache is not None)
    assert layer.k_cache is second.caches[0]
    assert first.generate([prompt], params)[0].token_ids == expected
    assert layer.k_cache is first.caches[0]
    assert len(binds) == 3
