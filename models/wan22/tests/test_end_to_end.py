"""Tier 3: a full tiny text-to-video generation, decoded, against diffusers' frames (SSIM per frame) and
against a golden video stored here (a regression check of our own earlier output).

The golden (``golden/t2v_tiny.safetensors``: ``latents`` float32 and ``frames`` uint8 ``[F, H, W, 3]``) was
written by this pipeline on the session's tiny checkpoint (conftest ``make_checkpoint(kind="t2v")``);
regenerate it with ``TRNMODELS_WRITE_GOLDEN=1`` only after a change that is meant to alter the output.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from trnmodels.core.accuracy.ssim import ssim_per_frame
from trnmodels.wan22.pipeline_t2v import Wan22Pipeline

GOLDEN = Path(__file__).parent / "golden" / "t2v_tiny.safetensors"
CALL = dict(
    prompt="a red fox running through snow",
    negative_prompt="blurry, low quality",
    num_frames=5,
    height=32,
    width=32,
    num_inference_steps=4,
    guidance_scale=4.0,
    guidance_scale_2=3.0,
    max_sequence_length=16,
)
SSIM_MIN = 0.99


def generate(pipe, output_type: str):
    with torch.no_grad():
        return pipe(**CALL, generator=torch.Generator().manual_seed(3), output_type=output_type).frames


@pytest.fixture(scope="module")
def ours(tiny_t2v):
    pipe = Wan22Pipeline.from_pretrained(tiny_t2v.path, dtype=torch.float32)
    latents = generate(pipe, "latent")
    with torch.no_grad():
        frames = pipe.decode_latents(latents, "np")[0]
    return latents.float(), frames


def test_frames_match_diffusers_per_frame(tiny_t2v, ours):
    reference = generate(tiny_t2v.reference, "np")[0]
    scores = ssim_per_frame(torch.from_numpy(ours[1]), torch.from_numpy(reference))
    assert scores.min() >= SSIM_MIN, f"per-frame SSIM vs diffusers {scores.tolist()}"


def test_matches_golden_video(ours):
    latents, frames = ours
    pixels = torch.from_numpy((np.clip(frames, 0, 1) * 255).round().astype(np.uint8))
    if os.environ.get("TRNMODELS_WRITE_GOLDEN") == "1":
        save_file({"latents": latents.contiguous(), "frames": pixels.contiguous()}, str(GOLDEN))
    golden = load_file(GOLDEN)
    torch.testing.assert_close(latents, golden["latents"], rtol=1e-3, atol=1e-4)
    scores = ssim_per_frame(pixels.double() / 255, golden["frames"].double() / 255)
    assert scores.min() >= SSIM_MIN, f"per-frame SSIM vs golden {scores.tolist()}"
