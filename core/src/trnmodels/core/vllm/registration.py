"""The ``vllm.general_plugins`` hook: register installed trnmodels LLM plugins with vLLM's model registry.

A plugin distribution opts in by declaring, in its ``pyproject.toml``::

    [project.entry-points."vllm.general_plugins"]
    trnmodels_<name> = "trnmodels.core.vllm.registration:register"

vLLM calls ``register`` in every process it starts (API server, engine core, workers). Only the
distributions that declare that entry point are registered, so a diffusion plugin is never offered to
vLLM's LLM registry. ``TRNMODELS_VLLM_DISABLE=llama3,gpt_oss`` (or ``all``) leaves the named plugins
unregistered, so vLLM's own implementation of the same architecture serves instead.

Registration is cheap: it reads entry points and the plugins' ``ModelPlugin`` records (no torch) and
registers ``"module:Class"`` strings; vLLM imports the bridge only when it builds a model.
"""

from __future__ import annotations

import logging
import os
import re
from importlib import metadata

from ..errors import ConfigError
from ..plugins import ModelPlugin, discover_plugins

VLLM_PLUGIN_GROUP = "vllm.general_plugins"
HOOK = f"{__name__}:register"
DISABLE_ENV = "TRNMODELS_VLLM_DISABLE"
BRIDGE_CLASS = "trnmodels.core.vllm.bridge:TrnmodelsForCausalLM"
NEURON_CLASS = "trnmodels.core.vllm.neuron:TrnmodelsNeuronCausalLM"

logger = logging.getLogger(__name__)


def _normalize(distribution: str) -> str:
    return re.sub(r"[-_.]+", "-", distribution).lower()


def disabled_plugins(plugins: dict[str, ModelPlugin], value: str | None = None) -> set[str]:
    """The plugin names ``TRNMODELS_VLLM_DISABLE`` turns off; an unknown name is an error, not ignored."""
    value = os.environ.get(DISABLE_ENV, "") if value is None else value
    names = {n.strip() for n in value.split(",") if n.strip()}
    if "all" in names:
        return set(plugins)
    unknown = sorted(names - set(plugins))
    if unknown:
        raise ConfigError(
            f"{DISABLE_ENV}={value!r}: unknown plugin name(s) {unknown}; "
            f"installed trnmodels plugins: {sorted(plugins) or 'none'} (or 'all')"
        )
    return names


def vllm_plugins() -> dict[str, ModelPlugin]:
    """The installed plugins whose distribution declares this hook in ``vllm.general_plugins`` (and, when
    vLLM's ``VLLM_PLUGINS`` allow-list is set, names it there: every plugin's hook registers them all)."""
    allowed = os.environ.get("VLLM_PLUGINS")
    allowed_names = None if allowed is None else {n.strip() for n in allowed.split(",") if n.strip()}
    opted_in = {
        _normalize(ep.dist.name)
        for ep in metadata.entry_points(group=VLLM_PLUGIN_GROUP)
        if ep.value.replace(" ", "") == HOOK
        and ep.dist is not None
        and (allowed_names is None or ep.name in allowed_names)
    }
    return {
        name: plugin
        for name, plugin in discover_plugins().items()
        if _normalize(plugin.distribution) in opted_in
    }


def registrations(on_neuron: bool = False) -> dict[str, str]:
    """``{architecture: "module:Class"}`` for every enabled plugin, as ``register`` would apply them."""
    plugins = vllm_plugins()
    disabled = disabled_plugins(plugins)
    target = NEURON_CLASS if on_neuron else BRIDGE_CLASS
    return {
        arch: target
        for name, plugin in plugins.items()
        if name not in disabled
        for arch in plugin.architectures
    }


def _on_neuron_platform() -> bool:
    from vllm.platforms import current_platform

    return current_platform.device_type == "neuron"


def register() -> None:
    """Entry point of the ``vllm.general_plugins`` group; safe to call more than once per process."""
    from vllm import ModelRegistry
    from vllm.model_executor.models.config import MODELS_CONFIG_MAP

    for arch, target in registrations(_on_neuron_platform()).items():
        ModelRegistry.register_model(arch, target)
        previous = MODELS_CONFIG_MAP.get(arch)
        if getattr(previous, "__name__", "") != "TrnmodelsConfigCheck":
            # Imported here: the hook module imports torch, which vLLM has loaded by now anyway.
            from .preflight import config_hook

            MODELS_CONFIG_MAP[arch] = config_hook(previous)
        logger.info("trnmodels: %s -> %s", arch, target)
