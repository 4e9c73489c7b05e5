"""Llama 3 against transformers' LlamaForCausalLM through core's plugin conformance suite."""

from __future__ import annotations

import random

import transformers

from trnmodels.core.testing.conformance import CausalLMConformance, ConformanceSpec

from .conftest import LLAMA3_ROPE


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
        rope_parameters=LLAMA3_ROPE if rng.random() < 0.5 else {"rope_type": "default", "rope_theta": 1e4},
    )


class TestConformance(CausalLMConformance):
    spec = ConformanceSpec(
        plugin="llama3",
        hf_class=transformers.LlamaForCausalLM,
        configs={
            "gqa_llama3_rope": dict(rope_parameters=LLAMA3_ROPE),
            "mqa_odd_vocab_tied": dict(num_key_value_heads=1, vocab_size=101, tie_word_embeddings=True),
            "head_dim_24": dict(head_dim=24, rope_parameters={"rope_type": "default", "rope_theta": 1e4}),
            "mha_biases": dict(num_key_value_heads=4, attention_bias=True, mlp_bias=True, vocab_size=64),
        },
        random_config=random_config,
    )
