"""In-graph sampling against hand-computed expectations, and its CPU kernel against the reference."""

from __future__ import annotations

import pytest
import torch

from trnmodels.core.ops import gumbel_noise, sample
from trnmodels.core.ops.dispatch import cpu_kernels_in_graphs, select_backend

LOGITS = torch.tensor([[2.0, 1.0, 0.5, -1.0, 3.0]])


def draw(logits, temperature, top_k, top_p, n=4000, seed=0):
    g = torch.Generator().manual_seed(seed)
    rows = logits.expand(n, -1)
    noise = torch.stack([gumbel_noise(logits.shape[-1], g) for _ in range(n)])
    full = lambda v, dt=torch.float32: torch.full((n,), v, dtype=dt)  # noqa: E731
    return sample(rows, full(temperature), full(top_k, torch.int64), full(top_p), noise)


def test_temperature_zero_is_argmax_whatever_the_noise():
    noise = torch.randn(1, 5) * 100
    out = sample(LOGITS, torch.tensor([0.0]), torch.tensor([0]), torch.tensor([1.0]), noise)
    assert out.tolist() == [4]


def test_top_k_one_is_greedy():
    assert set(draw(LOGITS, 1.0, 1, 1.0, n=200).tolist()) == {4}


def test_top_k_restricts_to_the_k_best():
    assert set(draw(LOGITS, 1.0, 2, 1.0, n=500).tolist()) == {0, 4}


def test_top_p_nucleus():
    probs = torch.softmax(LOGITS[0], -1)  # sorted: 4 (0.61), 0 (0.22), 1 (0.08), ...
    assert probs[4] < 0.7 < probs[4] + probs[0]
    assert set(draw(LOGITS, 1.0, 0, 0.7, n=500).tolist()) == {0, 4}
    assert set(draw(LOGITS, 1.0, 0, 0.5, n=200).tolist()) == {4}


def test_gumbel_max_samples_the_softmax():
    """Frequencies over many draws approach softmax(logits / T) (4000 draws: ±0.03 at 3 sigma)."""
    for temperature in (1.0, 2.0):
        counts = torch.bincount(draw(LOGITS, temperature, 0, 1.0), minlength=5).float() / 4000
        expected = torch.softmax(LOGITS[0] / temperature, -1)
        assert (counts - expected).abs().max() < 0.03, (temperature, counts, expected)


def test_rows_are_independent():
    logits = torch.stack([LOGITS[0], LOGITS[0].flip(0)])
    out = sample(
        logits, torch.tensor([0.0, 0.0]), torch.tensor([0, 0]), torch.tensor([1.0, 1.0]), torch.zeros(2, 5)
    )
    assert out.tolist() == [4, 0]


def test_request_seeds_cover_every_64_bit_seed_and_index():
    """Any seed in [0, 2**64 - 1] and any batch index gives a seed torch accepts; (seed, index) pairs differ."""
    from trnmodels.core.runner.engine import request_seed

    seeds = [0, 1, 2**62, 2**63 - 1, 2**63, 2**64 - 1]
    derived = {request_seed(s, i) for s in seeds for i in (0, 1, 10**6)}
    assert len(derived) == 3 * len(seeds)
    for value in derived:
        torch.Generator().manual_seed(value)
    assert request_seed(2**64 - 1, 3) == request_seed(2**64 - 1, 3)


def test_sampling_params_refuse_non_finite_and_out_of_range_values():
    import pytest

    from trnmodels.core.errors import InputError
    from trnmodels.core.runner.config import SamplingParams

    for bad in (
        dict(temperature=float("nan")),
        dict(temperature=float("inf")),
        dict(top_p=float("nan")),
        dict(seed=-1),
        dict(seed=2**64),
    ):
        with pytest.raises(InputError):
            SamplingParams(**bad)
    SamplingParams(temperature=1.0, seed=2**64 - 1)


def test_step_graph_flags_rows_whose_logits_are_not_finite():
    from trnmodels.core.runner.graphs import finite_rows

    logits = torch.tensor([[0.0, 1.0], [float("nan"), 1.0], [0.0, float("inf")], [float("-inf"), 0.0]])
    assert finite_rows(logits).tolist() == [True, False, False, False]
    # A vocabulary-wide row: a bad value in the vectorised body or in the tail, alone or with the others.
    wide = torch.randn(8, 49157)
    for row, (column, value) in enumerate(
        [(40000, float("nan")), (49156, float("nan")), (7, float("inf")), (49155, float("-inf"))]
    ):
        wide[2 * row + 1, column] = value
    wide[7, :3] = torch.tensor([float("inf"), float("-inf"), float("nan")])
    assert finite_rows(wide).tolist() == [True, False, True, False, True, False, True, False]
    assert finite_rows(wide).tolist() == torch.isfinite(wide).all(dim=-1).tolist()


def test_greedy_kernel_takes_the_first_of_equal_largest_logits_as_argmax_does():
    from trnmodels.core.cpu.sampling import _greedy

    logits = torch.randn(4, 49157)
    logits[0, [5, 70, 49000]] = 9.0
    logits[1, [48999, 49156]] = 9.0
    logits[2, [3, 40000]] = float("nan")
    assert _greedy(logits).tolist()[:3] == [5, 48999, 3]
    assert torch.equal(_greedy(logits), logits.argmax(dim=-1))


# --------------------------------------------------------------------------------------------------
# The CPU kernel: the reference's tokens, without the sort when no row samples
# --------------------------------------------------------------------------------------------------


def _batch(temperatures, vocab=97, seed=0):
    g = torch.Generator().manual_seed(seed)
    n = len(temperatures)
    logits = torch.randn(n, vocab, generator=g) * 3
    noise = torch.stack([gumbel_noise(vocab, g) for _ in range(n)])
    top_k = torch.tensor([0, 5, 1, 0, 12, 0][:n])
    top_p = torch.tensor([1.0, 0.9, 1.0, 0.6, 0.8, 0.95][:n])
    return logits, torch.tensor(temperatures), top_k, top_p, noise


@pytest.mark.parametrize(
    "temperatures",
    [[0.0] * 6, [0.0, 0.7, 0.0, 1.3, 0.0, 0.0], [0.5, 0.7, 1.0, 1.3, 2.0, 0.9]],
    ids=["greedy", "mixed", "sampled"],
)
def test_cpu_kernel_draws_the_reference_tokens(temperatures):
    assert select_backend("sample", *_batch(temperatures)) == "cpu"
    for seed in range(5):
        batch = _batch(temperatures, seed=seed)
        assert sample(*batch).tolist() == sample.reference(*batch).tolist()


def test_a_greedy_batch_skips_the_sort_and_a_sampling_batch_does_not(monkeypatch):
    calls = []

    def counting_reference(*args):
        calls.append(args)
        return reference(*args)

    reference = sample.reference
    monkeypatch.setattr(sample, "reference", counting_reference)
    sample(*_batch([0.0] * 6))
    assert calls == []
    sample(*_batch([0.0, 0.0, 0.0, 0.0, 0.0, 0.4]))
    assert len(calls) == 1


class _Sampler(torch.nn.Module):
    def forward(self, logits, temperature, top_k, top_p, noise):
        return sample(logits, temperature, top_k, top_p, noise)


@pytest.mark.parametrize(("kernels", "branches"), [("all", True), ("none", False)])
def test_capture_takes_the_kernel_with_both_branches(monkeypatch, kernels, branches):
    """The kernel is static (``torch.cond``), so a CPU graph captures it; with the kernel turned off
    the graph keeps the reference's unconditional sort."""
    monkeypatch.setenv("TRNMODELS_CPU_KERNELS", kernels)
    assert ("sample" in cpu_kernels_in_graphs()) is branches
    program = torch.export.export(_Sampler(), _batch([0.0] * 6), strict=True)
    assert ("torch.ops.higher_order.cond" in program.graph_module.code) is branches
    for temperatures in ([0.0] * 6, [0.0, 0.7, 0.0, 1.3, 0.0, 0.0]):
        batch = _batch(temperatures, seed=3)
        assert program.module()(*batch).tolist() == sample.reference(*batch).tolist()
