"""Model level: teacher-forced logits (prefill, then paged decode steps past the sliding window) against
HF GptOssForCausalLM, FP32 max abs error ≤ 1e-4 at TP=1, TP=2, EP=2 and TP=2 x EP=2 (4 ranks).

Configs: the published gpt-oss-20b and -120b shapes scaled down, plus configs drawn at random each run
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
from trnmodels.core.testing import run_cli

FP32_ATOL = 1e-4

NAMED_CONFIGS = {
    # gpt-oss-20b: 32 experts, top-4, 24 alternating layers → 4 experts, top-2, 2 layers.
    "20b_shape": dict(),
    # gpt-oss-120b: 128 experts, top-4 → 8 experts, top-4, 3 layers (sliding, full, sliding).
    "120b_shape": dict(num_local_experts=8, num_experts_per_tok=4, num_hidden_layers=3),
    "mqa_tied_default_rope": dict(
        num_key_value_heads=1,
        tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    ),
}


def random_config(rng: random.Random) -> dict:
    """A gpt-oss config no test was written for, valid at TP=2 and EP=2."""
    kv = rng.choice([1, 2])
    layers = rng.randint(1, 3)
    experts = rng.choice([2, 4, 6, 8])
    return dict(
        vocab_size=rng.randint(60, 200),
        hidden_size=rng.choice([32, 64]),
        intermediate_size=2 * rng.randint(8, 40),
        num_hidden_layers=layers,
        num_attention_heads=kv * rng.choice([2, 4]),
        num_key_value_heads=kv,
        head_dim=rng.choice([32, 64]),
        num_local_experts=experts,
        num_experts_per_tok=rng.randint(1, min(4, experts)),
        sliding_window=rng.choice([4, 8, 16]),
        layer_types=[rng.choice(["sliding_attention", "full_attention"]) for _ in range(layers)],
        tie_word_embeddings=rng.random() < 0.3,
    )


SEED = int(os.environ.get("TRNMODELS_TEST_SEED", random.randrange(1 << 30)))


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """(name, overrides, dir, token ids, prefill length, HF logits) for every config."""
    from trnmodels.core.testing import save_checkpoint

    from .conftest import build_hf

    rng = random.Random(SEED)
    configs = dict(NAMED_CONFIGS)
    configs.update({f"random{i}": random_config(rng) for i in range(2)})
    root = tmp_path_factory.mktemp("gpt_oss_logits")
    cases = []
    for i, (name, overrides) in enumerate(configs.items()):
        hf = build_hf(i, **overrides)
        ckpt = save_checkpoint(hf, root / name)
        window = hf.config.sliding_window
        length = rng.randint(2 * window + 4, 2 * window + 16)  # decode steps run past the window
        ids = [rng.randrange(hf.config.vocab_size) for _ in range(length)]
        prefill = rng.randint(1, length - 4)
        cases.append((name, overrides, ckpt, ids, prefill, hf_logits(hf, ids)))
    return cases


def jobs(cases):
    return [ScoreJob(str(ckpt), tuple(ids), prefill) for _, _, ckpt, ids, prefill, _ in cases]


@pytest.mark.parametrize(
    "tp,ep",
    [
        pytest.param(1, 1, id="tp1"),
        pytest.param(2, 1, id="tp2", marks=pytest.mark.slow),
        pytest.param(1, 2, id="ep2", marks=pytest.mark.slow),
        pytest.param(2, 2, id="tp2xep2", marks=pytest.mark.slow),
    ],
)
def test_logits_match_hf(checkpoints, tp, ep):
    for (name, overrides, _, _, prefill, expected), ours in zip(
        checkpoints, score_many(jobs(checkpoints), tp=tp, ep=ep), strict=True
    ):
        report = compare_teacher_forced_logits(ours, expected, atol=FP32_ATOL)
        assert report.passed, (
            f"{name} tp={tp} ep={ep} prefill={prefill} seed={SEED} {overrides}\n{report.format_table()}"
        )


@pytest.mark.slow  # a CLI process that starts two ranks
def test_cli_logits_ep2_matches_hf(checkpoints, tmp_path):
    """The public command with expert parallelism: `trnmodels logits ... --ep 2 --out F`."""
    name, _, ckpt, ids, prefill, expected = checkpoints[-1]
    out = tmp_path / "logits.safetensors"
    done = run_cli(
        "logits", str(ckpt), "--token-ids", ",".join(map(str, ids)), "--prefill-len", str(prefill),
        "--ep", "2", "--out", str(out), "--json",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert '"ep": 2' in done.stdout
    logits = load_file(out)["logits"]
    assert logits.dtype == torch.float32 and logits.shape == expected.shape
    assert (logits - expected).abs().max() <= FP32_ATOL, f"{name} seed={SEED}"
