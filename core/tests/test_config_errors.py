"""A checkpoint's ``config.json`` that core cannot serve, or a mesh it cannot split, is refused by
``build_model`` / ``check_model_config`` with an error that names the problem (before any weight loads).

The checkpoint is the llama3 plugin's bundled tiny config (fixture ``llama_checkpoint``) with one defect.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trnmodels.core.causal_lm import build_model, check_model_config
from trnmodels.core.errors import ConfigError, ShardingError
from trnmodels.core.parallel import init_parallel_state
from trnmodels.core.plugins import discover_plugins
from trnmodels.core.runtime_config import NeuronConfig


def edit_config(ckpt: Path, **changes) -> None:
    """Set each field of ``config.json`` (``None`` removes it)."""
    path = ckpt / "config.json"
    data = json.loads(path.read_text())
    for key, value in changes.items():
        if value is None:
            data.pop(key, None)
        else:
            data[key] = value
    path.write_text(json.dumps(data))


def test_malformed_config_json(llama_checkpoint):
    (llama_checkpoint / "config.json").write_text('{"architectures": ["LlamaForCausalLM"],,}')
    with pytest.raises(ConfigError, match=r"config\.json: malformed JSON at line 1, column"):
        build_model(llama_checkpoint, NeuronConfig())


@pytest.mark.parametrize(
    ("changes", "field", "value"),
    [
        ({"rms_norm_eps": float("nan")}, "rms_norm_eps", "nan"),
        ({"rope_theta": float("inf")}, "rope_theta", "inf"),
        ({"rope_parameters": {"rope_type": "default", "rope_theta": float("-inf")}}, "rope_theta", "-inf"),
    ],
)
def test_a_non_finite_number_in_config_json_is_refused_naming_file_and_field(
    llama_checkpoint, changes, field, value
):
    # json.dumps writes NaN/Infinity, which Python's json reads back without complaint.
    edit_config(llama_checkpoint, **changes)
    path = llama_checkpoint / "config.json"
    with pytest.raises(ConfigError, match=rf"{path}: (\S+\.)?{field}: expected a finite number, got {value}"):
        build_model(llama_checkpoint, NeuronConfig())


@pytest.mark.parametrize("field", ["hidden_size", "num_attention_heads", "vocab_size"])
def test_config_missing_required_field(llama_checkpoint, field):
    edit_config(llama_checkpoint, **{field: None})
    with pytest.raises(ConfigError, match=f"missing required field.*{field}"):
        build_model(llama_checkpoint, NeuronConfig())


def test_config_missing_architectures(llama_checkpoint):
    edit_config(llama_checkpoint, architectures=None)
    with pytest.raises(ConfigError, match="architectures"):
        build_model(llama_checkpoint, NeuronConfig())


def test_unknown_architecture_names_installed_plugins(llama_checkpoint):
    edit_config(llama_checkpoint, architectures=["MysteryForCausalLM"])
    with pytest.raises(ConfigError, match=r"'MysteryForCausalLM'.*LlamaForCausalLM"):
        build_model(llama_checkpoint, NeuronConfig())


def test_model_type_must_match_the_architecture(llama_checkpoint):
    edit_config(llama_checkpoint, model_type="gemma4")
    with pytest.raises(
        ConfigError, match=r"model_type 'gemma4' contradicts architectures\[0\] 'LlamaForCausalLM'"
    ):
        build_model(llama_checkpoint, NeuronConfig(), load=False)


def test_every_plugin_declares_the_model_type_of_each_architecture():
    plugins = discover_plugins().values()
    assert plugins
    for plugin in plugins:
        assert set(plugin.model_types) == set(plugin.architectures), plugin.name


def set_heads(ckpt: Path, heads: int, kv_heads: int) -> None:
    """Give the config ``heads`` query and ``kv_heads`` KV heads (the hidden size follows the head size)."""
    data = json.loads((ckpt / "config.json").read_text())
    head_dim = data.get("head_dim") or data["hidden_size"] // data["num_attention_heads"]
    edit_config(ckpt, num_attention_heads=heads, num_key_value_heads=kv_heads, hidden_size=heads * head_dim)


def test_tp_must_divide_attention_heads(llama_checkpoint):
    """6 heads cannot split over 4 ranks: the error names both numbers."""
    set_heads(llama_checkpoint, 6, 6)
    with pytest.raises(ShardingError, match=r"num_attention_heads=6 is not divisible by tp_degree=4"):
        check_model_config(llama_checkpoint, NeuronConfig(tp_degree=4))


def test_tp_must_divide_kv_heads_when_not_replicated(llama_checkpoint):
    set_heads(llama_checkpoint, 12, 3)
    with pytest.raises(ShardingError, match=r"num_key_value_heads=3 is not divisible by tp_degree=2"):
        check_model_config(llama_checkpoint, NeuronConfig(tp_degree=2))
    with pytest.raises(ShardingError, match=r"tp_degree=4 exceeds num_key_value_heads=3"):
        check_model_config(llama_checkpoint, NeuronConfig(tp_degree=4))


def test_tp_degree_must_match_parallel_state(llama_checkpoint):
    init_parallel_state(1)
    with pytest.raises(
        ShardingError, match=r"tp_degree=2, ep_degree=1 but the parallel state is tp_degree=1"
    ):
        build_model(llama_checkpoint, NeuronConfig(tp_degree=2))


def test_a_cpu_kernel_list_naming_no_kernel_is_refused_before_any_weight_loads(llama_checkpoint, monkeypatch):
    """A typo in TRNMODELS_CPU_KERNELS was refused only at the first forward, after the weights loaded."""
    monkeypatch.setenv("TRNMODELS_CPU_KERNELS", "moe_expert")
    monkeypatch.setattr(
        "trnmodels.core.causal_lm.CausalLM.load_weights", lambda *a, **k: pytest.fail("loaded")
    )
    match = r"TRNMODELS_CPU_KERNELS: no CPU kernel for \['moe_expert'\]; expected 'all', 'none' or a"
    with pytest.raises(ConfigError, match=match):
        check_model_config(llama_checkpoint, NeuronConfig())
    init_parallel_state(1)
    with pytest.raises(ConfigError, match=match):
        build_model(llama_checkpoint, NeuronConfig())
