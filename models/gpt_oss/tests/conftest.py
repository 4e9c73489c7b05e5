"""Tiny random gpt-oss checkpoints, saved with transformers the way published ones are (BF16 or MXFP4)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file

from trnmodels.core.quant import quantize_mxfp4
from trnmodels.core.testing import save_checkpoint

# Published gpt-oss shapes scaled down: head_dim 64, GQA, alternating sliding (window) / full layers,
# YaRN, biases everywhere. A window of 8 lets short test sequences run past it.
BASE = dict(
    vocab_size=131,
    hidden_size=64,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=64,
    num_local_experts=4,
    num_experts_per_tok=2,
    sliding_window=8,
    max_position_embeddings=512,
    rms_norm_eps=1e-5,
    tie_word_embeddings=False,
    rope_parameters={
        "rope_type": "yarn",
        "rope_theta": 150000.0,
        "factor": 32.0,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "truncate": False,
        "original_max_position_embeddings": 16,
    },
    bos_token_id=0,
    eos_token_id=1,
    pad_token_id=2,
)

MXFP4_WEIGHTS = ("gate_up_proj", "down_proj")


def hf_config(**overrides) -> transformers.GptOssConfig:
    config = transformers.GptOssConfig(**{**BASE, **overrides})
    config._attn_implementation = "eager"
    # The plain per-expert loop: the readable reference (grouped_mm needs 16-byte aligned strides).
    config._experts_implementation = "eager"
    return config


def build_hf(seed: int = 0, **overrides) -> transformers.GptOssForCausalLM:
    torch.manual_seed(seed)
    model = transformers.GptOssForCausalLM(hf_config(**overrides)).eval()
    perturb(model)
    return model


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


def quantize_checkpoint(src: Path, dst: Path) -> Path:
    """Rewrite a BF16 checkpoint's expert weights as published MXFP4 ``*_blocks``/``*_scales`` pairs."""
    dst.mkdir(parents=True)
    tensors = {}
    for file in sorted(src.glob("*.safetensors")):
        tensors.update(load_file(file))
    out = {}
    for key, value in tensors.items():
        if key.rsplit(".", 1)[-1] in MXFP4_WEIGHTS:
            out[f"{key}_blocks"], out[f"{key}_scales"] = quantize_mxfp4(value.float())
        else:
            out[key] = value
    save_file(out, str(dst / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((src / "config.json").read_text())
    config["quantization_config"] = {
        "quant_method": "mxfp4",
        "modules_to_not_convert": [
            "model.layers.*.self_attn",
            "model.layers.*.mlp.router",
            "model.embed_tokens",
            "lm_head",
        ],
    }
    (dst / "config.json").write_text(json.dumps(config, indent=2))
    for extra in src.iterdir():
        if extra.suffix != ".safetensors" and extra.name not in (
            "config.json",
            "model.safetensors.index.json",
        ):
            (dst / extra.name).write_bytes(extra.read_bytes())
    return dst


@pytest.fixture
def make_checkpoint(tmp_path: Path) -> Callable[..., tuple[Path, transformers.GptOssForCausalLM]]:
    counter = iter(range(1000))

    def make(seed: int = 0, **overrides):
        model = build_hf(seed, **overrides)
        out = save_checkpoint(model, tmp_path / f"ckpt{next(counter)}")
        return out, model

    return make
