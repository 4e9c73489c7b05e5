"""trnmodels-gpt-oss: gpt-oss (20b, 120b) for vLLM on AWS Trainium.

Importing this package is cheap (no torch): it only describes the plugin. The model is imported when
core builds it through ``factory:build``.
"""

from trnmodels.core.plugins import ModelPlugin

__version__ = "0.1.0"

PLUGIN = ModelPlugin(
    name="gpt_oss",
    architectures=("GptOssForCausalLM",),
    factory="trnmodels.gpt_oss.factory:build",
    distribution="trnmodels-gpt-oss",
    model_types={"GptOssForCausalLM": "gpt_oss"},
    required_config_fields=(
        "vocab_size",
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "num_local_experts",
        "num_experts_per_tok",
        "rms_norm_eps",
    ),
)
