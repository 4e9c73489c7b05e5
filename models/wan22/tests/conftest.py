"""Tiny random Wan2.2 checkpoints, saved with diffusers/transformers the way published ones are.

``tiny_t2v`` / ``tiny_i2v`` (session fixtures) are ``WanCheckpoint``s: the diffusers reference pipeline
(two experts, ``boundary_ratio``) and the directory it was saved to with ``save_pretrained``. Tests of
every part (DiT, text encoder, VAE, pipelines, CLI) build on these, so one set of weights is made per
session. No Hub access: the tokenizer is trained locally.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers
from diffusers import (
    AutoencoderKLWan,
    UniPCMultistepScheduler,
    WanImageToVideoPipeline,
    WanPipeline,
    WanTransformer3DModel,
)

from trnmodels.core.testing import train_tokenizer
from trnmodels.wan22.compile import TINY


def bundled_tiny_config(component: str) -> dict[str, Any]:
    """``component/config.json`` of the plugin's bundled tiny checkpoint (the one ``compile-wan22`` defaults
    to), without diffusers' bookkeeping keys: the tests' models are built from the same file."""
    config = json.loads((TINY / component / "config.json").read_text())
    return {key: value for key, value in config.items() if not key.startswith("_")}


TINY_DIT = bundled_tiny_config("transformer")
TINY_UMT5 = bundled_tiny_config("text_encoder")
TINY_VAE = bundled_tiny_config("vae")
BOUNDARY_RATIO = 0.875
FLOW_SHIFT = 3.0
# A small video every test can afford: 5 frames of 32x32 -> latents [16, 2, 4, 4] -> 8 DiT tokens.
VIDEO = dict(num_frames=5, height=32, width=32, max_sequence_length=16)
PROMPT = "a red fox running through snow"
NEGATIVE = "blurry, low quality"


def perturb_norms(model: torch.nn.Module, scale: float = 0.1) -> None:
    """Random init leaves norms at 1 and biases at 0; perturb them so a wrongly mapped norm shows."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or "layer_norm" in name:
                p.add_(scale * torch.randn_like(p))


def build_dit(seed: int, **overrides) -> WanTransformer3DModel:
    torch.manual_seed(seed)
    model = WanTransformer3DModel(**{**TINY_DIT, **overrides}).eval()
    perturb_norms(model)
    return model


def build_umt5(seed: int = 0) -> transformers.UMT5EncoderModel:
    torch.manual_seed(seed)
    model = transformers.UMT5EncoderModel(transformers.UMT5Config.from_dict(TINY_UMT5)).eval()
    perturb_norms(model)
    return model


def build_vae(seed: int = 0) -> AutoencoderKLWan:
    torch.manual_seed(seed)
    return AutoencoderKLWan(**TINY_VAE).eval()


def build_scheduler() -> UniPCMultistepScheduler:
    return UniPCMultistepScheduler(
        prediction_type="flow_prediction",
        use_flow_sigmas=True,
        num_train_timesteps=1000,
        flow_shift=FLOW_SHIFT,
    )


def bf16_like_diffusers(model: torch.nn.Module) -> torch.nn.Module:
    """A BF16 copy the way ``from_pretrained(torch_dtype=bfloat16)`` makes one: the parameters named in
    ``_keep_in_fp32_modules`` stay FP32 (done by hand: diffusers needs accelerate for it on load)."""
    keep = getattr(model, "_keep_in_fp32_modules", None) or ()
    out = copy.deepcopy(model).to(torch.bfloat16)
    with torch.no_grad():
        for name, p in out.named_parameters():
            if any(k in name.split(".") for k in keep):
                p.data = p.data.float()
    return out


@dataclass
class WanCheckpoint:
    path: Path
    reference: WanPipeline | WanImageToVideoPipeline
    kind: str  # "t2v" or "i2v"


def build_dit_from_config(seed: int, config: Mapping[str, Any]) -> WanTransformer3DModel:
    """A random DiT built from a ``config.json``'s contents (``_class_name`` and the like included)."""
    torch.manual_seed(seed)
    model = WanTransformer3DModel.from_config(dict(config)).eval()
    perturb_norms(model)
    return model


def make_checkpoint(
    out: Path, kind: str = "t2v", seed: int = 0, dit_config: Mapping[str, Any] | None = None
) -> WanCheckpoint:
    """A two-expert Wan2.2 pipeline (T2V, or I2V with image latents concatenated: 16 + 4 + 16 channels).

    With ``dit_config`` (a ``config.json``'s contents, e.g. a published one shrunk in size only) both
    experts are built from it and their saved ``config.json`` files are that dict verbatim, not diffusers'
    re-serialisation; the reference pipeline is then reloaded from disk so diffusers reads the same files."""
    in_channels = 16 if kind == "t2v" else 36

    def expert(expert_seed: int) -> WanTransformer3DModel:
        if dit_config is None:
            return build_dit(expert_seed, in_channels=in_channels)
        return build_dit_from_config(expert_seed, dit_config)

    components = dict(
        tokenizer=train_tokenizer(),
        text_encoder=build_umt5(seed),
        vae=build_vae(seed),
        scheduler=build_scheduler(),
        transformer=expert(seed + 1),
        transformer_2=expert(seed + 2),
        boundary_ratio=BOUNDARY_RATIO,
    )
    cls = WanPipeline if kind == "t2v" else WanImageToVideoPipeline
    pipe = cls(**components)
    pipe.set_progress_bar_config(disable=True)
    pipe.save_pretrained(out)
    if dit_config is not None:
        for name in ("transformer", "transformer_2"):
            (out / name / "config.json").write_text(json.dumps(dict(dit_config), indent=2))
        pipe = cls.from_pretrained(out)
        pipe.set_progress_bar_config(disable=True)
    return WanCheckpoint(out, pipe, kind)


@pytest.fixture(scope="session")
def tiny_t2v(tmp_path_factory) -> WanCheckpoint:
    return make_checkpoint(tmp_path_factory.mktemp("wan22-t2v"), "t2v")


@pytest.fixture(scope="session")
def tiny_i2v(tmp_path_factory) -> WanCheckpoint:
    return make_checkpoint(tmp_path_factory.mktemp("wan22-i2v"), "i2v", seed=10)


def make_image(height: int = VIDEO["height"], width: int = VIDEO["width"], seed: int = 0):
    """A deterministic RGB PIL image to condition I2V on."""
    from PIL import Image

    g = torch.Generator().manual_seed(seed)
    pixels = (torch.rand(height, width, 3, generator=g) * 255).to(torch.uint8).numpy()
    return Image.fromarray(pixels)
