"""`trnmodels video` on a tiny checkpoint it has never seen: latents against diffusers' WanPipeline, a
playable MP4, the latents file, and clear errors for bad input."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from trnmodels.core.cli import main

ARGS = dict(num_frames=5, height=32, width=32, steps=2, seed=7, guidance_scale=4.0, guidance_scale_2=3.0)
PROMPT, NEGATIVE = "a red fox running through snow", "blurry"


def cli_args(checkpoint, out_dir, *extra: str) -> list[str]:
    args = ["video", str(checkpoint), "--prompt", PROMPT, "--negative-prompt", NEGATIVE]
    for key, value in ARGS.items():
        args += [f"--{key.replace('_', '-')}", str(value)]
    return [
        *args,
        "--out",
        str(out_dir / "out.mp4"),
        "--latents-out",
        str(out_dir / "latents.safetensors"),
        *extra,
    ]


@pytest.fixture(scope="module")
def reference_latents(tiny_t2v) -> torch.Tensor:
    with torch.no_grad():
        return tiny_t2v.reference(
            prompt=PROMPT,
            negative_prompt=NEGATIVE,
            num_frames=ARGS["num_frames"],
            height=ARGS["height"],
            width=ARGS["width"],
            num_inference_steps=ARGS["steps"],
            guidance_scale=ARGS["guidance_scale"],
            guidance_scale_2=ARGS["guidance_scale_2"],
            generator=torch.Generator().manual_seed(ARGS["seed"]),
            output_type="latent",
        ).frames


def test_video_matches_diffusers_and_writes_a_playable_mp4(tiny_t2v, reference_latents, tmp_path, capsys):
    assert main([*cli_args(tiny_t2v.path, tmp_path), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["frames"] == 5 and (report["height"], report["width"]) == (32, 32)
    latents = load_file(tmp_path / "latents.safetensors")["latents"]
    torch.testing.assert_close(latents, reference_latents.float(), rtol=1e-4, atol=1e-5)

    import imageio.v3 as iio

    video = iio.imread(tmp_path / "out.mp4", plugin="FFMPEG")  # decodes with ffmpeg: the file plays
    assert video.shape == (5, 32, 32, 3)
    assert not list(tmp_path.glob("*.partial*"))


def test_video_cfg_parallel_two_ranks(tiny_t2v, reference_latents, tmp_path):
    assert main([*cli_args(tiny_t2v.path, tmp_path), "--cfg-parallel", "2", "--json"]) == 0
    latents = load_file(tmp_path / "latents.safetensors")["latents"]
    torch.testing.assert_close(latents, reference_latents.float(), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--num-frames", "6"], "num_frames=6 is not of the form 4k\\+1"),
        (["--height", "40"], "height=40 is not divisible by 16"),
        (["--image", "missing.png"], "--image: missing.png is not a file"),
    ],
)
def test_bad_input_is_one_line(tiny_t2v, tmp_path, capsys, extra, message):
    assert main([*cli_args(tiny_t2v.path, tmp_path), *extra]) == 2
    err = capsys.readouterr().err
    assert "trnmodels video: error:" in err
    assert __import__("re").search(message, err), err
    assert not (tmp_path / "out.mp4").exists() and not (tmp_path / "latents.safetensors").exists()


def test_image_to_video_needs_an_image(tiny_i2v, tmp_path, capsys):
    assert main(cli_args(tiny_i2v.path, tmp_path)) == 2
    assert "image-to-video checkpoint" in capsys.readouterr().err
