"""trnmodels-gpt-oss: gpt-oss (20b, 120b) for vLLM on AWS Trainium.

Importing this package is cheap (no torch): it only describes the plugin. The model is imported when
core builds it through ``factory:build``.
"""

from trnmodels.core.plugins import DECODER_CONFIG_FIELDS, ModelPlugin

__version__ = "0.1.0"

PLUGIN = ModelPlugin(
    name="gpt_oss",
    architectures=("GptOssForCausalLM",),
    factory="trnmodels.gpt_oss.factory:build",
    distribution="trnmodels-gpt-oss",
    model_types={"GptOssForCausalLM": "gpt_oss"},
    required_config_fields=(
        *DECODER_CONFIG_FIELDS,
        "num_key_value_heads",
        "head_dim",
        "num_local_experts",
        "num_experts_per_tok",
    ),
)
