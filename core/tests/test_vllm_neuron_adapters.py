"""The vLLM path on Neuron builds our model through ``TrnmodelsNeuronCausalLM.from_configs`` (the class the
registration names on a Neuron platform; no vLLM import): like ``build_model``, it binds the NKI adapters
``TRNMODELS_NKI_ADAPTERS`` names before building the model, and only those."""

from __future__ import annotations

import pytest

from trnmodels.core import neuron
from trnmodels.core.errors import ConfigError
from trnmodels.core.hf_config import load_hf_config
from trnmodels.core.neuron import adapters
from trnmodels.core.ops import dispatch
from trnmodels.core.plugins import discover_plugins
from trnmodels.core.runtime_config import NeuronConfig
from trnmodels.core.vllm.neuron import TrnmodelsNeuronCausalLM


@pytest.fixture
def tiny_config():
    plugin = discover_plugins()["llama3"]
    return load_hf_config(plugin.bundled_config_dir("tiny"), plugin.required_config_fields)


@pytest.fixture
def fake_sdk(monkeypatch):
    """A Neuron SDK that imports, and a dispatch table of this test's own; returns the ops bound."""
    monkeypatch.setattr(neuron, "sdk_available", lambda: True)
    monkeypatch.setattr(dispatch, "_nki_impls", {})
    monkeypatch.setattr(dispatch, "_nki_supports", {})
    return dispatch._nki_impls


def test_from_configs_binds_the_configured_adapters(monkeypatch, tiny_config, fake_sdk):
    monkeypatch.setenv(adapters.ENV_VAR, "attention_cte")
    model = TrnmodelsNeuronCausalLM.from_configs(tiny_config, NeuronConfig())
    assert type(model).__module__ == "trnmodels.llama3.model"
    assert fake_sdk == {"prefill_attention": adapters.NKI_ADAPTERS["attention_cte"].impl}


def test_from_configs_binds_nothing_unless_configured(monkeypatch, tiny_config, fake_sdk):
    monkeypatch.delenv(adapters.ENV_VAR, raising=False)
    TrnmodelsNeuronCausalLM.from_configs(tiny_config, NeuronConfig())
    assert fake_sdk == {}


def test_from_configs_rejects_an_unknown_adapter(monkeypatch, tiny_config):
    monkeypatch.setenv(adapters.ENV_VAR, "attention_tce")
    with pytest.raises(ConfigError, match=r"unknown NKI adapters \['attention_tce'\]"):
        TrnmodelsNeuronCausalLM.from_configs(tiny_config, NeuronConfig())
