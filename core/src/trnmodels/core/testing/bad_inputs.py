"""The bad-input cases the CLI is tested against, and the docs table made from them.

Each test folder that checks a CLI error keeps its cases in a data-only module ``bad_inputs.py`` (a list
``BAD_INPUTS`` of ``BadInput``) and parametrizes its tests over it; ``docs/bad-inputs.md`` is rendered from
every such list (``render_table``), and core's tests fail when the page and the cases disagree.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class BadInput:
    """``command``: the subcommand (``logits``, ``generate``, ``compile``, ``video``); ``input``: what the user
    gives, as the docs show it; ``message``: the part of the one-line error a test asserts (the user sees
    ``trnmodels COMMAND: error: ...`` or argparse's ``trnmodels COMMAND: error: argument ...``)."""

    command: str
    input: str
    message: str


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
