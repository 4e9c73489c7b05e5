"""Gemma 4 against transformers' Gemma4ForConditionalGeneration through core's plugin conformance suite.

Configs start from the bundled tiny config (per-layer inputs, KV sharing, K = V on full layers, a
double-wide MLP, one global KV head, a vision and an audio tower); ``PLAIN`` turns those features off."""

from __future__ import annotations

import random

import torch
import transformers

from trnmodels.core.testing.conformance import CausalLMConformance, ConformanceSpec

SLIDING, FULL = "sliding_attention", "full_attention"

PLAIN = {
    "num_hidden_layers": 4,
    "layer_types": [SLIDING, FULL, SLIDING, FULL],
    "hidden_size_per_layer_input": 0,
    "num_kv_shared_layers": 0,
    "attention_k_eq_v": False,
    "use_double_wide_mlp": False,
    "num_global_key_value_heads": 2,
}
MOE = dict(enable_moe_block=True, num_experts=4, top_k_experts=2, moe_intermediate_size=16)


def random_config(rng: random.Random) -> dict:
    """A Gemma 4 text config no test was written for, valid at TP=2."""
    layers = rng.randint(3, 5)
    types = [rng.choice([SLIDING, FULL]) for _ in range(layers - 1)] + [FULL]
    shared = rng.choice([0, 1, 2])
    if any(t not in types[: layers - shared] for t in types[layers - shared :]):
        shared = 0  # every KV-shared layer needs an earlier layer of its type to read from
    return dict(
        num_hidden_layers=layers,
        layer_types=types,
        num_attention_heads=rng.choice([2, 4]),
        num_key_value_heads=rng.choice([1, 2]),
        head_dim=rng.choice([8, 16]),
        global_head_dim=rng.choice([16, 32]),
        num_global_key_value_heads=rng.choice([1, 2]),
        attention_k_eq_v=rng.random() < 0.5,
        sliding_window=rng.choice([3, 4, 6]),
        hidden_size_per_layer_input=rng.choice([0, 8]),
        num_kv_shared_layers=shared,
        use_double_wide_mlp=rng.random() < 0.5,
        final_logit_softcapping=rng.choice([None, 30.0]),
    )


def perturb(model: torch.nn.Module, seed: int = 0) -> None:
    """Random init leaves norms, scalars and router scales at 1; perturb them so a wrong mapping shows."""
    gen = torch.Generator().manual_seed(seed + 1000)
    with torch.no_grad():
        for name, p in [*model.named_parameters(), *model.named_buffers()]:
            wanted = any(s in name for s in ("norm.weight", "scale", "layer_scalar"))
            if wanted and "embed_scale" not in name and p.is_floating_point():
                p.add_(0.2 * torch.randn(p.shape, generator=gen))


def text(overrides: dict) -> dict:
    return {"text_config": overrides}


SPEC = ConformanceSpec(
    plugin="gemma4",
    hf_class=transformers.Gemma4ForConditionalGeneration,
    configs={
        "tiny_ple_kv_shared": {},
        "kv_heads_1": text({"num_key_value_heads": 1}),
        "plain": text(PLAIN),
        "moe": text({**PLAIN, **MOE}),
    },
    random_config=lambda rng: text(random_config(rng)),
    moe_configs=("moe",),
    perturb=perturb,
)


class TestConformance(CausalLMConformance):
    spec = SPEC
