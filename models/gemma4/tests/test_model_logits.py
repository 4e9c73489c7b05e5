"""Model level: teacher-forced logits through prefill plus paged decode against HF Gemma 4.

Each sequence runs past the sliding window (window 4, 18-26 tokens, prefill 5-9), so sliding layers
decode over a partly masked cache. FP32 max abs error ≤ 1e-4 at TP=1 and TP=2, and at EP=2 and TP=2 × EP=2 for MoE,
over the variants the issue names plus one randomly drawn config (seed printed on failure; set
TRNMODELS_TEST_SEED to replay).
"""

from __future__ import annotations

import os
import random

import pytest
import torch
from safetensors.torch import load_file

from trnmodels.core.accuracy import compare_teacher_forced_logits, hf_logits
from trnmodels.core.runner.score import ScoreJob, score_many
from trnmodels.core.testing import run_cli

from .conftest import DENSE_K_EQ_V, FULL, GLOBAL_KV1, MOE, PLE_KV_SHARED, SLIDING

FP32_ATOL = 1e-4

NAMED_CONFIGS = {
    "dense_k_eq_v": DENSE_K_EQ_V,
    "ple_kv_shared_double_wide": PLE_KV_SHARED,
    "global_kv_heads_1": GLOBAL_KV1,
    "moe": MOE,
}


def random_config(rng: random.Random) -> dict:
    """A Gemma 4 text config no test was written for, valid at TP=2."""
    layers = rng.randint(3, 5)
    types = [rng.choice([SLIDING, FULL]) for _ in range(layers - 1)] + [FULL]
    shared = rng.choice([0, 1, 2])
    if any(t not in types[: layers - shared] for t in types[layers - shared :]):
        shared = 0  # every KV-shared layer needs an earlier layer of its type to read from
    return dict(
        num_hidden_layers=layers,
        layer_types=types,
        num_attention_heads=rng.choice([2, 4]),
        num_key_value_heads=rng.choice([1, 2]),
        head_dim=rng.choice([8, 16]),
        global_head_dim=rng.choice([16, 32]),
        num_global_key_value_heads=rng.choice([1, 2]),
        attention_k_eq_v=rng.random() < 0.5,
        sliding_window=rng.choice([3, 4, 6]),
        hidden_size_per_layer_input=rng.choice([0, 8]),
        vocab_size_per_layer_input=96,
        num_kv_shared_layers=shared,
        use_double_wide_mlp=rng.random() < 0.5,
        final_logit_softcapping=rng.choice([None, 30.0]),
    )


SEED = int(os.environ.get("TRNMODELS_TEST_SEED", random.randrange(1 << 30)))


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """(name, overrides, dir, token ids, prefill length, HF logits) for every config."""
    from trnmodels.core.testing import save_checkpoint

    from .conftest import build_hf

    rng = random.Random(SEED)
    configs = dict(NAMED_CONFIGS)
    configs["random"] = random_config(rng)
    cases = []
    for i, (name, overrides) in enumerate(configs.items()):
        hf = build_hf(seed=i, **overrides)
        ckpt = save_checkpoint(hf, tmp_path_factory.mktemp(name))
        length = rng.randint(18, 26)
        ids = [rng.randrange(hf.config.text_config.vocab_size) for _ in range(length)]
        prefill = rng.randint(5, 9)
        cases.append((name, overrides, ckpt, ids, prefill, hf_logits(hf, ids)))
    return cases


def check(cases, results, layout):
    for (name, overrides, _, _, prefill, expected), ours in zip(cases, results, strict=True):
        report = compare_teacher_forced_logits(ours, expected, atol=FP32_ATOL)
        assert report.passed, (
            f"{name} {layout} prefill={prefill} seed={SEED} {overrides}\n{report.format_table()}"
        )


def jobs(cases):
    return [ScoreJob(str(ckpt), tuple(ids), prefill) for _, _, ckpt, ids, prefill, _ in cases]


def test_logits_match_hf_tp1(checkpoints):
    check(checkpoints, score_many(jobs(checkpoints), tp=1), "tp=1")


@pytest.mark.slow  # two gloo ranks
def test_logits_match_hf_tp2(checkpoints):
    check(checkpoints, score_many(jobs(checkpoints), tp=2), "tp=2")


@pytest.mark.slow  # two and four gloo ranks
@pytest.mark.parametrize("tp,ep", [(1, 2), (2, 2)], ids=["ep2", "tp2xep2"])
def test_moe_logits_match_hf_ep(checkpoints, tp, ep):
    """Experts split over EP ranks, and at TP=2 × EP=2 (4 ranks) each expert TP-split inside too."""
    moe = [case for case in checkpoints if case[0] == "moe"]
    check(moe, score_many(jobs(moe), tp=tp, ep=ep), f"tp={tp} ep={ep}")


@pytest.mark.slow  # a CLI process that starts two ranks
def test_cli_logits_tp2_matches_hf(checkpoints, tmp_path):
    """The public command: `trnmodels logits ... --tp 2 --out F` writes [T, vocab] float32 logits."""
    _, _, ckpt, ids, _, expected = next(c for c in checkpoints if c[0] == "ple_kv_shared_double_wide")
    out = tmp_path / "logits.safetensors"
    token_ids = ",".join(map(str, ids))
    done = run_cli(
        "logits", str(ckpt), "--token-ids", token_ids, "--prefill-len", "6", "--tp", "2", "--out", str(out)
    )
    assert done.returncode == 0, done.stderr
    logits = load_file(out)["logits"]
    assert logits.dtype == torch.float32 and logits.shape == expected.shape
    assert (logits - expected).abs().max() <= FP32_ATOL
