"""Tiny random gpt-oss checkpoints: the bundled tiny config with a test's overrides, saved with transformers
the way published ones are (MXFP4 experts: core's ``quantize_checkpoint_mxfp4``)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import transformers

from .test_conformance import SPEC, perturb

__all__ = ["build_hf", "hf_config", "perturb"]

hf_config = SPEC.hf_config
build_hf = SPEC.build_hf


@pytest.fixture
def make_checkpoint(tmp_path: Path) -> Callable[..., tuple[Path, transformers.GptOssForCausalLM]]:
    return SPEC.checkpoint_factory(tmp_path)
