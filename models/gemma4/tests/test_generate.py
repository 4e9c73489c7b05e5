"""The runner end to end: greedy parity with HF generate on a ragged batch, and compiled = eager."""

from __future__ import annotations

import random

import pytest
import transformers

from trnmodels.core.accuracy import greedy_teacher_sequence
from trnmodels.core.causal_lm import build_model
from trnmodels.core.compile import CompileTarget, compile_all, load_compiled_graphs
from trnmodels.core.runner.config import RunnerConfig, SamplingParams
from trnmodels.core.runner.engine import Runner
from trnmodels.core.runner.generate import GenerateJob, generate_token_ids
from trnmodels.core.testing.conformance import RUNNER

from .conftest import MOE, PLE_KV_SHARED
from .test_model_logits import SEED

NEW_TOKENS = 10


def ragged_prompts(vocab: int, rng: random.Random) -> list[list[int]]:
    return [[rng.randrange(vocab) for _ in range(n)] for n in (5, 17, 1, 9, 30)]


def hf_greedy(hf: transformers.PreTrainedModel, prompt: list[int], new_tokens: int) -> list[int]:
    return greedy_teacher_sequence(hf, prompt, new_tokens)[len(prompt) :]


@pytest.fixture(scope="module")
def greedy_cases(tmp_path_factory):
    from trnmodels.core.testing import save_checkpoint

    from .conftest import build_hf

    rng = random.Random(SEED)
    cases = {}
    for i, (name, overrides) in enumerate({"ple_kv_shared": PLE_KV_SHARED, "moe": MOE}.items()):
        hf = build_hf(seed=20 + i, **overrides)
        ckpt = save_checkpoint(hf, tmp_path_factory.mktemp(name))
        prompts = ragged_prompts(hf.config.text_config.vocab_size, rng)
        cases[name] = (ckpt, prompts, [hf_greedy(hf, p, NEW_TOKENS) for p in prompts])
    return cases


PARAMS = SamplingParams(max_new_tokens=NEW_TOKENS, ignore_eos=True)


@pytest.mark.parametrize("name", ["ple_kv_shared", "moe"])
def test_greedy_generation_matches_hf_on_a_ragged_batch(greedy_cases, name):
    ckpt, prompts, expected = greedy_cases[name]
    model = build_model(ckpt, CompileTarget(str(ckpt), RUNNER).neuron_config(), progress=False)
    runner = Runner(model, RUNNER)
    assert [r.token_ids for r in runner.generate(prompts, PARAMS)] == expected, f"seed={SEED}"
    # 5 prompts, 4 sequence slots: the fifth waits for a slot, so prefill and decode interleave.
    assert sum(s.name.startswith("prefill") for s in runner.steps) >= 2
    assert runner.allocator.num_free == RUNNER.num_blocks - 1


@pytest.mark.slow  # two gloo ranks
def test_greedy_generation_matches_hf_tp2(greedy_cases):
    ckpt, prompts, expected = greedy_cases["ple_kv_shared"]
    out = generate_token_ids(GenerateJob(str(ckpt), tuple(map(tuple, prompts)), PARAMS, RUNNER), tp=2)
    assert [r.token_ids for r in out["results"]] == expected, f"seed={SEED}"


def test_kv_shared_layers_own_no_cache(greedy_cases):
    ckpt, _, _ = greedy_cases["ple_kv_shared"]
    model = build_model(ckpt, CompileTarget(str(ckpt), RUNNER).neuron_config(), load=False)
    spec = model.get_kv_spec()
    # Layers 2-4 read layers 0 (sliding) and 1 (full); sliding and full caches differ in head size.
    assert [(s.name, s.num_kv_heads, s.head_dim, s.sliding_window) for s in spec.layers] == [
        ("layers.0.self_attn", 2, 8, 4),
        ("layers.1.self_attn", 2, 16, None),
    ]
    assert model.layers[3].self_attn.attn.kv_sharing_target_layer_name == "layers.0.self_attn"
    assert model.layers[4].self_attn.attn.kv_sharing_target_layer_name == "layers.1.self_attn"


@pytest.mark.slow  # AOT compiles
def test_compiled_graphs_match_eager(greedy_cases, tmp_path):
    ckpt, prompts, expected = greedy_cases["ple_kv_shared"]
    runner_cfg = RunnerConfig(
        max_num_seqs=2, max_model_len=32, block_size=8, num_batched_tokens_buckets=(32,), num_seqs_buckets=(2,),
        context_len_buckets=(32,),
    )  # fmt: skip
    target = CompileTarget(str(ckpt), runner_cfg)
    cold = compile_all(target, str(tmp_path / "cache"), jobs=2)
    assert [(r.name, r.cache) for r in cold] == [("prefill_32", "miss"), ("decode_2x32", "miss")]
    model = build_model(ckpt, target.neuron_config(), progress=False)
    graphs = load_compiled_graphs(target, model, str(tmp_path / "cache"))
    assert len(graphs) == 2
    compiled = Runner(model, runner_cfg, graphs=graphs)
    eager = Runner(model, runner_cfg)
    # The first two prompts (5 and 17 tokens) fit max_model_len=32 with their new tokens.
    got = [r.token_ids for r in compiled.generate(prompts[:2], PARAMS)]
    assert got == expected[:2] == [r.token_ids for r in eager.generate(prompts[:2], PARAMS)]
    assert {s.name for s in compiled.steps} == {"prefill_32", "decode_2x32"}
