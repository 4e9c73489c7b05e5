"""trnmodels-gpt-oss: gpt-oss (20b, 120b) for vLLM on AWS Trainium. Importing it is cheap: the model code
loads when core builds a model."""

from trnmodels.core.plugins import DECODER_CONFIG_FIELDS, ModelPlugin

__version__ = "0.1.0"

EXPERT_FIELDS = ("num_key_value_heads", "head_dim", "num_local_experts", "num_experts_per_tok")

PLUGIN = ModelPlugin.declare(
    "gpt_oss",
    {"GptOssForCausalLM": "gpt_oss"},
    required_config_fields=(*DECODER_CONFIG_FIELDS, *EXPERT_FIELDS),
)
