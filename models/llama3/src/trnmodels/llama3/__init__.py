"""trnmodels-llama3: Llama 3, 3.1, 3.2 and 3.3 for vLLM on AWS Trainium.

Importing this package is cheap (no torch): it only describes the plugin. The model is imported when
core builds it through ``factory:build``.
"""

from trnmodels.core.plugins import DECODER_CONFIG_FIELDS, ModelPlugin

__version__ = "0.1.0"

PLUGIN = ModelPlugin(
    name="llama3",
    architectures=("LlamaForCausalLM",),
    factory="trnmodels.llama3.factory:build",
    distribution="trnmodels-llama3",
    model_types={"LlamaForCausalLM": "llama"},
    required_config_fields=DECODER_CONFIG_FIELDS,
)
