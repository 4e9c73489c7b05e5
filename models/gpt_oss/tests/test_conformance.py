"""gpt-oss against transformers' GptOssForCausalLM through core's plugin conformance suite (TP and EP)."""

from __future__ import annotations

import transformers

from trnmodels.core.testing.conformance import CausalLMConformance, ConformanceSpec

from .conftest import perturb
from .test_model_logits import random_config


class TestConformance(CausalLMConformance):
    spec = ConformanceSpec(
        plugin="gpt_oss",
        hf_class=transformers.GptOssForCausalLM,
        configs={
            "tiny": {},
            "tied_mqa": dict(num_key_value_heads=1, tie_word_embeddings=True, vocab_size=131),
        },
        random_config=random_config,
        moe=True,
        # The plain per-expert loop is the readable reference (grouped_mm needs 16-byte aligned strides).
        hf_attributes={"_attn_implementation": "eager", "_experts_implementation": "eager"},
        perturb=perturb,
    )
