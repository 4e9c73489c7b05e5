"""The vLLM-Omni registration: every installed diffusion plugin's pipelines, under their architecture keys.

Core declares one ``vllm_omni.general_plugins`` entry point (``trnmodels = trnmodels.core.omni:register``,
implemented here). vLLM-Omni runs it in every process it starts (engine, workers) before resolving a
stage's ``model_class_name``; ``register`` then walks the ``trnmodels.diffusion`` entry points (each plugin's
``PIPELINE_REGISTRY``) and calls vLLM-Omni's ``register_diffusion_model(arch, module, class, ...)`` for
every entry. A key vLLM-Omni already serves (``WanPipeline``) is overridden by ours, pre/post-process
functions included: vLLM-Omni looks them up by name in the registered class's module, which provides
``get_pre_process_func`` and ``get_post_process_func`` (``omni.engine``'s, re-exported).
Registering twice is harmless (the same entries are written again).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .registry import discover_pipelines

# Looked up by vLLM-Omni in the module of every class registered here (see omni.engine).
PRE_PROCESS_FUNC = "get_pre_process_func"
POST_PROCESS_FUNC = "get_post_process_func"


def register_pipelines(register_diffusion_model: Callable[..., Any]) -> list[str]:
    """Register every installed pipeline with ``register_diffusion_model``; returns the architectures."""
    registered = []
    for arch, (_plugin, target) in sorted(discover_pipelines().items()):
        module, _, cls = target.partition(":")
        register_diffusion_model(
            arch,
            module,
            cls,
            pre_process_func_name=PRE_PROCESS_FUNC,
            post_process_func_name=POST_PROCESS_FUNC,
        )
        registered.append(arch)
    return registered


def register() -> None:
    """The ``vllm_omni.general_plugins`` hook."""
    from vllm_omni.diffusion.registry import register_diffusion_model

    register_pipelines(register_diffusion_model)
