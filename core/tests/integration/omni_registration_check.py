"""Run by ``nox -s integration-omni`` inside an environment where vLLM-Omni was installed by pip.

vLLM-Omni's own plugin loader runs every ``vllm_omni.general_plugins`` entry point (ours among them),
then this checks vLLM-Omni's diffusion registry: every architecture of every trnmodels diffusion plugin
resolves to our engine-facing class, with our pre/post-process function names, overriding vLLM-Omni's
built-in Wan pipeline. Nothing here imports the pipeline modules; ``models/wan22/tests/omni_engine_check.py``
(run next by the same session) runs them through vLLM-Omni's model runner.
"""

from __future__ import annotations

import sys
from importlib import metadata


def main() -> int:
    from vllm_omni.diffusion import registry
    from vllm_omni.plugins import load_omni_general_plugins

    from trnmodels.core.omni.registration import POST_PROCESS_FUNC, PRE_PROCESS_FUNC

    builtin = registry.DiffusionModelRegistry.models["WanPipeline"].module_name
    load_omni_general_plugins()
    checked = 0
    for ep in metadata.entry_points(group="trnmodels.diffusion"):
        for arch, target in ep.load().items():
            module, _, cls = target.partition(":")
            lazy = registry.DiffusionModelRegistry.models.get(arch)
            if lazy is None or (lazy.module_name, lazy.class_name) != (module, cls):
                print(f"FAIL {arch}: registered as {lazy!r}, expected {target}")
                return 1
            if registry._DIFFUSION_MODELS.get(arch) != (module, "", cls):
                print(f"FAIL {arch}: _DIFFUSION_MODELS has {registry._DIFFUSION_MODELS.get(arch)!r}")
                return 1
            hooks = (
                registry._DIFFUSION_PRE_PROCESS_FUNCS.get(arch),
                registry._DIFFUSION_POST_PROCESS_FUNCS.get(arch),
            )
            if hooks != (PRE_PROCESS_FUNC, POST_PROCESS_FUNC):
                print(f"FAIL {arch}: pre/post-process functions registered as {hooks}")
                return 1
            print(f"ok   {arch:<28} -> {target}")
            checked += 1
    if checked == 0:
        print("FAIL no trnmodels diffusion plugin is installed")
        return 1
    print(
        f"{checked} architectures registered with vllm-omni {metadata.version('vllm-omni')} "
        f"(WanPipeline was {builtin})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
