"""Teacher-forced routing: picks recorded from one run are replayed in another, with hand-computed weights."""

from __future__ import annotations

import math

import pytest
import torch

from trnmodels.core import ops
from trnmodels.core.ops.route_trace import RouteTrace, tracing_routes

RECORDED = torch.tensor([[2.0, 1.0, 0.0, -1.0], [0.0, 3.0, 1.0, 2.0]])
# Token 0's second and third experts now tie the other way round; token 1 keeps its picks.
REPLAYED = torch.tensor([[2.0, 0.5, 0.6, -1.0], [0.0, 3.0, 1.0, 2.0]])


def test_outside_a_trace_route_is_unchanged() -> None:
    weights, experts = ops.route(REPLAYED, 2)
    assert experts.tolist() == [[0, 2], [1, 3]]
    assert weights[0].tolist() == pytest.approx([1 / (1 + math.exp(-1.4)), 1 / (1 + math.exp(1.4))])


@pytest.mark.parametrize("softmax_first", [False, True])
def test_a_replay_forces_the_recorded_picks_and_counts_the_ones_it_would_change(softmax_first: bool) -> None:
    with tracing_routes(RouteTrace()) as recorded:
        ops.route(RECORDED, 2, softmax_first=softmax_first)
    assert recorded.picks[0].tolist() == [[0, 1], [1, 3]]

    with tracing_routes(recorded.replayed()) as replay:
        weights, experts = ops.route(REPLAYED, 2, softmax_first=softmax_first)
    assert experts.tolist() == [[0, 1], [1, 3]]
    # Either rule gives softmax over the two kept logits (a softmax over all, renormalised, is the same).
    assert weights[0].tolist() == pytest.approx([1 / (1 + math.exp(-1.5)), 1 / (1 + math.exp(1.5))])
    assert weights[1].tolist() == pytest.approx([1 / (1 + math.exp(-1.0)), 1 / (1 + math.exp(1.0))])
    assert (replay.calls, replay.differing, replay.choices) == (1, 1, 2)
    assert not recorded.replay and recorded.calls == 1


def test_a_replay_of_another_sequence_is_refused_naming_the_call() -> None:
    with tracing_routes(RouteTrace()) as recorded:
        ops.route(RECORDED, 2)
    with tracing_routes(recorded.replayed()), pytest.raises(RuntimeError, match=r"call 0 routes \[3, 2\]"):
        ops.route(torch.zeros(3, 4), 2)
    with tracing_routes(recorded.replayed()), pytest.raises(RuntimeError, match=r"call 1 .* had nothing"):
        ops.route(RECORDED, 2)
        ops.route(RECORDED, 2)
