"""``trnmodels video``: generate a video with an installed diffusion plugin and write it as MP4.

    trnmodels video CHECKPOINT_DIR --prompt TEXT [--negative-prompt TEXT] [--image PATH]
        --num-frames N --height H --width W --steps S --seed S [--guidance-scale G] [--guidance-scale-2 G2]
        [--tp N --cfg-parallel N --cp N] --out OUT.mp4 [--latents-out FILE.safetensors] [--json]
        [--flow-shift F] [--vae-tiling] [--vae-patch-parallel N] [--ring-attention | --no-ring-attention]

The checkpoint's ``model_index.json`` names the pipeline (through the plugins' ``PIPELINE_REGISTRY``); an
image-to-video checkpoint needs ``--image``. With a mesh larger than one rank the pipeline runs on that
many local gloo ranks (``tp x cp x cfg-parallel``). ``--latents-out`` holds the final latents (tensor
``latents``, float32, before the VAE decode). Both files are written beside their target and renamed into
place once both are complete, so an interrupted or failed run leaves nothing half-written and the files
already there as they were.

Everything that can be checked before the ranks start is: the flags (finite floats in range, a seed in
[0, 2**64 - 1]), the output paths (writable file paths), the image (Pillow can decode it), and the mesh
and video size against the checkpoint's component configs (the pipeline's ``check_request``, see
``omni.registry``), so a bad request fails in a second with one line instead of after every rank has loaded.

The last line's options are what the pipeline's ``from_pretrained`` takes beyond the mesh: the scheduler's
``flow_shift`` (default: the checkpoint's), VAE spatial tiling (diffusers' grid of 256 px tiles every
192 px, used when the frame is larger than one tile), VAE patch parallelism (the tiles of the decode spread
over the first N ranks of the mesh; N > 1 always decodes tile by tile), and ring attention for context
parallelism (default: the ring where the CP group can run it, else all-gathered K/V; ``--ring-attention``
requires the ring, ``--no-ring-attention`` always all-gathers).
"""

from __future__ import annotations

import argparse
import os
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..argtypes import finite_float, positive_int, seed
from ..errors import InputError, TrnModelsError
from .outputs import replace_output

DTYPES = ("float32", "bfloat16")
# Guidance runs when the scale is > 1 (diffusers' switch); below that the scale is unused, and a negative
# or non-finite one is a mistake.
_guidance = finite_float(0)


# The run settings a job takes and the JSON report repeats, in this order.
RUN_FLAGS = (
    "tp",
    "cfg_parallel",
    "cp",
    "dtype",
    "flow_shift",
    "vae_tiling",
    "vae_patch_parallel",
    "ring_attention",
)


def add_video_parser(sub: Any) -> None:
    """Register ``trnmodels video`` on the CLI's subparsers."""
    p = sub.add_parser("video", help="generate a video with a diffusion plugin (text- or image-to-video)")
    p.add_argument("checkpoint_dir", type=Path)
    p.add_argument("--prompt", required=True)
    p.add_argument("--negative-prompt", default=None)
    p.add_argument("--image", type=Path, default=None, help="conditioning image (image-to-video checkpoints)")
    p.add_argument("--num-frames", type=positive_int, required=True, help="of the form 4k+1")
    p.add_argument("--height", type=positive_int, required=True)
    p.add_argument("--width", type=positive_int, required=True)
    p.add_argument("--steps", type=positive_int, required=True, help="denoising steps")
    p.add_argument("--seed", type=seed, required=True, help="an integer in [0, 2**64 - 1]")
    p.add_argument(
        "--guidance-scale",
        type=_guidance,
        default=5.0,
        help="classifier-free guidance, a finite number >= 0; <= 1 turns guidance off (default: 5)",
    )
    p.add_argument(
        "--guidance-scale-2",
        type=_guidance,
        default=None,
        help="the low-noise expert's, >= 0 (default: --guidance-scale)",
    )
    p.add_argument("--tp", type=positive_int, default=1, help="tensor-parallel degree (local gloo ranks)")
    p.add_argument(
        "--cfg-parallel", type=positive_int, default=1, help="1 or 2: one guidance branch per rank"
    )
    p.add_argument("--cp", type=positive_int, default=1, help="context-parallel degree")
    p.add_argument("--dtype", choices=DTYPES, default="float32", help="DiT and text encoder dtype")
    p.add_argument("--out", type=Path, required=True, help="output video (.mp4)")
    p.add_argument(
        "--latents-out", type=Path, default=None, help="final latents (.safetensors, tensor 'latents')"
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument(
        "--flow-shift",
        type=finite_float(0, low_open=True),
        default=None,
        metavar="F",
        help="scheduler flow_shift > 0 (default: the checkpoint's)",
    )
    p.add_argument(
        "--vae-tiling", action="store_true", help="decode (and encode) in 256 px tiles every 192 px"
    )
    p.add_argument(
        "--vae-patch-parallel",
        type=positive_int,
        default=1,
        metavar="N",
        help="spread the VAE decode's tiles over the first N ranks of the mesh",
    )
    p.add_argument(
        "--ring-attention",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="with --cp > 1: require ring attention, or (--no-ring-attention) all-gather K/V "
        "(default: the ring where it can run)",
    )
    p.set_defaults(run=cmd_video, print_human=print_video)


def _check_output(flag: str, path: Path) -> None:
    """A file path this run can write (beside it, then renamed): not a directory, in a writable directory."""
    if path.is_dir():
        raise InputError(f"{flag}: {path} is a directory; expected the path of a file to write")
    if path.exists() and not path.is_file():
        raise InputError(f"{flag}: {path} exists and is not a regular file")
    parent = path.parent
    if not parent.exists():
        raise InputError(f"{flag}: directory {parent} does not exist")
    if not parent.is_dir():
        raise InputError(f"{flag}: {parent} is not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise InputError(f"{flag}: cannot write to directory {parent} (permission denied)")


def _check_image(path: Path) -> None:
    """Decode the conditioning image here, so an unreadable one is refused before any rank starts."""
    if not path.is_file():
        raise InputError(f"--image: {path} is not a file")
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as image:
            image.load()
    except UnidentifiedImageError:
        raise InputError(
            f"--image: {path} is not an image Pillow can read (expected PNG, JPEG, WebP or another image file)"
        ) from None
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as e:
        reason = " ".join(str(e).split()) or type(e).__name__
        raise InputError(f"--image: {path} is not a readable image: {reason}") from None


def _check_paths(args: argparse.Namespace) -> None:
    for flag, path in (("--out", args.out), ("--latents-out", args.latents_out)):
        if path is not None:
            _check_output(flag, path)
    if args.out.suffix.lower() != ".mp4":
        raise InputError(f"--out: expected an .mp4 file, got {args.out.name}")
    if args.latents_out is not None and args.latents_out.resolve() == args.out.resolve():
        raise InputError(
            f"--latents-out: {args.latents_out} is also --out; give the latents a file of their own"
        )
    if args.image is not None:
        _check_image(args.image)


def _check_pipeline_options(args: argparse.Namespace) -> None:
    world = args.tp * args.cp * args.cfg_parallel
    if args.vae_patch_parallel > world:
        raise InputError(
            f"--vae-patch-parallel {args.vae_patch_parallel} exceeds the {world} rank(s) of the mesh "
            f"(--tp {args.tp} x --cp {args.cp} x --cfg-parallel {args.cfg_parallel})"
        )
    if args.ring_attention is not None and args.cp == 1:
        flag = "--ring-attention" if args.ring_attention else "--no-ring-attention"
        raise InputError(f"{flag} applies to context parallelism: it needs --cp 2 or more")


def generate_on_rank(rank: int, world_size: int, job: dict[str, Any]) -> dict[str, Any] | None:
    """Build the pipeline on this rank, generate, and (on the VAE rank) decode. Rank 0's result is kept."""
    import torch

    from ..omni.registry import pipeline_class

    pipe = pipeline_class(job["architecture"]).from_pretrained(
        job["checkpoint_dir"],
        tp=job["tp"],
        cfg_parallel=job["cfg_parallel"],
        cp=job["cp"],
        dtype=getattr(torch, job["dtype"]),
        flow_shift=job["flow_shift"],
        enable_ring_attention=job["ring_attention"],
        vae_use_tiling=job["vae_tiling"],
        vae_patch_parallel_size=job["vae_patch_parallel"],
    )
    kwargs: dict[str, Any] = dict(
        prompt=job["prompt"],
        negative_prompt=job["negative_prompt"],
        num_frames=job["num_frames"],
        height=job["height"],
        width=job["width"],
        num_inference_steps=job["steps"],
        guidance_scale=job["guidance_scale"],
        guidance_scale_2=job["guidance_scale_2"],
        generator=torch.Generator().manual_seed(job["seed"]),
        output_type="latent",
    )
    if job["image"] is not None:
        from PIL import Image

        kwargs["image"] = Image.open(job["image"]).convert("RGB")
    with torch.no_grad():
        latents = pipe(**kwargs).frames
        frames = pipe.decode_latents(latents, "np") if pipe.vae is not None else None
    if rank != 0:
        return None
    return {"latents": latents.to(torch.float32).contiguous(), "frames": frames}


def _user_error(error: BaseException) -> TrnModelsError | None:
    """A rank's TrnModelsError, recovered from the traceback text a spawned rank reports."""
    found = re.findall(r"trnmodels\.core\.errors\.(\w+Error): (.+)", str(error))
    return TrnModelsError(found[-1][1]) if found else None


def write_video(frames: Any, out: Path, fps: int) -> None:
    """``frames`` ``[F, H, W, 3]`` floats in [0, 1] as H.264 MP4 at ``fps`` frames per second, written
    atomically."""
    import imageio.v2 as imageio
    import numpy as np

    pixels = (np.clip(frames, 0.0, 1.0) * 255).round().astype(np.uint8)
    tmp = out.with_name(f".{out.stem}.partial{out.suffix}")
    try:
        # macro_block_size=1 keeps the exact size (the pipeline already makes it a multiple of 16).
        with imageio.get_writer(tmp, fps=fps, codec="libx264", macro_block_size=1, format="FFMPEG") as writer:
            for frame in pixels:
                writer.append_data(frame)
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)


def write_latents(latents: Any, out: Path) -> None:
    from safetensors.torch import save_file

    tmp = out.with_name(out.name + ".partial")
    try:
        save_file({"latents": latents}, str(tmp))
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)


def write_together(writes: list[tuple[Callable[[Path], None], Path]]) -> None:
    """Each ``write(path)`` to a file beside its target, then every file renamed into place: a run that
    fails while writing (the encoder, a full disk) leaves every file that was there as it was."""
    staged: list[tuple[Path, Path]] = []
    try:
        for write, target in writes:
            staged.append((target.with_name(f".{target.stem}.partial{target.suffix}"), target))
            write(staged[-1][0])
        for tmp, target in staged:
            replace_output(tmp, target)
    finally:
        for tmp, _ in staged:
            tmp.unlink(missing_ok=True)


def cmd_video(args: argparse.Namespace) -> dict[str, Any]:
    from ..omni.registry import check_request, checkpoint_architecture, conditions_on_image, frame_rate
    from ..parallel.launch import run_on_ranks
    from ..parallel.state import ParallelLayout

    _check_paths(args)
    _check_pipeline_options(args)
    architecture = checkpoint_architecture(args.checkpoint_dir)
    fps = frame_rate(architecture)  # the plugin's; a pipeline that declares none fails before any rank
    if conditions_on_image(architecture) and args.image is None:
        raise InputError(
            f"{args.checkpoint_dir} is an image-to-video checkpoint ({architecture}): pass --image"
        )
    if not conditions_on_image(architecture) and args.image is not None:
        raise InputError(
            f"{args.checkpoint_dir} is a text-to-video checkpoint ({architecture}): drop --image"
        )
    # The mesh and the video against the checkpoint's configs, before any rank starts.
    check_request(
        architecture,
        args.checkpoint_dir,
        tp=args.tp,
        cfg_parallel=args.cfg_parallel,
        cp=args.cp,
        num_frames=args.num_frames,
        height=args.height,
        width=args.width,
        guidance_scale=args.guidance_scale,
        guidance_scale_2=args.guidance_scale_2,
        vae_patch_parallel_size=args.vae_patch_parallel,
        enable_ring_attention=args.ring_attention,
    )
    job = {
        "architecture": architecture,
        "checkpoint_dir": str(args.checkpoint_dir),
        "prompt": args.prompt,
        "negative_prompt": args.negative_prompt,
        "image": None if args.image is None else str(args.image),
        "num_frames": args.num_frames,
        "height": args.height,
        "width": args.width,
        "steps": args.steps,
        "seed": args.seed,
        "guidance_scale": args.guidance_scale,
        "guidance_scale_2": args.guidance_scale_2,
        **{flag: getattr(args, flag) for flag in RUN_FLAGS},
    }
    layout = ParallelLayout(tp=args.tp, cp=args.cp, cfg=args.cfg_parallel)
    start = time.perf_counter()
    try:
        result = run_on_ranks(generate_on_rank, layout, job)
    except TrnModelsError:
        raise
    except Exception as e:  # a spawned rank's error arrives as text
        user = _user_error(e)
        if user is None:
            raise
        raise user from None
    seconds = time.perf_counter() - start
    latents, frames = result["latents"], result["frames"]
    writes: list[tuple[Callable[[Path], None], Path]] = [
        (lambda path: write_video(frames[0], path, fps), args.out)
    ]
    if args.latents_out is not None:
        writes.insert(0, (lambda path: write_latents(latents, path), args.latents_out))
    write_together(writes)
    out = {
        "out": str(args.out),
        "latents_out": None if args.latents_out is None else str(args.latents_out),
        "architecture": architecture,
        "frames": int(frames.shape[1]),
        "height": int(frames.shape[2]),
        "width": int(frames.shape[3]),
        "fps": fps,
        "latents_shape": list(latents.shape),
        **{flag: getattr(args, flag) for flag in RUN_FLAGS},
        "seconds": round(seconds, 3),
    }
    return out


def print_video(result: dict[str, Any]) -> None:
    where = f", latents in {result['latents_out']}" if result["latents_out"] else ""
    print(
        f"wrote {result['frames']} frames of {result['width']}x{result['height']} to {result['out']}{where} "
        f"({result['architecture']}, tp {result['tp']}, cfg {result['cfg_parallel']}, cp {result['cp']}, "
        f"{result['seconds']:.1f} s)"
    )
