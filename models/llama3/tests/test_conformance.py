"""Llama 3 against transformers' LlamaForCausalLM through core's plugin conformance suite."""

from __future__ import annotations

import random

import transformers

from trnmodels.core.testing.conformance import CausalLMConformance, ConformanceSpec

# The bundled tiny config's RoPE (Llama 3.1 scaling over 64 original positions), named for the variants.
LLAMA3_ROPE = {
    "rope_type": "llama3",
    "rope_theta": 500000.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,
}
DEFAULT_ROPE = {"rope_type": "default", "rope_theta": 1e4}


def random_config(rng: random.Random) -> dict:
    """A Llama config no test was written for, valid at TP=2."""
    kv = rng.choice([1, 2, 4])
    return dict(
        vocab_size=rng.randint(50, 200),
        hidden_size=rng.choice([32, 48, 64]),
        intermediate_size=2 * rng.randint(20, 80),
        num_hidden_layers=rng.randint(1, 3),
        num_attention_heads=max(2, kv * rng.choice([1, 2, 4])),
        num_key_value_heads=kv,
        head_dim=rng.choice([8, 16, 24]),
        tie_word_embeddings=rng.random() < 0.5,
        rope_parameters=LLAMA3_ROPE if rng.random() < 0.5 else DEFAULT_ROPE,
    )


SPEC = ConformanceSpec(
    plugin="llama3",
    hf_class=transformers.LlamaForCausalLM,
    configs={
        "gqa_llama3_rope": {},
        "mqa_odd_vocab_tied": dict(num_key_value_heads=1, vocab_size=101, tie_word_embeddings=True),
        "head_dim_24": dict(head_dim=24, rope_parameters=DEFAULT_ROPE),
        "mha_biases": dict(num_key_value_heads=4, attention_bias=True, mlp_bias=True, vocab_size=64),
    },
    random_config=random_config,
)


class TestConformance(CausalLMConformance):
    spec = SPEC
