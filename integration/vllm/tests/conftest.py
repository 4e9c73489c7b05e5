"""The ``tiny`` fixture: one tiny checkpoint per installed LLM plugin (see ``vllm_harness``)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

# Tests are imported with --import-mode=importlib; the shared harness is imported from this folder.
sys.path.insert(0, str(Path(__file__).parent))

from vllm_harness import PLUGINS, TinyCheckpoint, run_offline


@pytest.fixture(scope="session", params=sorted(PLUGINS))
def tiny(request, tmp_path_factory) -> TinyCheckpoint:
    case = PLUGINS[request.param]
    return TinyCheckpoint(request.param, case.build(tmp_path_factory.mktemp(f"tiny-{request.param}")), case)


@pytest.fixture(scope="session")
def offline(tiny: TinyCheckpoint, tmp_path_factory) -> dict:
    """The plugin's offline greedy outputs (``vllm.LLM``), shared by the offline and online tests."""
    return run_offline(tiny.path, tmp_path_factory.mktemp(f"offline-{tiny.plugin}"))
