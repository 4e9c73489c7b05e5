"""Expert routing recorded from one run and replayed in another: teacher forcing for MoE routing.

Validation feeds the reference's tokens back so one argmax flip does not cascade; routing has the same
discrete step. Where two experts' router logits nearly tie, BF16 rounding alone can pick the other one,
and the whole token then runs through a different expert: an error no arithmetic tolerance should
judge, since HF's own BF16 model breaks such ties its own (equally arbitrary) way. So the BF16 run
replays the expert picks of the FP32 run (which is itself checked against HF FP32), computing the
routing weights from its own logits, and counts the picks it would have made otherwise.

Every rank computes every token's routing (the router is replicated), so one trace serves every rank.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch


@dataclass
class RouteTrace:
    """The expert picks ``[T, k]`` of each ``ops.route`` call, in call order.

    ``replay=False`` records; ``replay=True`` forces the recorded picks and counts, in ``differing``,
    the (token, call) choices whose set of experts the run would have picked otherwise, of ``choices``.
    """

    picks: list[torch.Tensor] = field(default_factory=list)
    replay: bool = False
    calls: int = 0
    differing: int = 0
    choices: int = 0

    def replayed(self) -> RouteTrace:
        """A fresh trace that forces these picks."""
        return RouteTrace(picks=self.picks, replay=True)

    def apply(
        self, logits: torch.Tensor, weights: torch.Tensor, experts: torch.Tensor, softmax_first: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        call = self.calls
        self.calls += 1
        self.choices += experts.shape[0]
        if not self.replay:
            self.picks.append(experts.detach().clone())
            return weights, experts
        if call >= len(self.picks) or self.picks[call].shape != experts.shape:
            recorded = list(self.picks[call].shape) if call < len(self.picks) else "nothing"
            raise RuntimeError(
                f"route trace: call {call} routes {list(experts.shape)} but the recorded run had {recorded}; "
                "a replay needs the same model and token sequence"
            )
        forced = self.picks[call]
        self.differing += int((experts.sort(-1).values != forced.sort(-1).values).any(-1).sum())
        if softmax_first:
            probs = torch.softmax(logits.float(), dim=-1).gather(-1, forced)
            return (probs / probs.sum(-1, keepdim=True)).to(logits.dtype), forced
        return torch.softmax(logits.gather(-1, forced), dim=-1, dtype=logits.dtype), forced


_active: RouteTrace | None = None


def active_trace() -> RouteTrace | None:
    return _active


@contextmanager
def tracing_routes(trace: RouteTrace | None) -> Iterator[RouteTrace | None]:
    """Within the block, every ``ops.route`` records into (or replays from) ``trace``; ``None`` does nothing."""
    global _active
    previous, _active = _active, trace
    try:
        yield trace
    finally:
        _active = previous
