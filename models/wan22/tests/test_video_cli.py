"""`trnmodels video` on a tiny checkpoint it has never seen: latents against diffusers' WanPipeline, a
playable MP4, the latents file, the pipeline options (flow shift, VAE tiling and patch parallelism, ring
attention) against diffusers, and clear errors for bad input."""

from __future__ import annotations

import copy
import json
import shlex

import pytest
import torch
from diffusers import UniPCMultistepScheduler, WanPipeline
from safetensors.torch import load_file

from trnmodels.core.cli import main
from trnmodels.core.cli import video as video_cli
from trnmodels.core.parallel import launch
from trnmodels.core.testing.bad_inputs import BadInput, check_one_line_error

from .bad_inputs import BAD_INPUTS

# The reference call in diffusers' own argument names (the seed goes in as a generator). The CLI's flags
# are derived from these names (FLAGS names the one that differs), so both sides run the same request.
PROMPTS = dict(prompt="a red fox running through snow", negative_prompt="blurry")
SIZE = dict(num_frames=5, height=32, width=32)
CALL = dict(**PROMPTS, **SIZE, num_inference_steps=2, guidance_scale=4.0, guidance_scale_2=3.0)
SEED = 7
FLAGS = {"num_inference_steps": "--steps"}


def cli_args(checkpoint, out_dir, *extra: str, **call) -> list[str]:
    """``trnmodels video`` with ``CALL`` (some arguments replaced by ``call``) and ``SEED``, writing
    ``out.mp4`` and ``latents.safetensors`` into ``out_dir``; ``extra`` flags go last."""
    args = ["video", str(checkpoint), "--seed", str(SEED)]
    for name, value in {**CALL, **call}.items():
        args += [FLAGS.get(name, "--" + name.replace("_", "-")), str(value)]
    outputs = ["--out", str(out_dir / "out.mp4"), "--latents-out", str(out_dir / "latents.safetensors")]
    return [*args, *outputs, *extra]


def reference_output(pipe: WanPipeline, output_type: str, **call) -> torch.Tensor:
    """diffusers' frames (or latents) for ``CALL`` with some arguments replaced by ``call``."""
    generator = torch.Generator().manual_seed(SEED)
    with torch.no_grad():
        return pipe(**{**CALL, **call}, generator=generator, output_type=output_type).frames


def reference_pipeline(tiny_t2v, **replace) -> WanPipeline:
    """diffusers' WanPipeline on the checkpoint's components, some replaced (the fixture stays as it is)."""
    pipe = WanPipeline.from_pipe(tiny_t2v.reference, **replace)
    pipe.set_progress_bar_config(disable=True)
    return pipe


@pytest.fixture(scope="module")
def reference_latents(tiny_t2v) -> torch.Tensor:
    return reference_output(tiny_t2v.reference, "latent")


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

    def capture(frames, out, fps):
        captured.append(torch.from_numpy(frames.copy()))
        original(frames, out, fps)

    original = video_cli.write_video
    monkeypatch.setattr(video_cli, "write_video", capture)
    assert main([*args, "--json"]) == 0
    latents_path = args[args.index("--latents-out") + 1]
    return load_file(latents_path)["latents"], captured[0]


@pytest.fixture(scope="module")
def tiled_run(tiny_t2v, tmp_path_factory):
    monkeypatch = pytest.MonkeyPatch()
    try:
        return run_capturing_frames(
            monkeypatch, cli_args(tiny_t2v.path, tmp_path_factory.mktemp("tiled"), "--vae-tiling", **TILED)
        )
    finally:
        monkeypatch.undo()


@pytest.mark.slow  # a 272-pixel-high tiled video, twice through diffusers too
def test_vae_tiling_matches_diffusers_tiled_decode(tiny_t2v, tiled_run):
    _, frames = tiled_run
    tiled_vae = copy.deepcopy(tiny_t2v.reference.vae)
    tiled_vae.enable_tiling()
    tiled = torch.from_numpy(reference_output(reference_pipeline(tiny_t2v, vae=tiled_vae), "np", **TILED)[0])
    untiled = torch.from_numpy(reference_output(reference_pipeline(tiny_t2v), "np", **TILED)[0])
    assert frames.shape == (5, 272, 32, 3)
    torch.testing.assert_close(frames, tiled, rtol=1e-4, atol=1e-5)
    assert (frames - untiled).abs().max() > 1e-4  # tiling took effect: the seams blend differently


@pytest.mark.slow  # two gloo ranks
def test_vae_patch_parallel_and_ring_attention_on_two_ranks_equal_one_rank(
    tiny_t2v, tiled_run, tmp_path, monkeypatch
):
    """One 2-rank run for both options: CP=2 with the ring required (the DiT), and the decode's two tiles
    spread over both ranks (the VAE)."""
    extra = ("--vae-tiling", "--vae-patch-parallel", "2", "--cp", "2", "--ring-attention")
    latents, frames = run_capturing_frames(monkeypatch, cli_args(tiny_t2v.path, tmp_path, *extra, **TILED))
    torch.testing.assert_close(latents, tiled_run[0], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(frames, tiled_run[1], rtol=1e-4, atol=1e-5)


@pytest.mark.slow  # two gloo ranks
def test_video_cfg_parallel_two_ranks(tiny_t2v, reference_latents, tmp_path):
    assert main([*cli_args(tiny_t2v.path, tmp_path), "--cfg-parallel", "2", "--json"]) == 0
    latents = load_file(tmp_path / "latents.safetensors")["latents"]
    torch.testing.assert_close(latents, reference_latents.float(), rtol=1e-4, atol=1e-5)


def run(argv: list[str], capsys) -> tuple[int, str]:
    """``trnmodels ARGV`` in this process: (exit code, stderr); argparse's errors exit through SystemExit."""
    try:
        code = main(argv)
    except SystemExit as e:
        code = e.code
    return code, capsys.readouterr().err


@pytest.fixture
def no_ranks(monkeypatch):
    """Fail if the command starts its ranks: bad input must be refused before any process starts."""

    def started(*args, **kwargs):
        raise AssertionError("run_on_ranks was called: a rank was started before the input was checked")

    monkeypatch.setattr(launch, "run_on_ranks", started)


@pytest.mark.parametrize("case", BAD_INPUTS, ids=[case.input for case in BAD_INPUTS])
def test_bad_input_is_one_line_before_any_rank_starts(
    tiny_t2v, tmp_path, monkeypatch, capsys, no_ranks, case
):
    monkeypatch.chdir(tmp_path)  # the cases name files relative to the working directory
    (tmp_path / "clips.mp4").mkdir()
    (tmp_path / "notes.txt").write_text("not an image\n")
    old = {name: f"old {name}".encode() for name in ("out.mp4", "latents.safetensors")}
    for name, content in old.items():
        (tmp_path / name).write_bytes(content)
    extra = shlex.split(case.input, comments=True)
    code, err = run([*cli_args(tiny_t2v.path, tmp_path), *extra], capsys)
    check_one_line_error(code, err, case)
    for name, content in old.items():  # what was on disk is still there, and nothing half-written
        assert (tmp_path / name).read_bytes() == content
    assert not list(tmp_path.glob("*partial*"))


def test_existing_outputs_are_kept_until_both_new_files_are_complete(tiny_t2v, tmp_path, monkeypatch):
    """A run that fails while writing (here the MP4 encoder) leaves both old files as they were."""
    import imageio.v2 as imageio
    import numpy as np

    old = {name: f"old {name}".encode() for name in ("out.mp4", "latents.safetensors")}
    for name, content in old.items():
        (tmp_path / name).write_bytes(content)
    result = {"latents": torch.zeros(1, 16, 2, 4, 4), "frames": np.zeros((1, 5, 32, 32, 3), np.float32)}
    monkeypatch.setattr(launch, "run_on_ranks", lambda *args: result)

    def broken_writer(*args, **kwargs):
        raise RuntimeError("the encoder died")

    monkeypatch.setattr(imageio, "get_writer", broken_writer)
    with pytest.raises(RuntimeError, match="the encoder died"):
        main(cli_args(tiny_t2v.path, tmp_path))
    for name, content in old.items():
        assert (tmp_path / name).read_bytes() == content
    assert not list(tmp_path.glob("*partial*"))


def test_image_to_video_needs_an_image(tiny_i2v, tmp_path, capsys, no_ranks):
    code, err = run(cli_args(tiny_i2v.path, tmp_path), capsys)
    check_one_line_error(
        code, err, BadInput("video", "(an image-to-video checkpoint)", "image-to-video checkpoint")
    )


def test_check_request_accepts_the_meshes_the_pipeline_runs(tiny_t2v, tiny_i2v):
    """The pre-launch check refuses nothing the pipeline runs (the 2-rank runs above use CFG 2 and CP 2)."""
    from trnmodels.core.omni.registry import check_request, conditions_on_image

    video = dict(num_frames=5, height=32, width=32, guidance_scale=4.0, guidance_scale_2=3.0)
    for checkpoint, architecture in ((tiny_t2v, "WanPipeline"), (tiny_i2v, "WanImageToVideoPipeline")):
        for mesh in (dict(tp=2), dict(cfg_parallel=2), dict(cp=2), dict(tp=2, cfg_parallel=2, cp=2)):
            check_request(architecture, checkpoint.path, **mesh, **video)
    assert conditions_on_image("Wan22I2VPipeline") and not conditions_on_image("Wan22Pipeline")


def test_a_nan_weight_fails_naming_the_step_and_keeps_what_was_on_disk(tiny_t2v, tmp_path, capsys):
    """Only the required flags: the run stops at the first DiT step, and neither output is written."""
    import shutil

    from safetensors.torch import save_file

    broken = tmp_path / "nan-weight"
    shutil.copytree(tiny_t2v.path, broken)
    weights = broken / "transformer" / "diffusion_pytorch_model.safetensors"
    state = load_file(weights)
    state["scale_shift_table"].view(-1)[0] = float("nan")
    save_file(state, weights)
    out = tmp_path / "out.mp4"
    out.write_bytes(b"old video")
    args = ["video", str(broken), "--prompt", PROMPTS["prompt"], "--seed", "0", "--out", str(out)]
    args += ["--num-frames", "5", "--height", "32", "--width", "32", "--steps", "2"]
    code, err = run(args, capsys)
    check_one_line_error(
        code,
        err,
        BadInput(
            "video",
            "(a NaN in the high-noise expert's scale_shift_table)",
            "denoise step 1 of 2 (timestep 999): transformer's prediction: NaN or inf",
        ),
    )
    assert "checkpoint key scale_shift_table holds NaN or inf" in err
    assert out.read_bytes() == b"old video"
    assert not list(tmp_path.glob("*partial*"))
