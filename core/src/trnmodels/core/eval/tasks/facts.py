"""The facts set: 4-choice general-knowledge questions the project wrote (``facts.jsonl`` beside this file).

lm_eval resolves a YAML ``data_files`` path against the working directory, so the task loads the file
through this function instead: ``datasets``' own ``json`` builder, given the file's absolute path.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

FACTS = Path(__file__).with_name("facts.jsonl")


def load(**_: Any):
    """``{"test": Dataset}`` of ``{"id", "question", "choices" (4), "answer" (index)}`` rows."""
    import datasets

    return datasets.load_dataset("json", data_files={"test": str(FACTS)})
