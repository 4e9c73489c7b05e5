"""Perplexity text every machine has without a network: module docstrings of Python's standard library.

Read at run time from the standard library's source files (parsed with ``ast``, never imported), for a
fixed, sorted list of pure-Python modules present in every CPython from 3.11 on, taken in order while
they fit a character budget (whole docstrings only: one that would overflow it is skipped). The text therefore depends on the Python version
only; the report names it.
"""

from __future__ import annotations

import ast
import sysconfig
from pathlib import Path
from typing import Any

MODULES = (
    "argparse",
    "ast",
    "cmd",
    "codeop",
    "configparser",
    "copy",
    "difflib",
    "doctest",
    "fileinput",
    "heapq",
    "inspect",
    "io",
    "os",
    "pdb",
    "plistlib",
    "pyclbr",
    "pydoc",
    "random",
    "rlcompleter",
    "sched",
    "shelve",
    "site",
    "socket",
    "socketserver",
    "statistics",
    "subprocess",
    "tempfile",
    "timeit",
    "tokenize",
    "typing",
    "uuid",
    "wave",
)
# About 3,000 SmolLM2 tokens: well under a minute per configuration for a 135M model on two quiet cores.
MAX_CHARS = 12_000


def module_docstring(name: str) -> str | None:
    path = Path(sysconfig.get_paths()["stdlib"]) / f"{name}.py"
    if not path.is_file():
        return None
    return ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")), clean=True)


def documents(max_chars: int = MAX_CHARS) -> list[dict[str, str]]:
    """``[{"module", "text"}]`` in ``MODULES`` order: each whole docstring that still fits ``max_chars``."""
    docs, total = [], 0
    for name in MODULES:
        text = module_docstring(name)
        if not text or total + len(text) > max_chars:
            continue
        docs.append({"module": name, "text": text})
        total += len(text)
    return docs


def load(max_chars: int = MAX_CHARS, **_: Any):
    """``{"test": Dataset}`` of the docstrings (``max_chars`` may be set through lm_eval's metadata)."""
    import datasets

    docs = documents(int(max_chars))
    if not docs:
        raise RuntimeError(f"no standard-library docstrings found under {sysconfig.get_paths()['stdlib']}")
    return {"test": datasets.Dataset.from_list(docs)}
