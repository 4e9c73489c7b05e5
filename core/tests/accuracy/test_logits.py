import json

import pytest
import torch

from trnmodels.core.accuracy import (
    DEFAULT_TOPK_TOLERANCES,
    bf16_ulp,
    compare_teacher_forced_logits,
    greedy_teacher_sequence,
    hf_logits,
    hf_logits_stepwise,
)

PROMPT = [1, 5, 7, 11]


def test_hf_logits_and_greedy_sequence(tiny_llama):
    seq = greedy_teacher_sequence(tiny_llama, PROMPT, 20)
    assert len(seq) == len(PROMPT) + 20 and seq[: len(PROMPT)] == PROMPT
    logits = hf_logits(tiny_llama, seq)
    assert logits.shape == (len(seq), 97) and logits.dtype == torch.float32
    # Greedy generation is the argmax chain of one teacher-forced forward pass.
    assert logits[len(PROMPT) - 1 : -1].argmax(-1).tolist() == seq[len(PROMPT) :]


@pytest.mark.parametrize("prefill_len", [1, 4, 24])
def test_stepwise_reference_gives_the_logits_of_one_forward_pass(tiny_llama, prefill_len):
    seq = greedy_teacher_sequence(tiny_llama, PROMPT, 20)
    stepwise = hf_logits_stepwise(tiny_llama, seq, prefill_len)
    assert stepwise.shape == (len(seq), 97) and stepwise.dtype == torch.float32
    # FP32 on both sides: only the summation order differs.
    torch.testing.assert_close(stepwise, hf_logits(tiny_llama, seq), rtol=0, atol=1e-5)


def test_greedy_ignores_eos(tiny_llama):
    seq = greedy_teacher_sequence(tiny_llama, PROMPT, 20)
    old = tiny_llama.generation_config.eos_token_id
    tiny_llama.generation_config.eos_token_id = seq[len(PROMPT)]  # would stop after one token
    try:
        assert greedy_teacher_sequence(tiny_llama, PROMPT, 20) == seq
    finally:
        tiny_llama.generation_config.eos_token_id = old


def test_self_comparison_passes(tiny_llama):
    logits = hf_logits(tiny_llama, greedy_teacher_sequence(tiny_llama, PROMPT, 8))
    r = compare_teacher_forced_logits(logits, logits.clone())
    assert r.passed and r.first_divergence is None
    assert r.max_abs_error == 0.0 and r.top1_agreement == 1.0
    assert r.topk_agreement == {1: 1.0, 5: 1.0, 50: 1.0}
    assert all(p.within_tolerance and not p.diverged for p in r.positions)


def test_strong_perturbation_is_first_divergence(tiny_llama):
    expected = hf_logits(tiny_llama, greedy_teacher_sequence(tiny_llama, PROMPT, 8))
    actual = expected.clone()
    wrong = (int(expected[6].argmax()) + 1) % 97
    actual[6, wrong] = expected[6].max() + 10.0
    actual[9, (int(expected[9].argmax()) + 3) % 97] = expected[9].max() + 10.0
    r = compare_teacher_forced_logits(actual, expected)
    assert r.first_divergence == 6 and not r.passed
    assert r.positions[6].diverged and r.positions[6].actual_token == wrong
    assert not r.positions[6].top1_match and not r.positions[6].within_tolerance
    assert [p.position for p in r.positions if p.diverged] == [6, 9]
    assert r.top1_agreement == pytest.approx(10 / 12)


def test_bf16_ulp():
    assert bf16_ulp(1.0) == 2**-7
    assert bf16_ulp(-8.5) == 2**-4
    assert bf16_ulp(0.75) == 2**-8
    assert 0.0 < bf16_ulp(0.0) < 1e-38


def test_near_tie_is_not_a_divergence():
    expected = torch.tensor([[0.0, 1.0, 2.0, 8.0, 3.0, 7.99, 4.0, 5.0]])  # argmax: token 3
    ulp = bf16_ulp(8.0)  # 1/16
    tie = expected.clone()
    tie[0, 5] = 8.0 + ulp / 2  # actual argmax flips to token 5, but by half a BF16 ULP
    r = compare_teacher_forced_logits(tie, expected)
    p = r.positions[0]
    assert (p.expected_token, p.actual_token) == (3, 5) and not p.top1_match
    assert not p.diverged and r.first_divergence is None
    assert r.passed  # |8.03125 - 7.99| is within the top-5 tier too
    # Exactly one ULP is still "within"; four ULPs is a divergence.
    tie[0, 5] = 8.0 + ulp
    assert not compare_teacher_forced_logits(tie, expected).positions[0].diverged
    tie[0, 5] = 8.0 + 4 * ulp
    assert compare_teacher_forced_logits(tie, expected).first_divergence == 0


def test_tolerance_tiers_hand_checked():
    tol = {2: (0.0, 0.1), None: (0.0, 0.5)}  # top-2: 10% of |expected|; everything: 50%
    e_row = torch.tensor([8.0, 7.0, 6.0, 5.0, 4.0, 3.0, 2.0, 1.0])
    expected = e_row.repeat(4, 1)
    actual = expected.clone()
    actual[0, 0] += 0.75  # top-2 bound for token 0 is 0.8   -> ok
    actual[1, 1] += 0.75  # top-2 bound for token 1 is 0.7   -> fails top-2
    actual[2, 7] += 0.5  # whole-vocab bound for token 7 is 0.5 -> ok (inclusive)
    actual[3, 7] += 0.625  # -> fails the whole-vocab tier
    r = compare_teacher_forced_logits(actual, expected, tolerances=tol)
    assert [p.within_tolerance for p in r.positions] == [True, False, True, False]
    assert not any(p.diverged for p in r.positions) and not r.passed
    assert r.max_abs_error == pytest.approx(0.75)
    assert r.mean_abs_error == pytest.approx((0.75 + 0.75 + 0.5 + 0.625) / 32)


def test_default_tiers_hand_checked():
    assert dict(DEFAULT_TOPK_TOLERANCES) == {
        5: (1e-5, 0.011),
        50: (1e-5, 0.02),
        1000: (1e-5, 0.03),
        None: (1e-5, 0.05),
    }
    V = 97
    expected = torch.linspace(100.0, 50.0, V).repeat(5, 1)  # token i has rank i
    e = expected[0]
    actual = expected.clone()
    actual[0, 0] += 0.015 * e[0]  # rank 0, 1.5% > 1.1%  -> fail (top-5)
    actual[1, 10] += 0.015 * e[10]  # rank 10, 1.5% <= 2%   -> ok (top-50)
    actual[2, 60] += 0.025 * e[60]  # rank 60, 2.5% <= 3%   -> ok (top-1000, clamped to V)
    actual[3, 60] += 0.035 * e[60]  # rank 60, 3.5% > 3%    -> fail
    actual[4, 3] += 0.01 * e[3]  # rank 3, 1%            -> ok
    r = compare_teacher_forced_logits(actual, expected)
    assert [p.within_tolerance for p in r.positions] == [False, True, True, False, True]
    assert r.first_divergence is None


def test_atol_override():
    torch.manual_seed(0)
    expected = torch.randn(3, 11)
    actual = expected + 1e-6
    assert compare_teacher_forced_logits(actual, expected, atol=1e-5).passed
    assert not compare_teacher_forced_logits(actual, expected, atol=1e-7).passed
    # atol replaces the tier rule: an error the tiers reject passes if it is within atol ...
    expected = torch.tensor([[10.0, 5.0, 1.0, 0.0]])
    actual = expected.clone()
    actual[0, 3] += 0.5
    assert not compare_teacher_forced_logits(actual, expected).passed
    assert compare_teacher_forced_logits(actual, expected, atol=1.0).passed
    assert not compare_teacher_forced_logits(actual, expected, atol=0.1).passed
    # ... but never a divergence.
    actual[0, 3] = 10.5
    assert not compare_teacher_forced_logits(actual, expected, atol=100.0).passed


def test_atol_marks_each_position_by_atol_not_by_the_tiers():
    """With ``atol``, a row the tiers alone would reject but within atol reads ``ok`` (the verdict's rule),
    and one past atol reads ``TOL``: the table names exactly the positions that fail the check."""
    expected = torch.tensor([[10.0, 5.0, 1.0, 0.001], [10.0, 5.0, 1.0, 0.001], [10.0, 5.0, 1.0, 0.001]])
    actual = expected.clone()
    actual[0, 3] += 5e-5  # past the top-5 tier's bound at 0.001: 1e-5 + 1.1% of 0.001 = 2.1e-5
    actual[2, 3] += 2e-4  # beyond atol
    assert not compare_teacher_forced_logits(actual, expected).positions[0].within_tolerance
    r = compare_teacher_forced_logits(actual, expected, atol=1e-4)
    assert [p.within_tolerance for p in r.positions] == [True, True, False]
    assert not r.passed
    rows = [line.split() for line in r.format_table().splitlines()[2:5]]
    assert [row[-1] for row in rows] == ["ok", "ok", "TOL"]
    assert "1 out of tolerance" not in r.summary() and r.summary().endswith("max_abs_err <= 0.0001")
    actual[2, 3] = expected[2, 3]
    assert compare_teacher_forced_logits(actual, expected, atol=1e-4).passed


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize("which", ["actual", "expected"])
def test_non_finite_logits_are_named(bad, which):
    expected = torch.randn(3, 8)
    actual = expected.clone()
    (actual if which == "actual" else expected)[1, 2] = bad
    message = rf"{which} logits hold 1 non-finite value\(s\); the first, {bad}, is at position 1, token 2"
    with pytest.raises(ValueError, match=message):
        compare_teacher_forced_logits(actual, expected, atol=1e-4)


def test_ks_clamped_and_overlap():
    expected = torch.arange(10.0).flip(0).unsqueeze(0)  # top-2 = {0, 1}
    actual = expected.clone()
    actual[0, 1] = -5.0  # top-2 of actual = {0, 2}
    r = compare_teacher_forced_logits(actual, expected, ks=(2, 50))
    assert r.topk_agreement == {2: 0.5, 10: 1.0}
    assert r.positions[0].topk_overlap == {2: 0.5, 10: 1.0}


def test_shape_validation():
    with pytest.raises(ValueError, match=r"\[4, 7\].*\[4, 8\]"):
        compare_teacher_forced_logits(torch.zeros(4, 7), torch.zeros(4, 8))
    with pytest.raises(ValueError, match=r"\[7\]"):
        compare_teacher_forced_logits(torch.zeros(7), torch.zeros(7))


def test_format_table_and_to_dict():
    torch.manual_seed(0)
    expected = torch.randn(30, 20)
    actual = expected * 1.2  # every position out of tolerance, same ranking
    actual[17, (int(expected[17].argmax()) + 1) % 20] = 100.0
    r = compare_teacher_forced_logits(actual, expected)
    assert [p.position for p in r.positions if p.within_tolerance] == []
    table = r.format_table(max_rows=5)
    lines = table.splitlines()
    assert lines[0].split() == "pos exp tok act tok max abs err top-1 top-5 ovl ok".split()
    assert len(lines) == 2 + 5 + 2  # header, rule, rows, elision note, summary
    assert any(line.split()[0] == "17" and line.split()[-1] == "DIV" for line in lines[2:7])
    assert lines[-1].startswith("[FAIL] 30 positions") and "first divergence: position 17" in lines[-1]
    assert len(r.format_table(max_rows=None).splitlines()) == 2 + 30 + 1
    d = json.loads(json.dumps(r.to_dict()))
    assert d["first_divergence"] == 17 and len(d["positions"]) == 30 and d["passed"] is False
