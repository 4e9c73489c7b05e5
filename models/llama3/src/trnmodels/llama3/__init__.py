"""trnmodels-llama3: Llama 3, 3.1, 3.2 and 3.3 for vLLM on AWS Trainium (the plugin's description only;
the model code loads when core builds a model)."""

from importlib.metadata import version

from trnmodels.core.plugins import DECODER_CONFIG_FIELDS, ModelPlugin

# The one version is the distribution's (pyproject.toml): a release bumps it there only.
__version__ = version("trnmodels-llama3")

PLUGIN = ModelPlugin.declare(
    "llama3", {"LlamaForCausalLM": "llama"}, required_config_fields=DECODER_CONFIG_FIELDS
)
