"""Fixtures shared by core's tests."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def _pristine_llama_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from trnmodels.core.testing import save_random_checkpoint
    from trnmodels.llama3 import PLUGIN

    out = tmp_path_factory.mktemp("llama_tiny") / "ckpt"
    return save_random_checkpoint(PLUGIN.bundled_config_dir("tiny"), out, with_tokenizer=False)


@pytest.fixture
def llama_checkpoint(_pristine_llama_checkpoint: Path, tmp_path: Path) -> Path:
    """A fresh copy (the test may damage it) of a random checkpoint of the llama3 plugin's bundled tiny
    config, saved by transformers as one ``model.safetensors``. Read sizes from its ``config.json``."""
    return Path(shutil.copytree(_pristine_llama_checkpoint, tmp_path / "ckpt"))
