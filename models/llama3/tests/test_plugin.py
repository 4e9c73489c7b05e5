"""Registration: the plugin is found through its entry point, and core resolves the architecture to it."""

from __future__ import annotations

import tomllib
from pathlib import Path

from trnmodels.core.plugins import discover_plugins, plugin_for_architecture

# The version this member's pyproject.toml declares: what the installed distribution must report.
VERSION = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())["project"]["version"]


def test_entry_point_announces_llama3():
    plugin = discover_plugins()["llama3"]
    assert plugin.architectures == ("LlamaForCausalLM",)
    assert plugin.version == VERSION
    assert plugin_for_architecture("LlamaForCausalLM") is plugin  # the entry point's own object


def test_factory_builds_the_model_class(make_checkpoint):
    from trnmodels.core.causal_lm import CausalLM, build_model
    from trnmodels.core.runtime_config import NeuronConfig
    from trnmodels.llama3.model import LlamaForCausalLM

    ckpt, _ = make_checkpoint()
    model = build_model(ckpt, NeuronConfig(), load=False)
    assert isinstance(model, LlamaForCausalLM) and isinstance(model, CausalLM)
    spec = model.get_kv_spec()
    assert [layer.name for layer in spec.layers] == ["layers.0.self_attn", "layers.1.self_attn"]
    assert {(layer.num_kv_heads, layer.head_dim) for layer in spec.layers} == {(2, 16)}
