"""Registration: the plugin is found through its entry point, and core resolves the architecture to it."""

from __future__ import annotations

import tomllib
from pathlib import Path

from trnmodels.core.plugins import discover_plugins, plugin_for_architecture

# The version this member's pyproject.toml declares: what the installed distribution must report.
VERSION = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())["project"]["version"]


def test_entry_point_announces_gpt_oss():
    plugin = discover_plugins()["gpt_oss"]
    assert plugin.architectures == ("GptOssForCausalLM",)
    assert plugin.version == VERSION
    assert plugin_for_architecture("GptOssForCausalLM") == plugin


def test_factory_builds_the_model_with_windowed_kv_spec(make_checkpoint):
    from trnmodels.core.causal_lm import CausalLM, build_model
    from trnmodels.core.runtime_config import NeuronConfig
    from trnmodels.gpt_oss.model import GptOssForCausalLM

    ckpt, _ = make_checkpoint(num_hidden_layers=4, layer_types=None)  # the default alternation
    model = build_model(ckpt, NeuronConfig(), load=False)
    assert isinstance(model, GptOssForCausalLM) and isinstance(model, CausalLM)
    spec = model.get_kv_spec()
    assert [(s.name, s.num_kv_heads, s.head_dim, s.sliding_window) for s in spec.layers] == [
        (f"layers.{i}.self_attn", 2, 64, 8 if i % 2 == 0 else None) for i in range(4)
    ]
