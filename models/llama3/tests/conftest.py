"""Tiny random Llama checkpoints, saved with transformers the way published ones are."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import transformers

from trnmodels.core.testing import save_checkpoint

BASE = dict(
    vocab_size=97,
    hidden_size=48,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    rms_norm_eps=1e-5,
    tie_word_embeddings=False,
)

LLAMA3_ROPE = {
    "rope_type": "llama3",
    "rope_theta": 500000.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 16,
}


def hf_config(**overrides) -> transformers.LlamaConfig:
    return transformers.LlamaConfig(**{**BASE, **overrides})


def perturb(model: torch.nn.Module) -> None:
    """Random init leaves norms at 1; perturb them so a norm mapped to the wrong key would show."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.1 * torch.randn_like(p))


def build_hf(seed: int = 0, **overrides) -> transformers.LlamaForCausalLM:
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(hf_config(**overrides)).eval()
    perturb(model)
    return model


@pytest.fixture
def make_checkpoint(tmp_path: Path) -> Callable[..., tuple[Path, transformers.LlamaForCausalLM]]:
    counter = iter(range(1000))

    def make(seed: int = 0, max_shard_size: str | int | None = None, **overrides):
        model = build_hf(seed, **overrides)
        out = save_checkpoint(model, tmp_path / f"ckpt{next(counter)}", max_shard_size=max_shard_size)
        return out, model

    return make
