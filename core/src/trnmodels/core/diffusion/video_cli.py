"""``trnmodels video``: generate a video with an installed diffusion plugin and write it as MP4.

    trnmodels video CHECKPOINT_DIR --prompt TEXT [--negative-prompt TEXT] [--image PATH]
        --num-frames N --height H --width W --steps S --seed S [--guidance-scale G] [--guidance-scale-2 G2]
        [--tp N --cfg-parallel N --cp N] --out OUT.mp4 [--latents-out FILE.safetensors] [--json]
        [--flow-shift F] [--vae-tiling] [--vae-patch-parallel N] [--ring-attention | --no-ring-attention]

The checkpoint's ``model_index.json`` names the pipeline (through the plugins' ``PIPELINE_REGISTRY``); an
image-to-video checkpoint needs ``--image``. With a mesh larger than one rank the pipeline runs on that
many local gloo ranks (``tp x cp x cfg-parallel``). ``--latents-out`` holds the final latents (tensor
``latents``, float32, before the VAE decode). Both files are written beside their target and renamed into
place, so an interrupted run leaves nothing half-written.

The last line's options are what the pipeline's ``from_pretrained`` takes beyond the mesh: the scheduler's
``flow_shift`` (default: the checkpoint's), VAE spatial tiling (diffusers' grid of 256 px tiles every
192 px, used when the frame is larger than one tile), VAE patch parallelism (the tiles of the decode spread
over the first N ranks of the mesh; N > 1 always decodes tile by tile), and ring attention for context
parallelism (default: the ring where the CP group can run it, else all-gathered K/V; ``--ring-attention``
requires the ring, ``--no-ring-attention`` always all-gathers).
"""

from __future__ import annotations

import argparse
import math
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

from ..errors import InputError, TrnModelsError

FPS = 16  # Wan2.x generates 16 frames per second of video
DTYPES = ("float32", "bfloat16")
_IMAGE_TO_VIDEO = ("WanImageToVideoPipeline", "Wan22ImageToVideoPipeline")


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def add_video_parser(sub: Any) -> None:
    """Register ``trnmodels video`` on the CLI's subparsers."""
    p = sub.add_parser("video", help="generate a video with a diffusion plugin (text- or image-to-video)")
    p.add_argument("checkpoint_dir", type=Path)
    p.add_argument("--prompt", required=True)
    p.add_argument("--negative-prompt", default=None)
    p.add_argument("--image", type=Path, default=None, help="conditioning image (image-to-video checkpoints)")
    p.add_argument("--num-frames", type=_positive, required=True, help="of the form 4k+1")
    p.add_argument("--height", type=_positive, required=True)
    p.add_argument("--width", type=_positive, required=True)
    p.add_argument("--steps", type=_positive, required=True, help="denoising steps")
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--guidance-scale", type=float, default=5.0)
    p.add_argument(
        "--guidance-scale-2", type=float, default=None, help="low-noise expert (default: --guidance-scale)"
    )
    p.add_argument("--tp", type=_positive, default=1, help="tensor-parallel degree (local gloo ranks)")
    p.add_argument("--cfg-parallel", type=_positive, default=1, help="1 or 2: one guidance branch per rank")
    p.add_argument("--cp", type=_positive, default=1, help="context-parallel degree")
    p.add_argument("--dtype", choices=DTYPES, default="float32", help="DiT and text encoder dtype")
    p.add_argument("--out", type=Path, required=True, help="output video (.mp4)")
    p.add_argument(
        "--latents-out", type=Path, default=None, help="final latents (.safetensors, tensor 'latents')"
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument(
        "--flow-shift",
        type=float,
        default=None,
        metavar="F",
        help="scheduler flow_shift > 0 (default: the checkpoint's)",
    )
    p.add_argument(
        "--vae-tiling", action="store_true", help="decode (and encode) in 256 px tiles every 192 px"
    )
    p.add_argument(
        "--vae-patch-parallel",
        type=_positive,
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
    p.set_defaults(run=cmd_video)


def _check_paths(args: argparse.Namespace) -> None:
    for flag, path in (("--out", args.out), ("--latents-out", args.latents_out)):
        if path is not None and not path.parent.exists():
            raise InputError(f"{flag}: directory {path.parent} does not exist")
    if args.out.suffix.lower() != ".mp4":
        raise InputError(f"--out: expected an .mp4 file, got {args.out.name}")
    if args.image is not None and not args.image.is_file():
        raise InputError(f"--image: {args.image} is not a file")


def _check_pipeline_options(args: argparse.Namespace) -> None:
    if args.flow_shift is not None and not (math.isfinite(args.flow_shift) and args.flow_shift > 0):
        raise InputError(f"--flow-shift: expected a positive number, got {args.flow_shift}")
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

    from .registry import pipeline_class

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


def write_video(frames: Any, out: Path, fps: int = FPS) -> None:
    """``frames`` ``[F, H, W, 3]`` floats in [0, 1] as H.264 MP4, written atomically."""
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


def cmd_video(args: argparse.Namespace) -> dict[str, Any]:
    from ..parallel.launch import run_on_ranks
    from ..parallel.state import ParallelLayout
    from .registry import checkpoint_architecture

    _check_paths(args)
    _check_pipeline_options(args)
    architecture = checkpoint_architecture(args.checkpoint_dir)
    if architecture in _IMAGE_TO_VIDEO and args.image is None:
        raise InputError(
            f"{args.checkpoint_dir} is an image-to-video checkpoint ({architecture}): pass --image"
        )
    if architecture not in _IMAGE_TO_VIDEO and args.image is not None:
        raise InputError(
            f"{args.checkpoint_dir} is a text-to-video checkpoint ({architecture}): drop --image"
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
        "tp": args.tp,
        "cfg_parallel": args.cfg_parallel,
        "cp": args.cp,
        "dtype": args.dtype,
        "flow_shift": args.flow_shift,
        "vae_tiling": args.vae_tiling,
        "vae_patch_parallel": args.vae_patch_parallel,
        "ring_attention": args.ring_attention,
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
    if args.latents_out is not None:
        write_latents(latents, args.latents_out)
    write_video(frames[0], args.out)
    out = {
        "out": str(args.out),
        "latents_out": None if args.latents_out is None else str(args.latents_out),
        "architecture": architecture,
        "frames": int(frames.shape[1]),
        "height": int(frames.shape[2]),
        "width": int(frames.shape[3]),
        "fps": FPS,
        "latents_shape": list(latents.shape),
        "tp": args.tp,
        "cfg_parallel": args.cfg_parallel,
        "cp": args.cp,
        "dtype": args.dtype,
        "flow_shift": args.flow_shift,
        "vae_tiling": args.vae_tiling,
        "vae_patch_parallel": args.vae_patch_parallel,
        "ring_attention": args.ring_attention,
        "seconds": round(seconds, 3),
    }
    if not args.json:
        where = f", latents in {args.latents_out}" if args.latents_out else ""
        print(
            f"wrote {out['frames']} frames of {out['width']}x{out['height']} to {args.out}{where} "
            f"({architecture}, tp {args.tp}, cfg {args.cfg_parallel}, cp {args.cp}, {seconds:.1f} s)",
            file=sys.stdout,
        )
    return out
