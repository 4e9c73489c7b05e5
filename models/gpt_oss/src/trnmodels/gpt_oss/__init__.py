"""trnmodels-gpt-oss: gpt-oss (20b, 120b) for vLLM on AWS Trainium. Importing it is cheap: the model code
loads when core builds a model."""

from importlib.metadata import version

from trnmodels.core.plugins import DECODER_CONFIG_FIELDS, ModelPlugin

# The one version is the distribution's (pyproject.toml): a release bumps it there only.
__version__ = version("trnmodels-gpt-oss")

EXPERT_FIELDS = ("num_key_value_heads", "head_dim", "num_local_experts", "num_experts_per_tok")

PLUGIN = ModelPlugin.declare(
    "gpt_oss",
    {"GptOssForCausalLM": "gpt_oss"},
    required_config_fields=(*DECODER_CONFIG_FIELDS, *EXPERT_FIELDS),
)
