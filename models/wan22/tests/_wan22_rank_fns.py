"""Rank functions for ``test_pipeline_parallel.py``, in a plain module so spawned ranks can import it
(pytest's importlib mode gives test modules names a spawned child cannot import)."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist

from trnmodels.core.errors import ConfigError, InputError
from trnmodels.core.parallel import destroy_parallel_state, init_parallel_state


def _error(fn) -> str | None:
    try:
        fn()
    except (ConfigError, InputError) as e:
        return f"{type(e).__name__}: {e}"
    return None


def single_steps(rank: int, world_size: int, t2v_dir: str, i2v_dir: str, call: dict, image) -> list[dict]:
    """One denoising step in each 2-rank mesh: T2V at TP=2, CP=2 (ring and all-gather self-attention)
    and CFG=2, I2V at CFG=2. Returns every rank's latents per mesh, the errors only a mesh can raise, and
    what the rank without the VAE sees."""
    from trnmodels.wan22.pipeline_i2v import Wan22ImageToVideoPipeline
    from trnmodels.wan22.pipeline_t2v import Wan22Pipeline

    out: dict = {"rank": rank}
    meshes = {
        "tp2": (Wan22Pipeline, t2v_dir, dict(tp=2), dict(tp_degree=2)),
        "cp2_ring": (Wan22Pipeline, t2v_dir, dict(cp=2, enable_ring_attention=True), dict(cp_degree=2)),
        "cp2_allgather": (Wan22Pipeline, t2v_dir, dict(cp=2, enable_ring_attention=False), dict(cp_degree=2)),
        "cfg2": (Wan22Pipeline, t2v_dir, dict(cfg_parallel=2), dict(cfg_degree=2)),
        "i2v_cfg2": (Wan22ImageToVideoPipeline, i2v_dir, dict(cfg_parallel=2), dict(cfg_degree=2)),
    }
    for name, (cls, path, pipe_args, mesh) in meshes.items():
        destroy_parallel_state()
        init_parallel_state(mesh.pop("tp_degree", 1), **mesh)
        pipe = cls.from_pretrained(Path(path), dtype=torch.float32, **pipe_args)
        args = call | ({"image": image} if name.startswith("i2v") else {})
        out[name] = pipe(generator=torch.Generator().manual_seed(0), **args).frames
        if name == "cfg2":
            out["cfg2_no_guidance"] = _error(lambda p=pipe: p(**{**call, "guidance_scale": 1.0}))
            out["has_vae"] = pipe.vae is not None
            video = pipe(generator=torch.Generator().manual_seed(0), **{**call, "output_type": "pt"}).frames
            out["video_shape"] = None if video is None else tuple(video.shape)
        if name == "cp2_allgather":
            # 16x16 pixels, 1 frame: one latent token, which 2 CP ranks cannot split.
            out["cp2_indivisible"] = _error(
                lambda p=pipe: p(**{**call, "height": 16, "width": 16, "num_frames": 1})
            )
    gathered: list = [None] * world_size
    dist.all_gather_object(gathered, out)
    return gathered


def dit_outputs(rank: int, world_size: int, checkpoint_dir: str, inputs: tuple) -> list[dict]:
    """Both experts of ``checkpoint_dir`` in FP32 at TP=``world_size`` on the same inputs; every rank's
    outputs (``test_published_configs.py``)."""
    from trnmodels.wan22.transformer import WanDiT

    out = {"rank": rank}
    for name in ("transformer", "transformer_2"):
        with torch.no_grad():
            out[name] = WanDiT.from_pretrained(Path(checkpoint_dir) / name)(*inputs)
    gathered: list = [None] * world_size
    dist.all_gather_object(gathered, out)
    return gathered


def pipeline_bytes(rank: int, world_size: int, checkpoint_dir: str) -> list[dict]:
    """Build the text-to-video pipeline in the running mesh (FP32) and count, per component, the bytes of
    the distinct storages its parameters and buffers hold on this rank; every rank's counts, in rank
    order (what ``trnmodels plan`` must predict)."""
    from trnmodels.core.parallel import get_parallel_layout
    from trnmodels.wan22.pipeline_t2v import Wan22Pipeline

    layout = get_parallel_layout()
    pipe = Wan22Pipeline.from_pretrained(
        Path(checkpoint_dir), tp=layout.tp, cp=layout.cp, cfg_parallel=layout.cfg, dtype=torch.float32
    )
    mine: dict = {"rank": rank}
    for name in ("text_encoder", "transformer", "transformer_2", "vae"):
        module = getattr(pipe, name)
        if module is not None:
            storages = {
                t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
                for t in (*module.parameters(), *module.buffers())
            }
            mine[name] = sum(storages.values())
    if world_size == 1:
        return [mine]
    gathered: list = [None] * world_size
    dist.all_gather_object(gathered, mine)
    return gathered
