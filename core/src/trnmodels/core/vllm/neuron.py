"""The class registered for our architectures when vLLM runs on a Neuron platform.

The Neuron platform plugin's model runner drives the trnmodels model contract directly (``from_configs``,
``get_kv_spec``, ``bind_kv_cache``, ``forward(input_ids, positions, attn_metadata, rank)``,
``load_weights(checkpoint_dir)``), so nothing is bridged: this only resolves the plugin that serves the
checkpoint's architecture and builds its model, binding first the NKI adapters the runtime configuration
names (``TRNMODELS_NKI_ADAPTERS``), as ``build_model`` does. The Neuron runner cannot run on this machine
(no Neuron SDK); ``from_configs`` itself can.
"""

from __future__ import annotations

from transformers import PretrainedConfig

from ..causal_lm import CausalLM
from ..errors import ConfigError
from ..neuron.adapters import register_configured_adapters
from ..plugins import plugin_for_architecture
from ..runtime_config import NeuronConfig


class TrnmodelsNeuronCausalLM:
    """Factory the Neuron model runner calls; the model it returns is the plugin's own class."""

    @classmethod
    def from_configs(cls, hf_config: PretrainedConfig, neuron_config: NeuronConfig) -> CausalLM:
        architectures = getattr(hf_config, "architectures", None) or []
        if not architectures:
            raise ConfigError("config.json: missing required field 'architectures'")
        plugin = plugin_for_architecture(architectures[0])
        # As build_model: only the NKI adapters the runtime configuration names, bound before the model.
        register_configured_adapters()
        return plugin.load_factory()(hf_config, neuron_config)
