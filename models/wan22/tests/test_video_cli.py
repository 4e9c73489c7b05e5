"""`trnmodels video` on a tiny checkpoint it has never seen: latents against diffusers' WanPipeline, a
playable MP4, the latents file, the pipeline options (flow shift, VAE tiling and patch parallelism, ring
attention) against diffusers, and clear errors for bad input."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from diffusers import UniPCMultistepScheduler, WanPipeline
from safetensors.torch import load_file

from trnmodels.core.cli import main
from trnmodels.core.diffusion import video_cli

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


def reference_pipeline(tiny_t2v, **replace) -> WanPipeline:
    """diffusers' WanPipeline on the checkpoint's components, some replaced (the fixture stays as it is)."""
    ref = tiny_t2v.reference
    components = dict(
        tokenizer=ref.tokenizer,
        text_encoder=ref.text_encoder,
        vae=ref.vae,
        scheduler=ref.scheduler,
        transformer=ref.transformer,
        transformer_2=ref.transformer_2,
    )
    pipe = WanPipeline(**{**components, **replace}, boundary_ratio=ref.config.boundary_ratio)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def reference_output(pipe: WanPipeline, output_type: str, **video) -> torch.Tensor:
    args = {**ARGS, **video}
    with torch.no_grad():
        return pipe(
            prompt=PROMPT,
            negative_prompt=NEGATIVE,
            num_frames=args["num_frames"],
            height=args["height"],
            width=args["width"],
            num_inference_steps=args["steps"],
            guidance_scale=args["guidance_scale"],
            guidance_scale_2=args["guidance_scale_2"],
            generator=torch.Generator().manual_seed(args["seed"]),
            output_type=output_type,
        ).frames


def test_flow_shift_matches_diffusers_with_that_shift(tiny_t2v, reference_latents, tmp_path):
    assert tiny_t2v.reference.scheduler.config.flow_shift != 5.0
    scheduler = UniPCMultistepScheduler.from_config(tiny_t2v.reference.scheduler.config, flow_shift=5.0)
    expected = reference_output(reference_pipeline(tiny_t2v, scheduler=scheduler), "latent")
    assert main([*cli_args(tiny_t2v.path, tmp_path), "--flow-shift", "5", "--json"]) == 0
    latents = load_file(tmp_path / "latents.safetensors")["latents"]
    torch.testing.assert_close(latents, expected.float(), rtol=1e-4, atol=1e-5)
    assert (latents - reference_latents.float()).abs().max() > 1e-2  # the shift changed the trajectory


# 272x32 -> 34x4 latents: taller than one 256 px tile (32 latent px), so the decode runs on two tiles
# (rows at 0 and 192 px) blended over 64 px; 68 DiT tokens.
TILED = dict(height=272, width=32)


def run_capturing_frames(monkeypatch, args: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """Run the CLI; the frames it writes to the MP4 (before encoding) and the latents it writes."""
    captured = []

    def capture(frames, out, fps=video_cli.FPS):
        captured.append(torch.from_numpy(frames.copy()))
        original(frames, out, fps)

    original = video_cli.write_video
    monkeypatch.setattr(video_cli, "write_video", capture)
    assert main([*args, "--json"]) == 0
    latents_path = args[args.index("--latents-out") + 1]
    return load_file(latents_path)["latents"], captured[0]


def tiled_args(tiny_t2v, out_dir, *extra: str) -> list[str]:
    args = cli_args(tiny_t2v.path, out_dir, *extra)
    for key, value in TILED.items():
        args[args.index(f"--{key}") + 1] = str(value)
    return args


@pytest.fixture(scope="module")
def tiled_run(tiny_t2v, tmp_path_factory):
    monkeypatch = pytest.MonkeyPatch()
    try:
        return run_capturing_frames(
            monkeypatch, tiled_args(tiny_t2v, tmp_path_factory.mktemp("tiled"), "--vae-tiling")
        )
    finally:
        monkeypatch.undo()


def test_vae_tiling_matches_diffusers_tiled_decode(tiny_t2v, tiled_run):
    _, frames = tiled_run
    tiled_vae = copy.deepcopy(tiny_t2v.reference.vae)
    tiled_vae.enable_tiling()
    tiled = torch.from_numpy(reference_output(reference_pipeline(tiny_t2v, vae=tiled_vae), "np", **TILED)[0])
    untiled = torch.from_numpy(reference_output(reference_pipeline(tiny_t2v), "np", **TILED)[0])
    assert frames.shape == (5, 272, 32, 3)
    torch.testing.assert_close(frames, tiled, rtol=1e-4, atol=1e-5)
    assert (frames - untiled).abs().max() > 1e-4  # tiling took effect: the seams blend differently


def test_vae_patch_parallel_and_ring_attention_on_two_ranks_equal_one_rank(
    tiny_t2v, tiled_run, tmp_path, monkeypatch
):
    """One 2-rank run for both options: CP=2 with the ring required (the DiT), and the decode's two tiles
    spread over both ranks (the VAE)."""
    extra = ("--vae-tiling", "--vae-patch-parallel", "2", "--cp", "2", "--ring-attention")
    latents, frames = run_capturing_frames(monkeypatch, tiled_args(tiny_t2v, tmp_path, *extra))
    torch.testing.assert_close(latents, tiled_run[0], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(frames, tiled_run[1], rtol=1e-4, atol=1e-5)


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
        (["--flow-shift", "0"], "--flow-shift: expected a positive number, got 0.0"),
        (["--flow-shift", "nan"], "--flow-shift: expected a positive number, got nan"),
        (["--vae-patch-parallel", "2"], "--vae-patch-parallel 2 exceeds the 1 rank\\(s\\) of the mesh"),
        (["--ring-attention"], "--ring-attention applies to context parallelism: it needs --cp 2"),
        (["--no-ring-attention"], "--no-ring-attention applies to context parallelism"),
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
