"""The vLLM serving benchmark's pure helpers: combining rounds and the verdicts. No server."""

from __future__ import annotations

import pytest

from benchmarks.vllm_serving import COMPILED_TARGET, median_of_rounds, quiet_starts, verdict


def _round(tok_s: float, ttft: float, b1: float) -> dict:
    return {
        "output_tokens_per_s": tok_s,
        "ttft_median_ms": ttft,
        "decode": {"1": {"tpot_median_ms": 1000 / b1, "decode_tokens_per_s": b1}},
    }


def test_median_of_rounds_takes_each_figure_median_and_keeps_the_rounds() -> None:
    rounds = [_round(300.0, 40.0, 50.0), _round(100.0, 90.0, 80.0), _round(200.0, 10.0, 60.0)]
    combined = median_of_rounds(rounds)
    # Per figure, not the round with the median throughput: 200 tok/s (round 3) with TTFT 40 (round 1).
    assert combined["output_tokens_per_s"] == 200.0
    assert combined["ttft_median_ms"] == 40.0
    assert combined["decode"]["1"]["decode_tokens_per_s"] == 60.0
    assert combined["decode"]["1"]["tpot_median_ms"] == pytest.approx(1000 / 60)
    assert combined["rounds"] == rounds


@pytest.mark.parametrize(
    ("mine", "target", "expected"),
    [
        (100.0, 1.0, "met"),
        (99.9, 1.0, "missed"),
        (90.0, COMPILED_TARGET, "met"),
        (89.9, COMPILED_TARGET, "missed"),
    ],
)
def test_verdict_against_the_target_ratio(mine: float, target: float, expected: str) -> None:
    assert verdict({"output_tokens_per_s": mine}, {"output_tokens_per_s": 100.0}, target) == expected


def test_quiet_starts_reports_the_longest_wait_and_every_busy_start() -> None:
    def measured(wait: float, busy: float) -> dict[str, float]:
        return {"quiet_wait_seconds": wait, "busy_cores_before": busy}

    quiet = {
        "a": {"rounds": [measured(0.5, 0.02), measured(1.5, 0.1)]},
        "b": {"rounds": [measured(1.0, 0.0)]},
    }
    assert quiet_starts(quiet).endswith("the longest wait was 1.5 s, and all 3 started quiet.")
    busy = quiet | {"c": {"rounds": [measured(30.0, 0.9)]}}
    assert quiet_starts(busy).endswith(
        "the longest wait was 30.0 s; 1 of 4 started on a busy machine after waiting 30 s."
    )
    assert (
        quiet_starts({"vllm": {"error": "did not start"}}) == "Measurements did not wait for a quiet machine."
    )
