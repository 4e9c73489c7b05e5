"""The vLLM-Omni registration: every installed diffusion plugin's pipelines, under their architecture keys.

Core declares one ``vllm_omni.general_plugins`` entry point (``trnmodels = trnmodels.core.omni:register``).
vLLM-Omni runs it in every process it starts (engine, workers) before resolving a stage's
``model_class_name``; ``register`` then walks the ``trnmodels.diffusion`` entry points (each plugin's
``PIPELINE_REGISTRY``) and calls vLLM-Omni's ``register_diffusion_model(arch, module, class)`` for every
entry. A key vLLM-Omni already serves (``WanPipeline``) is overridden by ours; pre/post-process function
names are left as vLLM-Omni has them. Registering twice is harmless (the same entries are written again).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .diffusion.registry import discover_pipelines


def register_pipelines(register_diffusion_model: Callable[..., Any]) -> list[str]:
    """Register every installed pipeline with ``register_diffusion_model``; returns the architectures."""
    registered = []
    for arch, (_plugin, target) in sorted(discover_pipelines().items()):
        module, _, cls = target.partition(":")
        register_diffusion_model(arch, module, cls)
        registered.append(arch)
    return registered


def register() -> None:
    """The ``vllm_omni.general_plugins`` hook."""
    from vllm_omni.diffusion.registry import register_diffusion_model

    register_pipelines(register_diffusion_model)
