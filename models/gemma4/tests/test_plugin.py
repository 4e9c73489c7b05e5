"""Registration: the plugin is found through its entry point, and core resolves both architectures to it."""

from __future__ import annotations

import tomllib
from pathlib import Path

from trnmodels.core.plugins import discover_plugins, plugin_for_architecture

# The version this member's pyproject.toml declares: what the installed distribution must report.
VERSION = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())["project"]["version"]


def test_entry_point_announces_gemma4():
    plugin = discover_plugins()["gemma4"]
    assert plugin.architectures == ("Gemma4ForConditionalGeneration", "Gemma4ForCausalLM")
    assert plugin.version == VERSION
    assert plugin_for_architecture("Gemma4ForConditionalGeneration") == plugin
    assert plugin_for_architecture("Gemma4ForCausalLM") == plugin
    assert (plugin.bundled_config_dir("tiny") / "config.json").is_file()
    assert (plugin.bundled_config_dir("bench") / "config.json").is_file()


def test_text_only_causal_lm_layout_matches_hf(tmp_path):
    """``Gemma4ForCausalLM`` exports keep the text model under ``model.*`` (no towers)."""
    import torch
    import transformers

    from trnmodels.core.accuracy import hf_logits
    from trnmodels.core.runner.score import score_checkpoint
    from trnmodels.core.testing import save_checkpoint

    from .conftest import PLE_KV_SHARED, perturb, text_config

    torch.manual_seed(0)
    hf = transformers.Gemma4ForCausalLM(text_config(**PLE_KV_SHARED)).eval()
    perturb(hf, 0)
    ckpt = save_checkpoint(hf, tmp_path / "causal")
    ids = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7]
    assert (score_checkpoint(ckpt, ids, 4) - hf_logits(hf, ids)).abs().max() <= 1e-4
