"""Tiny random Gemma 4 checkpoints in the published multimodal layout (``Gemma4ForConditionalGeneration``:
the language model under ``model.language_model.*`` beside small vision and audio towers)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import transformers

from trnmodels.core.testing import save_checkpoint

SLIDING, FULL = "sliding_attention", "full_attention"

TEXT = dict(
    vocab_size=96,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    global_head_dim=16,
    num_global_key_value_heads=2,
    layer_types=[SLIDING, FULL, SLIDING, FULL],
    sliding_window=4,
    hidden_size_per_layer_input=0,
    final_logit_softcapping=30.0,
    max_position_embeddings=256,
    rms_norm_eps=1e-6,
    rope_parameters={
        SLIDING: {"rope_type": "default", "rope_theta": 10000.0},
        FULL: {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1000000.0},
    },
    pad_token_id=0,
    bos_token_id=2,
    eos_token_id=1,
)
VISION = dict(
    hidden_size=16,
    intermediate_size=32,
    num_hidden_layers=1,
    num_attention_heads=2,
    num_key_value_heads=2,
    head_dim=8,
    patch_size=4,
    position_embedding_size=16,
    pooling_kernel_size=2,
)
AUDIO = dict(
    hidden_size=16,
    num_hidden_layers=1,
    num_attention_heads=2,
    subsampling_conv_channels=[4, 4],
    output_proj_dims=16,
    conv_kernel_size=3,
)

# The variants the issue names (each on top of TEXT).
DENSE_K_EQ_V = dict(attention_k_eq_v=True)
PLE_KV_SHARED = dict(
    layer_types=[SLIDING, FULL, SLIDING, SLIDING, FULL],
    num_hidden_layers=5,
    hidden_size_per_layer_input=8,
    vocab_size_per_layer_input=96,
    num_kv_shared_layers=3,
    use_double_wide_mlp=True,
    attention_k_eq_v=True,
)
GLOBAL_KV1 = dict(attention_k_eq_v=True, num_global_key_value_heads=1, num_key_value_heads=1)
MOE = dict(enable_moe_block=True, num_experts=4, top_k_experts=2, moe_intermediate_size=16)


def text_config(**overrides) -> transformers.Gemma4TextConfig:
    config = transformers.Gemma4TextConfig(**{**TEXT, **overrides})
    config._attn_implementation = "eager"
    return config


def hf_config(**overrides) -> transformers.Gemma4Config:
    return transformers.Gemma4Config(
        text_config={**TEXT, **overrides}, vision_config=VISION, audio_config=AUDIO
    )


def perturb(model: torch.nn.Module, seed: int) -> None:
    """Random init leaves norms, scalars and router scales at 1; perturb them so a wrong mapping shows."""
    gen = torch.Generator().manual_seed(seed + 1000)
    with torch.no_grad():
        for name, p in [*model.named_parameters(), *model.named_buffers()]:
            wanted = any(s in name for s in ("norm.weight", "scale", "layer_scalar"))
            if wanted and "embed_scale" not in name and p.is_floating_point():
                p.add_(0.2 * torch.randn(p.shape, generator=gen))


def build_hf(seed: int = 0, **overrides) -> transformers.Gemma4ForConditionalGeneration:
    torch.manual_seed(seed)
    model = transformers.Gemma4ForConditionalGeneration(hf_config(**overrides)).eval()
    perturb(model, seed)
    return model


@pytest.fixture
def make_checkpoint(tmp_path: Path) -> Callable[..., tuple[Path, transformers.PreTrainedModel]]:
    counter = iter(range(1000))

    def make(seed: int = 0, max_shard_size: str | int | None = None, **overrides):
        model = build_hf(seed, **overrides)
        out = save_checkpoint(model, tmp_path / f"ckpt{next(counter)}", max_shard_size=max_shard_size)
        return out, model

    return make
