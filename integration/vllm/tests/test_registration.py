"""Registration with vLLM's model registry: which architectures, which class, and the off switch."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import transformers
from vllm_harness import vllm_env

from trnmodels.core.causal_lm import CausalLM
from trnmodels.core.errors import ConfigError
from trnmodels.core.plugins import discover_plugins
from trnmodels.core.runtime_config import NeuronConfig
from trnmodels.core.vllm import registration
from trnmodels.core.vllm.neuron import TrnmodelsNeuronCausalLM


def test_every_opted_in_plugin_is_registered(monkeypatch):
    monkeypatch.delenv(registration.DISABLE_ENV, raising=False)
    monkeypatch.delenv("VLLM_PLUGINS", raising=False)
    plugins = registration.vllm_plugins()
    assert "llama3" in plugins
    expected = {arch: registration.BRIDGE_CLASS for p in plugins.values() for arch in p.architectures}
    assert registration.registrations() == expected
    assert registration.registrations(on_neuron=True) == dict.fromkeys(expected, registration.NEURON_CLASS)


@pytest.mark.parametrize("value", ["llama3", " llama3 ,", "all"])
def test_disable_turns_plugins_off(monkeypatch, value):
    monkeypatch.delenv("VLLM_PLUGINS", raising=False)
    monkeypatch.setenv(registration.DISABLE_ENV, value)
    assert "LlamaForCausalLM" not in registration.registrations()


def test_vllm_plugins_allow_list_is_honoured(monkeypatch):
    monkeypatch.delenv(registration.DISABLE_ENV, raising=False)
    monkeypatch.setenv("VLLM_PLUGINS", "some_other_plugin")
    assert registration.registrations() == {}
    monkeypatch.setenv("VLLM_PLUGINS", "some_other_plugin,trnmodels_llama3")
    assert registration.registrations()["LlamaForCausalLM"] == registration.BRIDGE_CLASS


def test_disable_with_an_unknown_name_is_an_error(monkeypatch):
    monkeypatch.setenv(registration.DISABLE_ENV, "llama3,lama3")
    with pytest.raises(
        ConfigError, match=r"TRNMODELS_VLLM_DISABLE='llama3,lama3': unknown plugin name\(s\) \['lama3'\]"
    ):
        registration.registrations()


PROBE = """
import json, sys
from trnmodels.core.vllm import registration
cheap = not any(m in sys.modules for m in ("torch", "vllm"))
from vllm import ModelRegistry
from vllm.model_executor.models.config import MODELS_CONFIG_MAP
registration.register()
registration.register()  # vLLM may call the hook again in the same process
entry = ModelRegistry.models["LlamaForCausalLM"]
print(json.dumps({
    "cheap": cheap,
    "target": f"{getattr(entry, 'module_name', '?')}:{getattr(entry, 'class_name', '?')}",
    "bridge_imported": "trnmodels.core.vllm.bridge" in sys.modules,
    "config_hook": MODELS_CONFIG_MAP.get("LlamaForCausalLM").__name__,
}))
"""


def test_register_is_lazy_and_overrides_vllms_class():
    proc = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=300, env=vllm_env()
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result == {
        "cheap": True,
        "target": registration.BRIDGE_CLASS,
        "bridge_imported": False,
        "config_hook": "TrnmodelsConfigCheck",
    }


def test_neuron_class_builds_the_plugin_model(tiny):
    hf_config = transformers.AutoConfig.from_pretrained(tiny.path)
    model = TrnmodelsNeuronCausalLM.from_configs(hf_config, NeuronConfig())
    # The Neuron runner drives the plugin's own model class directly: nothing is wrapped.
    assert isinstance(model, CausalLM)
    assert type(model).__module__.startswith(discover_plugins()[tiny.plugin].package + ".")
