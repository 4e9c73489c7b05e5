"""The bad-input cases the CLI is tested against, and the docs table made from them.

Each test folder that checks a CLI error keeps its cases in a data-only module ``bad_inputs.py`` (a list
``BAD_INPUTS`` of ``BadInput``) and parametrizes its tests over it; ``docs/bad-inputs.md`` is rendered from
every such list (``render_table``), and core's tests fail when the page and the cases disagree.

The edges of every numeric flag are generated rather than listed (``numeric_flag_cases``): each flag of a
command whose type is one of ``trnmodels.core.argtypes``' gets the values just outside what that type
accepts, with the words argparse must print for them, written out here from the type's bounds.
"""

from __future__ import annotations

import argparse
import importlib.util
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import argtypes


@dataclass(frozen=True)
class BadInput:
    """``command``: the subcommand (``logits``, ``generate``, ``compile``, ``video``); ``input``: what the user
    gives, as the docs show it; ``message``: the part of the one-line error a test asserts (the user sees
    ``trnmodels COMMAND: error: ...`` or argparse's ``trnmodels COMMAND: error: argument ...``)."""

    command: str
    input: str
    message: str


# What the user is told each integer type accepts, and the values just outside it (written out, not read
# from the types, so a changed message or bound fails the tests).
_INTEGER_EDGES: dict[Callable[[str], int], tuple[str, tuple[str, ...]]] = {
    argtypes.positive_int: ("a positive integer", ("0",)),
    argtypes.nonnegative_int: ("an integer >= 0", ("-1",)),
    argtypes.seed: ("an integer seed in [0, 2**64 - 1]", ("-1", str(1 << 64))),
}


def _float_edges(t: argtypes.FiniteFloat) -> tuple[str, tuple[str, ...]]:
    """A finite-float type's words and refused values: nan, inf, and each finite bound stepped outside
    (the bound itself where it is open)."""
    values = ["nan", "inf"]
    if t.low is not None:
        values.append(f"{t.low if t.low_open else t.low - 1:g}")
    if t.high is not None:
        values.append(f"{t.high if t.high_open else t.high + 0.5:g}")
    if t.low is None and t.high is None:
        return "a finite number", tuple(values)
    low = "-inf" if t.low is None else f"{t.low:g}"
    high = "inf" if t.high is None else f"{t.high:g}"
    span = f"{'(' if t.low_open else '['}{low}, {high}{')' if t.high_open else ']'}"
    return f"a finite number in {span}", tuple(values)


def _edges(argtype: Any) -> tuple[str, tuple[str, ...]] | None:
    if isinstance(argtype, argtypes.FiniteFloat):
        return _float_edges(argtype)
    return _INTEGER_EDGES.get(argtype)


def numeric_flag_cases(command: str) -> list[BadInput]:
    """For each flag of ``trnmodels COMMAND`` typed by ``trnmodels.core.argtypes``, every value just outside
    what it accepts and argparse's line for it: ``argument FLAG: expected WHAT, got VALUE``."""
    from ..cli import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    cases = []
    for action in sub.choices[command]._actions:
        edges = _edges(action.type)
        if edges is None or not action.option_strings:
            continue
        flag, (accepted, values) = action.option_strings[0], edges
        cases += [
            BadInput(command, f"{flag} {v}", f"argument {flag}: expected {accepted}, got {v}") for v in values
        ]
    return cases


def check_one_line_error(code: int, stderr: str, case: BadInput) -> None:
    """The CLI's contract for bad input: exit 2, one line on stderr naming the problem, no traceback."""
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert code == 2, f"{case.input}: exit {code}, expected 2; stderr: {stderr}"
    assert "Traceback" not in stderr, f"{case.input}: traceback on stderr:\n{stderr}"
    errors = [line for line in lines if "error:" in line]
    assert len(errors) == 1, f"{case.input}: expected one error line, got:\n{stderr}"
    assert case.message in errors[0], f"{case.input}: {case.message!r} not in {errors[0]!r}"


def load_cases(files: Iterable[Path]) -> list[BadInput]:
    cases: list[BadInput] = []
    for path in sorted(files):
        spec = importlib.util.spec_from_file_location(f"_bad_inputs_{abs(hash(path))}", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        cases.extend(module.BAD_INPUTS)
    return cases


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render_table(cases: Sequence[BadInput]) -> str:
    rows = sorted(cases, key=lambda c: (c.command, c.input))
    lines = ["| command | input | what the user sees (exit 2) |", "|---|---|---|"]
    lines += [f"| `{c.command}` | {_cell(c.input)} | `{_cell(c.message)}` |" for c in rows]
    return "\n".join(lines) + "\n"
