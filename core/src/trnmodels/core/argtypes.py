"""Argument types shared by every ``trnmodels`` subcommand: each rejects a bad value with a message that
names what is accepted, so argparse reports it as one line (exit 2) before any work starts.

Floats must be finite: ``nan`` compares false with every bound, so a range check alone would let it through
(``--temperature nan`` used to run greedy, ``--guidance-scale nan`` switched guidance off).
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass

SEED_RANGE = (0, (1 << 64) - 1)  # what torch.Generator.manual_seed accepts


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def nonnegative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {value}")
    return value


def seed(text: str) -> int:
    lo, hi = SEED_RANGE
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected an integer seed in [{lo}, 2**64 - 1], got {text!r}"
        ) from None
    if not lo <= value <= hi:
        raise argparse.ArgumentTypeError(f"expected an integer seed in [{lo}, 2**64 - 1], got {value}")
    return value


@dataclass(frozen=True)
class FiniteFloat:
    """A float type accepting finite values in ``[low, high]`` (``low_open``/``high_open`` exclude the end;
    a missing bound is infinite). The bounds stay readable, so tests can probe the edges a flag refuses."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    __name__ = "finite float"  # argparse names the type in some messages

    @property
    def accepted(self) -> str:
        if self.low is None and self.high is None:
            return "a finite number"
        left, right = "(" if self.low_open else "[", ")" if self.high_open else "]"
        low = "-inf" if self.low is None else self.low
        high = "inf" if self.high is None else self.high
        return f"a finite number in {left}{low}, {high}{right}"

    def __call__(self, text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {self.accepted}, got {text!r}") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"expected {self.accepted}, got {text}")
        low, high = self.low, self.high
        too_low = low is not None and (value <= low if self.low_open else value < low)
        too_high = high is not None and (value >= high if self.high_open else value > high)
        if too_low or too_high:
            raise argparse.ArgumentTypeError(f"expected {self.accepted}, got {value:g}")
        return value


def finite_float(
    low: float | None = None, high: float | None = None, *, low_open: bool = False, high_open: bool = False
) -> FiniteFloat:
    """A float type accepting finite values in ``[low, high]`` (``low_open``/``high_open`` exclude the end)."""
    return FiniteFloat(low, high, low_open, high_open)


def int_list(text: str) -> tuple[int, ...]:
    """Comma-separated integers, at least one (``1,2,3``)."""
    try:
        ids = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not ids:
        raise argparse.ArgumentTypeError("expected at least one integer")
    return ids
