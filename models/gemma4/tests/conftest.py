"""Tiny random Gemma 4 checkpoints in the published multimodal layout (``Gemma4ForConditionalGeneration``:
the language model under ``model.language_model.*`` beside small vision and audio towers): the bundled tiny
config with its special features off (``PLAIN``) and a test's text-config overrides on top."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import transformers

from .test_conformance import FULL, MOE, PLAIN, SLIDING, SPEC, perturb

__all__ = ["DENSE_K_EQ_V", "FULL", "MOE", "PLE_KV_SHARED", "SLIDING", "build_hf", "hf_config", "perturb"]

# Variants on top of PLAIN.
DENSE_K_EQ_V = dict(attention_k_eq_v=True)
PLE_KV_SHARED = dict(
    layer_types=[SLIDING, FULL, SLIDING, SLIDING, FULL],
    num_hidden_layers=5,
    hidden_size_per_layer_input=8,
    num_kv_shared_layers=3,
    use_double_wide_mlp=True,
    attention_k_eq_v=True,
)


def hf_config(**text_overrides: Any) -> transformers.Gemma4Config:
    return SPEC.hf_config(text_config={**PLAIN, **text_overrides})


def text_config(**text_overrides: Any) -> transformers.Gemma4TextConfig:
    return hf_config(**text_overrides).text_config


def build_hf(seed: int = 0, **text_overrides: Any) -> transformers.Gemma4ForConditionalGeneration:
    return SPEC.build_hf(seed, text_config={**PLAIN, **text_overrides})


@pytest.fixture
def make_checkpoint(tmp_path: Path) -> Callable[..., tuple[Path, transformers.PreTrainedModel]]:
    return SPEC.checkpoint_factory(tmp_path, build=build_hf)
