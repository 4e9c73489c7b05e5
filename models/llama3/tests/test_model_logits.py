"""Model level: teacher-forced logits through prefill plus paged decode against HF LlamaForCausalLM.

FP32 max abs error ≤ 1e-4 at TP=1 and TP=2, over the configs the issue names plus randomly drawn ones
(the seed is printed on failure; set TRNMODELS_TEST_SEED to replay).
"""

from __future__ import annotations

import os
import random

import pytest
import torch
from safetensors.torch import load_file

from trnmodels.core.accuracy import compare_teacher_forced_logits, hf_logits
from trnmodels.core.runner.score import ScoreJob, score_many

from .conftest import LLAMA3_ROPE, run_cli

FP32_ATOL = 1e-4

NAMED_CONFIGS = {
    "gqa_llama3_rope": dict(rope_parameters=LLAMA3_ROPE),
    "mqa_odd_vocab_tied": dict(num_key_value_heads=1, vocab_size=101, tie_word_embeddings=True),
    "explicit_head_dim": dict(
        num_attention_heads=4, num_key_value_heads=2, head_dim=24, rope_parameters=LLAMA3_ROPE
    ),
    "mha_biases": dict(num_key_value_heads=4, attention_bias=True, mlp_bias=True, vocab_size=64),
}


def random_config(rng: random.Random) -> dict:
    """A Llama config no test was written for, valid at TP=2."""
    kv = rng.choice([1, 2, 4])
    heads = kv * rng.choice([1, 2, 4])
    heads = max(heads, 2)
    head_dim = rng.choice([8, 16, 24])
    return dict(
        vocab_size=rng.randint(50, 200),
        hidden_size=rng.choice([32, 48, 64]),
        intermediate_size=2 * rng.randint(20, 80),
        num_hidden_layers=rng.randint(1, 3),
        num_attention_heads=heads,
        num_key_value_heads=kv,
        head_dim=head_dim,
        tie_word_embeddings=rng.random() < 0.5,
        rope_parameters=LLAMA3_ROPE
        if rng.random() < 0.5
        else {"rope_type": "default", "rope_theta": 10000.0},
    )


SEED = int(os.environ.get("TRNMODELS_TEST_SEED", random.randrange(1 << 30)))


@pytest.fixture
def checkpoints(make_checkpoint):
    """(name, dir, token ids, prefill length, HF logits) for every config."""
    rng = random.Random(SEED)
    configs = dict(NAMED_CONFIGS)
    configs.update({f"random{i}": random_config(rng) for i in range(2)})
    cases = []
    for i, (name, overrides) in enumerate(configs.items()):
        ckpt, hf = make_checkpoint(seed=i, **overrides)
        length = rng.randint(12, 40)
        ids = [rng.randrange(hf.config.vocab_size) for _ in range(length)]
        prefill = rng.randint(1, length - 4)
        cases.append((name, overrides, ckpt, ids, prefill, hf_logits(hf, ids)))
    return cases


def check(cases, results, tp):
    for (name, overrides, _, _, prefill, expected), ours in zip(cases, results, strict=True):
        report = compare_teacher_forced_logits(ours, expected, atol=FP32_ATOL)
        assert report.passed, (
            f"{name} tp={tp} prefill={prefill} seed={SEED} {overrides}\n{report.format_table()}"
        )


def jobs(cases):
    return [ScoreJob(str(ckpt), tuple(ids), prefill) for _, _, ckpt, ids, prefill, _ in cases]


def test_logits_match_hf_tp1(checkpoints):
    check(checkpoints, score_many(jobs(checkpoints), tp=1), tp=1)


def test_logits_match_hf_tp2(checkpoints):
    check(checkpoints, score_many(jobs(checkpoints), tp=2), tp=2)


def test_cli_logits_tp2_matches_hf(make_checkpoint, tmp_path):
    """The public command: `trnmodels logits ... --tp 2 --out F` writes [T, vocab] float32 logits."""
    ckpt, hf = make_checkpoint(seed=7, num_key_value_heads=1, vocab_size=101, rope_parameters=LLAMA3_ROPE)
    ids = [5, 17, 3, 99, 42, 8, 0, 100, 64, 23, 11]
    out = tmp_path / "logits.safetensors"
    token_ids = ",".join(map(str, ids))
    done = run_cli(
        "logits", str(ckpt), "--token-ids", token_ids, "--prefill-len", "4", "--tp", "2", "--out", str(out)
    )
    assert done.returncode == 0, done.stderr
    logits = load_file(out)["logits"]
    assert logits.dtype == torch.float32 and logits.shape == (len(ids), 101)
    assert (logits - hf_logits(hf, ids)).abs().max() <= FP32_ATOL
