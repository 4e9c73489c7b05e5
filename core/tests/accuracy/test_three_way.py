import math

import pytest
import torch

from trnmodels.core.accuracy import (
    ThreeWayReport,
    assert_close_three_way,
    bhattacharyya,
    compare_three_way,
)
from trnmodels.core.accuracy.three_way import BC_MIN, distinct_rows, histogram_bins

F64 = torch.float64


def _hand_example() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gold [1, -2, 3, -4]; base error [.25, 0, 0, .25]; target error [.5, .5, 0, 0] (all exact in binary)."""
    e = torch.tensor([1.0, -2.0, 3.0, -4.0], dtype=F64)
    b = e + torch.tensor([0.25, 0.0, 0.0, -0.25], dtype=F64)
    t = e + torch.tensor([0.5, -0.5, 0.0, 0.0], dtype=F64)
    return t, e, b


def test_hand_computed_metrics():
    t, e, b = _hand_example()
    r = compare_three_way(t, e, b, name="hand", bins=4)
    assert r.base_linf == pytest.approx(0.25 / 4)
    assert r.target_linf == pytest.approx(0.5 / 4)
    assert r.linf_ratio == pytest.approx(2.0)
    assert r.base_l2 == pytest.approx(math.sqrt(0.125) / math.sqrt(30))
    assert r.target_l2 == pytest.approx(math.sqrt(0.5) / math.sqrt(30))
    assert r.l2_ratio == pytest.approx(2.0)
    assert r.base_rms == pytest.approx(math.sqrt(0.125 / 4))
    assert r.target_rms == pytest.approx(math.sqrt(0.5 / 4))
    assert r.sigma_ratio == pytest.approx(2.0)
    # 4 bins over [0, .5]: base p = [.5, 0, .5, 0], target q = [.5, 0, 0, .5] -> BC = sqrt(.25) = .5.
    assert r.bc == pytest.approx(0.5)
    # Neither BC >= .99 nor sigma_ratio <= 1: fails despite small L-inf / L2 ratios.
    assert not r.passed


def test_pass_rule_bc_branch():
    t, e, b = _hand_example()
    # 2 bins over [0, .5]: both histograms are [.5, .5] -> BC = 1, which rescues sigma_ratio = 2.
    r = compare_three_way(t, e, b, bins=2)
    assert r.bc == pytest.approx(1.0)
    assert r.passed
    # ... but the L-inf / L2 ceilings still apply.
    assert not compare_three_way(t, e, b, bins=2, linf_ratio_max=2.0).passed
    assert not compare_three_way(t, e, b, bins=2, l2_ratio_max=1.5).passed
    assert compare_three_way(t, e, b, bins=4, sigma_max=2.0).passed


def test_target_equal_to_bf16_baseline_passes():
    torch.manual_seed(0)
    x, w = torch.randn(16, 64), torch.randn(64, 32)
    expected = x @ w
    baseline = x.bfloat16() @ w.bfloat16()
    r = assert_close_three_way(baseline.clone(), expected, baseline, name="matmul")
    assert r.passed
    assert r.linf_ratio == pytest.approx(1.0) and r.l2_ratio == pytest.approx(1.0)
    assert r.sigma_ratio == pytest.approx(1.0) and r.bc == pytest.approx(1.0)


def test_bias_bug_fails_with_readable_message():
    torch.manual_seed(0)
    expected = torch.randn(32, 64)
    baseline = expected.bfloat16()
    target = (expected * 1.05).bfloat16()  # a 5% scale bug
    with pytest.raises(AssertionError) as exc:
        assert_close_three_way(target, expected, baseline, name="mlp.down_proj")
    msg = str(exc.value)
    assert "FAIL" in msg and "mlp.down_proj" in msg and "linf_ratio=" in msg


def test_wrong_sign_in_one_row_fails():
    torch.manual_seed(1)
    expected = torch.randn(8, 16)
    baseline = expected.bfloat16()
    target = baseline.clone()
    target[3] = -target[3]
    r = compare_three_way(target, expected, baseline, name="rope")
    assert not r.passed
    assert r.linf_ratio > 5.0


def test_exact_baseline_is_floored():
    e = torch.tensor([1.0, 2.0, -4.0, 0.5])
    eps = torch.finfo(torch.float32).eps
    # An exact BF16 baseline and an exact target: ratios are 0, pass.
    r = compare_three_way(e.clone(), e, e.clone())
    assert (r.linf_ratio, r.l2_ratio, r.sigma_ratio) == (0.0, 0.0, 0.0) and r.passed
    # An exact baseline does not make a tiny target error infinite: the floor is eps * max|gold| ...
    t = e.double().clone()
    t[0] += 2 * eps * 4.0
    r = compare_three_way(t, e, e.clone())
    assert r.base_linf == 0.0 and r.linf_ratio == pytest.approx(2.0)
    # ... so FP32-level noise passes,
    r = compare_three_way(e.double() * (1 + 0.5 * eps), e, e.clone())
    assert r.linf_ratio == pytest.approx(0.5) and r.sigma_ratio == pytest.approx(0.5) and r.passed
    # ... while BF16-level error on an op that BF16 computes exactly does not.
    assert not compare_three_way(e.double() * (1 + 2**-8), e, e.clone()).passed
    # Gold all zero: the floor is 0 too, so any target error is an infinite ratio.
    z = torch.zeros(4)
    r = compare_three_way(torch.tensor([0.0, 1e-3, 0.0, 0.0]), z, z.clone())
    assert r.linf_ratio == math.inf and r.l2_ratio == math.inf and not r.passed


def test_shape_mismatch_raises():
    with pytest.raises(ValueError, match=r"attn_out.*\[2, 3\].*\[3, 2\]"):
        compare_three_way(torch.zeros(2, 3), torch.zeros(3, 2), torch.zeros(2, 3), name="attn_out")


def test_bhattacharyya():
    torch.manual_seed(0)
    x = torch.rand(1000)
    assert bhattacharyya(x, x) == pytest.approx(1.0)
    assert bhattacharyya(x, x[torch.randperm(1000)]) == pytest.approx(1.0)  # same distribution
    assert bhattacharyya(torch.zeros(5), torch.zeros(5)) == 1.0
    assert bhattacharyya(torch.zeros(4), torch.ones(4), bins=4) == 0.0  # disjoint supports


def test_report_str_and_dict():
    t, e, b = _hand_example()
    r = compare_three_way(t, e, b, name="x", bins=4)
    assert isinstance(r, ThreeWayReport)
    assert str(r).startswith("[FAIL] x [4]:") and "\n" not in str(r)
    d = r.to_dict()
    assert d["name"] == "x" and d["shape"] == [4] and d["passed"] is False
    assert {"bc_min", "sigma_max", "linf_ratio_max", "l2_ratio_max", "bc", "sigma_ratio"} <= d.keys()


@pytest.mark.parametrize("numel", [1024, 2900, 7350, 16000])
def test_histogram_bins_keep_two_samples_of_one_distribution_above_bc_min(numel):
    # Two independent draws of one error distribution: only sampling noise separates their histograms.
    # 64 fixed bins fall below BC_MIN on small samples (the shortfall is about (bins - 1) / (4 numel)).
    shortfalls = []
    for seed in range(20):
        g = torch.Generator().manual_seed(seed)
        a, b = torch.randn(numel, generator=g).abs(), torch.randn(numel, generator=g).abs()
        assert bhattacharyya(a, b, histogram_bins(numel)) >= BC_MIN
        shortfalls.append(1 - bhattacharyya(a, b, 64))
    if numel == 1024:
        assert sum(shortfalls) / len(shortfalls) > 1 - BC_MIN


def test_distinct_rows_drops_repeats_within_fp32_rounding():
    a, b, c = torch.tensor([1.0, -2.0]), torch.tensor([1.0, 2.0]), torch.tensor([1.0, 2.001])
    eps = torch.finfo(torch.float32).eps
    # A repeat reached at another position differs by a few eps of the gold's max-abs (2 here).
    gold = torch.stack([a, b, a + 4 * eps, c, b - 8 * eps, c])
    assert distinct_rows(gold).tolist() == [0, 1, 3]
    assert distinct_rows(gold[:1]).tolist() == [0]
    assert distinct_rows(gold[:0]).tolist() == []
    with pytest.raises(ValueError, match="no rows"):
        distinct_rows(torch.tensor(1.0))


def _looping_logits(repeats: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(target, gold, base): 16 distinct rows, then row 0 again ``repeats`` times (a greedy loop). The
    target's rounding is the base's elsewhere but twice as large on row 0, a single row's luck."""
    g = torch.Generator().manual_seed(0)
    distinct = torch.randn(16, 256, generator=g, dtype=F64)
    gold = torch.cat([distinct, distinct[:1].expand(repeats, -1)])
    base_err = 1e-3 * torch.randn(16, 256, generator=g, dtype=F64)
    target_err = base_err[torch.randperm(16, generator=g)]
    target_err[0] *= 2
    base = gold + torch.cat([base_err, base_err[:1].expand(repeats, -1)])
    target = gold + torch.cat([target_err, target_err[:1].expand(repeats, -1)])
    return target, gold, base


def test_rows_sample_each_distinct_state_once_for_sigma_and_bc():
    target, gold, base = _looping_logits(repeats=48)
    # Counted 49 times, row 0's unlucky rounding is most of the sample: the target's spread is larger.
    every = compare_three_way(target, gold, base, bins=histogram_bins(gold.numel()))
    assert every.sigma_ratio > 1.3 and every.bc < BC_MIN and not every.passed
    rows = distinct_rows(gold)
    assert rows.tolist() == list(range(16))
    r = compare_three_way(target, gold, base, rows=rows, bins=histogram_bins(16 * 256))
    assert r.passed and (r.rows, r.rows_sampled) == (64, 16)
    assert "sigma and bc over the 16 distinct of 64 rows" in str(r)
    # The worst case and the total still cover every row: an error at a repeat fails the comparison.
    target[40] = gold[40] + 100 * (base[40] - gold[40])
    bad = compare_three_way(target, gold, base, rows=rows, bins=histogram_bins(16 * 256))
    assert bad.linf_ratio > 5 and not bad.passed
