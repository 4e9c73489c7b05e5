"""gpt-oss against transformers' GptOssForCausalLM through core's plugin conformance suite (TP and EP)."""

from __future__ import annotations

import random

import torch
import transformers

from trnmodels.core.testing.conformance import CausalLMConformance, ConformanceSpec

SLIDING, FULL = "sliding_attention", "full_attention"


def random_config(rng: random.Random) -> dict:
    """A gpt-oss config no test was written for, valid at TP=2 and EP=2."""
    kv = rng.choice([1, 2])
    layers = rng.randint(1, 3)
    experts = rng.choice([2, 4, 6, 8])
    return dict(
        vocab_size=rng.randint(60, 200),
        hidden_size=rng.choice([32, 64]),
        intermediate_size=2 * rng.randint(8, 40),
        num_hidden_layers=layers,
        num_attention_heads=kv * rng.choice([2, 4]),
        num_key_value_heads=kv,
        head_dim=rng.choice([32, 64]),
        num_local_experts=experts,
        num_experts_per_tok=rng.randint(1, min(4, experts)),
        sliding_window=rng.choice([4, 8, 16]),
        layer_types=[rng.choice([SLIDING, FULL]) for _ in range(layers)],
        tie_word_embeddings=rng.random() < 0.3,
    )


def perturb(model: torch.nn.Module) -> None:
    """Make a wrong key mapping or a flipped expert choice show in the logits."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            # Random init leaves norms at 1 and biases at 0; perturb them so a wrong mapping would show.
            if "norm" in name or name.endswith("bias"):
                p.add_(0.1 * torch.randn_like(p))
            # Larger router logits make top-k choices well separated, so FP32 rounding never flips one.
            if "router" in name:
                p.mul_(20.0)


SPEC = ConformanceSpec(
    plugin="gpt_oss",
    hf_class=transformers.GptOssForCausalLM,
    configs={
        # gpt-oss-20b: 32 experts, top-4, 24 alternating layers → the bundled tiny: 4 experts, top-2, 2 layers.
        "20b_shape": {},
        # gpt-oss-120b: 128 experts, top-4 → 8 experts, top-4, 3 layers (sliding, full, sliding).
        "120b_shape": dict(
            num_local_experts=8,
            num_experts_per_tok=4,
            num_hidden_layers=3,
            layer_types=[SLIDING, FULL, SLIDING],
        ),
        "mqa_tied_default_rope": dict(
            num_key_value_heads=1,
            tie_word_embeddings=True,
            vocab_size=131,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        ),
    },
    random_config=random_config,
    moe=True,
    # The plain per-expert loop is the readable reference (grouped_mm needs 16-byte aligned strides).
    hf_attributes={"_attn_implementation": "eager", "_experts_implementation": "eager"},
    perturb=perturb,
)


class TestConformance(CausalLMConformance):
    spec = SPEC
