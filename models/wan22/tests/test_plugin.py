"""The package describes its pipelines without importing torch, and every registry entry resolves."""

from __future__ import annotations

import importlib
import subprocess
import sys
from importlib.metadata import entry_points

import trnmodels.wan22 as wan22


def test_import_is_cheap():
    code = "import sys, trnmodels.wan22; print(any(m in sys.modules for m in ('torch', 'diffusers')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_info_lists_the_plugin_with_its_distributions_version(capsys):
    import json
    from importlib.metadata import version

    from trnmodels.core.cli import main

    assert main(["info", "--json"]) == 0
    listed = {p["name"]: p for p in json.loads(capsys.readouterr().out)["plugins"]}
    assert listed["wan22"] == {
        "name": "wan22",
        "version": version("trnmodels-wan22"),
        "distribution": "trnmodels-wan22",
        "architectures": sorted(wan22.PIPELINE_REGISTRY),
        "kind": "diffusion",
    }
    assert listed["llama3"]["kind"] == "llm"


def test_registry_entries_resolve_to_engine_classes_of_the_pipelines():
    from trnmodels.wan22.omni import Wan22I2VOmniPipeline, Wan22OmniPipeline
    from trnmodels.wan22.pipeline_i2v import Wan22ImageToVideoPipeline
    from trnmodels.wan22.pipeline_t2v import Wan22Pipeline

    expected = {
        "WanPipeline": (Wan22OmniPipeline, Wan22Pipeline),
        "Wan22Pipeline": (Wan22OmniPipeline, Wan22Pipeline),
        "WanImageToVideoPipeline": (Wan22I2VOmniPipeline, Wan22ImageToVideoPipeline),
        "Wan22I2VPipeline": (Wan22I2VOmniPipeline, Wan22ImageToVideoPipeline),
    }
    assert set(wan22.PIPELINE_REGISTRY) == set(expected)
    for arch, target in wan22.PIPELINE_REGISTRY.items():
        module, _, name = target.partition(":")
        engine_class = getattr(importlib.import_module(module), name)
        assert (engine_class, engine_class.pipeline_class) == expected[arch]
        # vLLM-Omni looks its pre/post-process hooks up by these names in the registered module.
        assert callable(module_attr(module, "get_pre_process_func"))
        assert callable(module_attr(module, "get_post_process_func"))


def module_attr(module: str, name: str):
    return getattr(importlib.import_module(module), name)


def test_entry_point_names_the_registry():
    (ep,) = [e for e in entry_points(group="trnmodels.diffusion") if e.name == "wan22"]
    assert ep.load() is wan22.PIPELINE_REGISTRY
