"""The vLLM-Omni hook registers every installed diffusion pipeline under its architecture key.

Here against a recorder with vLLM-Omni's signature; `nox -s integration-omni` runs the same hook through
vLLM-Omni's own plugin loader and registry in a separate environment."""

from __future__ import annotations

import importlib
import inspect
from importlib import metadata

from trnmodels.core.omni.registration import register_pipelines
from trnmodels.core.omni.registry import discover_pipelines, pipeline_class


def test_entry_point_is_declared():
    eps = metadata.entry_points(group="vllm_omni.general_plugins")
    assert [ep.value for ep in eps if ep.name == "trnmodels"] == ["trnmodels.core.omni:register"]
    assert inspect.signature(importlib.import_module("trnmodels.core.omni").register).parameters == {}


def test_every_registry_entry_is_registered():
    calls = []

    def register_diffusion_model(
        model_arch, module_name, class_name, pre_process_func_name=None, post_process_func_name=None
    ):
        calls.append((model_arch, module_name, class_name))
        assert (pre_process_func_name, post_process_func_name) == (
            "get_pre_process_func",
            "get_post_process_func",
        )

    archs = register_pipelines(register_diffusion_model)
    wan22 = importlib.import_module("trnmodels.wan22").PIPELINE_REGISTRY
    expected = sorted((arch, *target.split(":")) for arch, target in wan22.items())
    assert sorted(c for c in calls if c[0] in wan22) == expected
    assert {"Wan22Pipeline", "WanPipeline", "WanImageToVideoPipeline"} <= set(archs)


def test_local_runners_get_the_pipeline_of_the_registered_engine_class():
    assert discover_pipelines()["Wan22Pipeline"] == ("wan22", "trnmodels.wan22.omni:Wan22OmniPipeline")
    assert pipeline_class("WanPipeline").__name__ == "Wan22Pipeline"
