"""Tiny random gpt-oss checkpoints: the bundled tiny config with a test's overrides, saved with transformers
the way published ones are (MXFP4 experts: ``quantize_like_published``)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import transformers

from trnmodels.core.testing import quantize_checkpoint_mxfp4
from trnmodels.core.testing.published import published_config

from .test_conformance import SPEC, perturb

__all__ = ["build_hf", "hf_config", "perturb", "quantize_like_published"]

# gpt-oss publishes its experts' weights in MXFP4 and names what stays BF16 in its quantization_config.
EXPERT_WEIGHTS = ("gate_up_proj", "down_proj")
PUBLISHED_QUANTIZATION = published_config("gpt-oss-20b")["quantization_config"]

hf_config = SPEC.hf_config
build_hf = SPEC.build_hf


def quantize_like_published(src: Path, dst: Path) -> Path:
    """A copy of the BF16 checkpoint ``src`` with its experts in MXFP4, laid out as gpt-oss publishes."""
    return quantize_checkpoint_mxfp4(
        src,
        dst,
        weights=EXPERT_WEIGHTS,
        modules_to_not_convert=PUBLISHED_QUANTIZATION["modules_to_not_convert"],
    )


@pytest.fixture
def make_checkpoint(tmp_path: Path) -> Callable[..., tuple[Path, transformers.GptOssForCausalLM]]:
    return SPEC.checkpoint_factory(tmp_path)
