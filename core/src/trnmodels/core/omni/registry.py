"""The installed diffusion pipelines: every plugin's ``PIPELINE_REGISTRY``, found through entry points.

A diffusion plugin declares ``[project.entry-points."trnmodels.diffusion"] <name> = "<package>:PIPELINE_REGISTRY"``,
a dict from architecture key (a checkpoint's ``model_index.json`` ``_class_name``, a stage YAML's
``model_class_name``) to the ``"module:Class"`` of the class vLLM-Omni's engine serves it with (an
``engine.OmniDiffusionPipeline``); that class's ``pipeline_class`` is the diffusers-style pipeline
local runners build. Nothing here imports torch or a pipeline module until a class is asked for.

Core knows no model's constants: the pipeline class declares them. ``fps`` (required of a video
pipeline) is the frame rate of the videos it generates, which ``trnmodels video`` writes its MP4 at.
Two optional attributes let a launcher check a request before it starts any rank:
``conditions_on_image`` (an image-to-video pipeline, default false) and the classmethod ``check_request(checkpoint_dir, **request)``, which raises a ``TrnModelsError`` for a
mesh or video the pipeline would refuse, reading only the checkpoint's config files (no weights, no
model, no process group). ``request`` uses ``from_pretrained``/``__call__``'s names (``tp``,
``cfg_parallel``, ``cp``, ``num_frames``, ``height``, ``width``, ``guidance_scale``...); a pipeline
ignores the ones it does not take. ``trnmodels plan`` reads two more: the classmethod
``plan_memory(checkpoint_dir, *, tp, cp, cfg_parallel, num_frames, height, width, max_sequence_length,
dtype, vae_dtype, vae_tiling, vae_patch_parallel)`` (a list of ``diffusion.memory.ComponentMemory``, one
rank's components; see ``onboarding.plan_diffusion``) and ``release_mesh`` (``(tp, cp, cfg)``, marked in
the plan).
"""

from __future__ import annotations

import importlib
import json
from importlib import metadata
from pathlib import Path
from typing import Any

from ..errors import ConfigError

ENTRY_POINT_GROUP = "trnmodels.diffusion"


def discover_pipelines() -> dict[str, tuple[str, str]]:
    """Architecture key -> (plugin name, ``"module:Class"``), over every installed diffusion plugin."""
    found: dict[str, tuple[str, str]] = {}
    for ep in sorted(metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
        registry = ep.load()
        if not isinstance(registry, dict) or not all(
            isinstance(k, str) and isinstance(v, str) and ":" in v for k, v in registry.items()
        ):
            raise ConfigError(
                f"entry point {ep.name} = {ep.value}: expected a dict of architecture -> 'module:Class'"
            )
        for arch, target in registry.items():
            found[arch] = (ep.name, target)
    return found


def diffusion_plugins() -> list[dict[str, Any]]:
    """Each installed diffusion plugin: name, version, distribution and the architectures it registers."""
    pipelines = discover_pipelines()
    plugins = []
    for ep in sorted(metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
        dist = ep.dist
        plugins.append(
            {
                "name": ep.name,
                "version": dist.version if dist else "unknown",
                "distribution": dist.name if dist else None,
                "architectures": sorted(a for a, (plugin, _) in pipelines.items() if plugin == ep.name),
            }
        )
    return plugins


def pipeline_class(architecture: str) -> type[Any]:
    """The diffusers-style pipeline serving ``architecture`` (the registered engine class's ``pipeline_class``)."""
    pipelines = discover_pipelines()
    if architecture not in pipelines:
        raise ConfigError(
            f"architecture {architecture!r} is served by no installed diffusion plugin; "
            f"installed: {sorted(pipelines) or 'none'}"
        )
    module, _, cls = pipelines[architecture][1].partition(":")
    engine_class = getattr(importlib.import_module(module), cls)
    return getattr(engine_class, "pipeline_class", engine_class)


def checkpoint_architecture(checkpoint_dir: str | Path) -> str:
    """A diffusers checkpoint's ``_class_name`` (from ``model_index.json``)."""
    path = Path(checkpoint_dir) / "model_index.json"
    if not path.is_file():
        raise ConfigError(f"{checkpoint_dir}: no model_index.json (expected a diffusers pipeline checkpoint)")
    try:
        name = json.loads(path.read_text()).get("_class_name")
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path}: not valid JSON: {e}") from None
    if not isinstance(name, str):
        raise ConfigError(f"{path}: no _class_name")
    return name


def refuse_pipeline_without_index(folder: str | Path) -> None:
    """A folder of diffusers component folders (``transformer/config.json``...) but no ``model_index.json``
    and no ``config.json``: say that, rather than that a causal LM's ``config.json`` is missing."""
    folder = Path(folder)
    if not folder.is_dir() or (folder / "model_index.json").is_file() or (folder / "config.json").is_file():
        return
    components = sorted(
        sub.name
        for sub in folder.iterdir()
        if (sub / "config.json").is_file() or (sub / "scheduler_config.json").is_file()
    )
    if components:
        raise ConfigError(
            f"{folder}: diffusers component folders ({', '.join(components)}) but no model_index.json: a "
            "pipeline is read from its whole checkpoint folder, which names the pipeline class there"
        )


def checkpoint_pipeline_hook(
    checkpoint_dir: str | Path, hook: str, purpose: str
) -> tuple[str, type[Any], Any]:
    """``(architecture, pipeline class, its classmethod hook)`` for a pipeline folder; a pipeline without
    the hook is refused, saying what it is needed for."""
    architecture = checkpoint_architecture(checkpoint_dir)
    pipeline = pipeline_class(architecture)
    method = getattr(pipeline, hook, None)
    if method is None:
        raise ConfigError(
            f"{checkpoint_dir}: the pipeline serving {architecture!r} ({pipeline.__name__}) has no {hook} "
            f"classmethod, so {purpose}"
        )
    return architecture, pipeline, method


def conditions_on_image(architecture: str) -> bool:
    """Whether the pipeline serving ``architecture`` generates from an image (image-to-video)."""
    return bool(getattr(pipeline_class(architecture), "conditions_on_image", False))


def frame_rate(architecture: str) -> int:
    """The frames per second of the videos the pipeline serving ``architecture`` generates (its ``fps``)."""
    fps = getattr(pipeline_class(architecture), "fps", None)
    if not isinstance(fps, int) or isinstance(fps, bool) or fps < 1:
        raise ConfigError(
            f"the pipeline serving {architecture!r} declares no frame rate "
            f"(expected a positive integer class attribute fps, got {fps!r})"
        )
    return fps


def check_request(architecture: str, checkpoint_dir: str | Path, **request: Any) -> None:
    """Refuse, before any rank starts, a request the pipeline serving ``architecture`` would refuse once
    built (its ``check_request``; a pipeline without one is not checked here)."""
    check = getattr(pipeline_class(architecture), "check_request", None)
    if check is not None:
        check(checkpoint_dir, **request)
