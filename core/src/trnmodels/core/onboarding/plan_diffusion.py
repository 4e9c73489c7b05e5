"""Step 5 on paper for a diffusion pipeline: every TP x CP x CFG mesh of an instance, with the memory of
each component per NeuronCore (``trnmodels plan`` on a folder holding ``model_index.json``).

The pipeline serving the folder (``model_index.json``'s ``_class_name``, through the installed diffusion
plugins) sizes its own components: its classmethod ``plan_memory(checkpoint_dir, *, tp, cp, cfg_parallel,
num_frames, height, width, max_sequence_length, dtype, vae_dtype, vae_tiling, vae_patch_parallel)``
returns one ``ComponentMemory`` per component of rank 0 of the mesh, or raises what the pipeline would
raise for that mesh and video. Core enumerates the meshes, adds the components up per core and compares
with the core's HBM:

- every rank holds the TP-sharded components (text encoder, DiT experts); the VAE ranks (rank 0, or the
  first ``vae_patch_parallel`` ranks) hold the VAE as well, so they are the fullest cores and decide
  whether a mesh fits;
- components run one after another, so a rank's working memory is the largest of its components'.

The video defaults to what the pipeline generates when not told (its ``__call__``'s defaults).
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

from ..errors import ConfigError, TrnModelsError
from ..published import PUBLISHED_DIR
from .instances import get_instance

MODEL_INDEX = "model_index.json"
CFG_DEGREES = (1, 2)  # classifier-free guidance has two branches
VIDEO_FIELDS = ("num_frames", "height", "width", "max_sequence_length")


def diffusion_folder(spec: str) -> Path | None:
    """The pipeline folder ``spec`` names (a folder, or a bundled published pipeline), if it is one."""
    for folder in (Path(spec), PUBLISHED_DIR / spec) if spec else ():
        if (folder / MODEL_INDEX).is_file():
            return folder
    return None


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _video_defaults(pipeline: type[Any], given: dict[str, int | None]) -> dict[str, int]:
    """The given video settings, the rest from the pipeline's ``__call__`` defaults."""
    parameters = inspect.signature(pipeline.__call__).parameters
    video = {}
    for name in VIDEO_FIELDS:
        value = given.get(name)
        if value is None:
            default = parameters[name].default if name in parameters else inspect.Parameter.empty
            if not isinstance(default, int):
                raise ConfigError(
                    f"{pipeline.__name__} has no default {name}; pass --{name.replace('_', '-')}"
                )
            value = default
        video[name] = value
    return video


def mesh_totals(components: list[dict[str, Any]], hbm: int) -> dict[str, Any]:
    """Per-core sums of one mesh: the VAE ranks (every component) and the other ranks."""

    def totals(on_rank: list[dict[str, Any]]) -> tuple[int, int]:
        return (
            sum(c["weight_bytes"] for c in on_rank),
            max((c["working_bytes"] for c in on_rank), default=0),
        )

    weights, working = totals(components)
    other_weights, other_working = totals([c for c in components if not c["vae_ranks_only"]])
    total = weights + working
    return {
        "weight_bytes_per_core": weights,
        "working_bytes_per_core": working,
        "total_bytes_per_core": total,
        "other_ranks_total_bytes": other_weights + other_working,
        "hbm_bytes_per_core": hbm,
        "fits": total <= hbm,
        "headroom_bytes": hbm - total,
    }


def plan_diffusion(
    folder: Path,
    instance: str,
    *,
    num_frames: int | None = None,
    height: int | None = None,
    width: int | None = None,
    max_sequence_length: int | None = None,
    dtype: str = "bfloat16",
    vae_dtype: str = "float32",
    vae_tiling: bool = False,
    vae_patch_parallel: int = 1,
) -> dict[str, Any]:
    """Every TP x CP x CFG mesh of ``instance`` for the pipeline in ``folder`` (see the module docstring)."""
    from ..omni.registry import checkpoint_pipeline_hook, discover_pipelines
    from ..runtime_config import parse_dtype

    inst = get_instance(instance)
    architecture, pipeline, hook = checkpoint_pipeline_hook(
        folder, "plan_memory", "its components cannot be sized"
    )
    video = _video_defaults(
        pipeline,
        {
            "num_frames": num_frames,
            "height": height,
            "width": width,
            "max_sequence_length": max_sequence_length,
        },
    )
    request = {
        **video,
        "dtype": parse_dtype(dtype),
        "vae_dtype": parse_dtype(vae_dtype),
        "vae_tiling": vae_tiling,
        "vae_patch_parallel": vae_patch_parallel,
    }
    if vae_patch_parallel > inst.cores:
        raise ConfigError(
            f"--vae-patch-parallel {vae_patch_parallel} exceeds the {inst.cores} NeuronCores of {inst.name}"
        )
    hook(folder, tp=1, cp=1, cfg_parallel=1, **request)  # the video and the configs, before any mesh
    release = tuple(getattr(pipeline, "release_mesh", ()) or ())
    meshes, refused = [], []
    for tp in _divisors(inst.cores):
        for cp in _divisors(inst.cores // tp):
            for cfg in (c for c in CFG_DEGREES if inst.cores % (tp * cp * c) == 0):
                ranks = tp * cp * cfg
                try:
                    if vae_patch_parallel > ranks:
                        raise ConfigError(
                            f"--vae-patch-parallel {vae_patch_parallel} exceeds the mesh's {ranks} ranks"
                        )
                    components = hook(folder, tp=tp, cp=cp, cfg_parallel=cfg, **request)
                except TrnModelsError as e:
                    refused.append({"tp": tp, "cp": cp, "cfg": cfg, "reason": str(e)})
                    continue
                rows = [c.as_dict() for c in components]
                meshes.append(
                    {
                        "tp": tp,
                        "cp": cp,
                        "cfg": cfg,
                        "dp": inst.cores // ranks,
                        "cores_per_replica": ranks,
                        "release": (tp, cp, cfg) == release,
                        "components": rows,
                        **mesh_totals(rows, inst.hbm_bytes_per_core),
                    }
                )
    return {
        "kind": "diffusion",
        "source": str(folder),
        "architecture": architecture,
        "plugin": discover_pipelines()[architecture][0],
        "instance": inst.describe(),
        "settings": {
            **video,
            "dtype": dtype,
            "vae_dtype": vae_dtype,
            "vae_tiling": vae_tiling,
            "vae_patch_parallel": vae_patch_parallel,
        },
        "release_mesh": dict(zip(("tp", "cp", "cfg"), release, strict=True)) if release else None,
        "meshes": meshes,
        "refused": refused,
    }
