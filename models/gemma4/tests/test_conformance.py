"""Gemma 4 against transformers' Gemma4ForConditionalGeneration through core's plugin conformance suite."""

from __future__ import annotations

import transformers

from trnmodels.core.testing.conformance import CausalLMConformance, ConformanceSpec

from .conftest import DENSE_K_EQ_V, MOE, perturb
from .test_model_logits import random_config


def text(overrides: dict) -> dict:
    return {"text_config": overrides}


class TestConformance(CausalLMConformance):
    spec = ConformanceSpec(
        plugin="gemma4",
        hf_class=transformers.Gemma4ForConditionalGeneration,
        configs={"tiny_ple_kv_shared": {}, "dense_k_eq_v": text(DENSE_K_EQ_V), "moe": text(MOE)},
        # Per-layer inputs index a table of their own: it must cover the tiny config's whole vocab.
        random_config=lambda rng: text({**random_config(rng), "vocab_size_per_layer_input": 320}),
        perturb=lambda model: perturb(model, seed=0),
    )
