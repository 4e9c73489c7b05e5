"""The runner and the compile driver end to end for the MoE model: greedy parity with HF generate on a
ragged batch (TP=1 and EP=2), compiled EP graphs equal to HF, and the public `generate` command."""

from __future__ import annotations

import json
import random

import pytest
import torch
import transformers

from trnmodels.core.accuracy import greedy_teacher_sequence
from trnmodels.core.compile import CompileTarget, compile_all
from trnmodels.core.runner.config import RunnerConfig, SamplingParams
from trnmodels.core.runner.generate import GenerateJob, generate_token_ids
from trnmodels.core.testing import run_cli, save_checkpoint, save_random_checkpoint
from trnmodels.core.testing.conformance import RUNNER

from .conftest import build_hf
from .test_model_logits import SEED, random_config

NEW_TOKENS = 12
TINY = __import__("trnmodels.gpt_oss", fromlist=["PLUGIN"]).PLUGIN.bundled_config_dir("tiny")


def hf_greedy(hf: transformers.PreTrainedModel, prompt: list[int], new_tokens: int) -> list[int]:
    return greedy_teacher_sequence(hf, prompt, new_tokens)[len(prompt) :]


@pytest.fixture(scope="module")
def greedy_cases(tmp_path_factory):
    rng = random.Random(SEED)
    root = tmp_path_factory.mktemp("gpt_oss_generate")
    cases = []
    for i, overrides in enumerate([dict(), random_config(rng)]):
        hf = build_hf(20 + i, **overrides)
        ckpt = save_checkpoint(hf, root / f"case{i}")
        # Prompts and generations longer than the sliding window, in one ragged batch.
        prompts = [[rng.randrange(hf.config.vocab_size) for _ in range(n)] for n in (5, 23, 1, 9, 30)]
        cases.append((ckpt, prompts, [hf_greedy(hf, p, NEW_TOKENS) for p in prompts], overrides))
    return cases


@pytest.mark.parametrize(
    "tp,ep", [pytest.param(1, 1, id="tp1"), pytest.param(1, 2, id="ep2", marks=pytest.mark.slow)]
)
def test_greedy_generation_matches_hf_on_a_ragged_batch(greedy_cases, tp, ep):
    params = SamplingParams(max_new_tokens=NEW_TOKENS, ignore_eos=True)
    for ckpt, prompts, expected, overrides in greedy_cases:
        job = GenerateJob(str(ckpt), tuple(map(tuple, prompts)), params, RUNNER)
        got = [r.token_ids for r in generate_token_ids(job, tp, ep)["results"]]
        assert got == expected, f"tp={tp} ep={ep} seed={SEED} {overrides}"


@pytest.mark.slow  # AOT compiles, two gloo ranks
def test_ep2_ranks_share_compiled_graphs_and_match_hf(greedy_cases, tmp_path):
    """Graphs traced once on a fake 2-rank EP group serve both gloo ranks: the expert slice each rank
    holds is picked by the rank tensor inside the graph, not baked in."""
    ckpt, prompts, expected, _ = greedy_cases[0]
    runner_cfg = RunnerConfig(
        max_num_seqs=2, max_model_len=64, block_size=8, num_batched_tokens_buckets=(64,), num_seqs_buckets=(2,),
        context_len_buckets=(64,),
    )  # fmt: skip
    cache = str(tmp_path / "cache")
    results = compile_all(CompileTarget(str(ckpt), runner_cfg, ep=2), cache, jobs=2)
    assert [(r.name, r.cache) for r in results] == [("prefill_64", "miss"), ("decode_2x64", "miss")]
    picked = (0, 1, 3)  # prompts of 5, 23 and 9 tokens
    params = SamplingParams(max_new_tokens=NEW_TOKENS, ignore_eos=True)
    job = GenerateJob(
        str(ckpt), tuple(tuple(prompts[i]) for i in picked), params, runner_cfg, cache_dir=cache
    )
    out = generate_token_ids(job, tp=1, ep=2)
    assert out["compiled_graphs"] == 2
    assert [r.token_ids for r in out["results"]] == [expected[i] for i in picked]


@pytest.mark.slow  # a CLI process that starts two ranks
def test_cli_generate_ep2_equals_hf_greedy(tmp_path):
    ckpt = save_random_checkpoint(TINY, tmp_path / "tiny")
    hf = transformers.GptOssForCausalLM.from_pretrained(ckpt, dtype=torch.float32).eval()
    hf.config._experts_implementation = "eager"
    tokenizer = transformers.AutoTokenizer.from_pretrained(ckpt)
    prompts = ["Hello, my name is", "The quick brown fox jumps over the lazy dog."]
    done = run_cli(
        "generate", str(ckpt), "--prompt", prompts[0], "--prompt", prompts[1], "--max-new-tokens", "10",
        "--ignore-eos", "--ep", "2", "--cache-dir", str(tmp_path / "cache"), "--json",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    outputs = json.loads(done.stdout)["outputs"]
    for prompt, out in zip(prompts, outputs, strict=True):
        assert out["prompt"] == prompt
        assert out["token_ids"] == hf_greedy(hf, tokenizer(prompt)["input_ids"], 10)
