"""The published configs bundled with core (this folder; sources in its README.md).

A name is a folder here: ``Llama-3.1-8B``, or ``name/component`` for one component of a diffusers
pipeline (``Wan2.2-T2V-A14B-Diffusers/transformer``). Reading them needs no torch: ``trnmodels diff``,
``plan`` and ``new`` resolve names here, and the tests shrink them (``trnmodels.core.testing.published``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

PUBLISHED_DIR = Path(__file__).resolve().parent


def published_names() -> list[str]:
    """The bundled checkpoints, e.g. ``Llama-3.1-8B`` (a component folder is ``name/component``)."""
    return sorted(str(p.parent.relative_to(PUBLISHED_DIR)) for p in PUBLISHED_DIR.rglob("config.json"))


def published_config(name: str) -> dict[str, Any]:
    """The ``config.json`` of a bundled published checkpoint (or ``name/component``), verbatim."""
    path = PUBLISHED_DIR / name / "config.json"
    if not path.is_file():
        raise KeyError(f"no published config {name!r}; bundled: {', '.join(published_names())}")
    return json.loads(path.read_text())
