"""Tiny random Llama checkpoints: the bundled tiny config with a test's overrides, saved with transformers
the way published ones are (the conformance spec in test_conformance.py builds them)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import transformers

from .test_conformance import SPEC

hf_config = SPEC.hf_config
build_hf = SPEC.build_hf
perturb = SPEC.perturb


@pytest.fixture
def make_checkpoint(tmp_path: Path) -> Callable[..., tuple[Path, transformers.LlamaForCausalLM]]:
    return SPEC.checkpoint_factory(tmp_path)
