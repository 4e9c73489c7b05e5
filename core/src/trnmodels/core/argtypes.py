"""Argument types shared by every ``trnmodels`` subcommand: each rejects a bad value with a message that
names what is accepted, so argparse reports it as one line (exit 2) before any work starts.

Floats must be finite: ``nan`` compares false with every bound, so a range check alone would let it through
(``--temperature nan`` used to run greedy, ``--guidance-scale nan`` switched guidance off).
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

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


def finite_float(
    low: float | None = None, high: float | None = None, *, low_open: bool = False, high_open: bool = False
) -> Callable[[str], float]:
    """A float type accepting finite values in ``[low, high]`` (``low_open``/``high_open`` exclude the end)."""
    left = "(" if low_open else "["
    right = ")" if high_open else "]"
    span = f" in {left}{'-inf' if low is None else low}, {'inf' if high is None else high}{right}"
    accepted = "a finite number" + (span if low is not None or high is not None else "")

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {accepted}, got {text!r}") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"expected {accepted}, got {text}")
        too_low = low is not None and (value <= low if low_open else value < low)
        too_high = high is not None and (value >= high if high_open else value > high)
        if too_low or too_high:
            raise argparse.ArgumentTypeError(f"expected {accepted}, got {value:g}")
        return value

    parse.__name__ = "finite float"  # argparse names the type in some messages
    return parse


def int_list(text: str) -> tuple[int, ...]:
    """Comma-separated integers, at least one (``1,2,3``)."""
    try:
        ids = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not ids:
        raise argparse.ArgumentTypeError("expected at least one integer")
    return ids
