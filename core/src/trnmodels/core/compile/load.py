"""Load the compiled graphs that are in the cache, binding this rank's weights to each by name."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from ..runner.graphs import GraphSpec, all_graph_specs
from .cache import ARTIFACT, ArtifactCache, CorruptArtifactWarning
from .driver import CompileTarget, graph_keys


def _named_tensors(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    # Every alias of a shared tensor (a tied LM head is the embedding's table): a graph may name either.
    return dict(module.named_parameters(remove_duplicate=False)) | dict(
        module.named_buffers(remove_duplicate=False)
    )


def _constants(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    # The step modules hold the model as ``self.model``: the exported constants carry that prefix.
    named = _named_tensors(model)
    return {f"model.{name}": t for name, t in named.items()}


def load_compiled_module(path: str | Path, module: torch.nn.Module) -> Callable[..., Any]:
    """A package compiled from ``module`` itself, with ``module``'s weights bound by name (shared, not
    copied). Raises if the package cannot load or names a weight ``module`` lacks."""
    loader = torch._inductor.aoti_load_package(str(path))
    named = _named_tensors(module)
    wanted = set(loader.get_constant_fqns())
    loader.load_constants(
        {k: v for k, v in named.items() if k in wanted}, check_full_update=True, user_managed=True
    )
    return loader


def load_compiled_graphs(
    target: CompileTarget, model: torch.nn.Module, cache_dir: str | None = None
) -> dict[GraphSpec, Callable[..., torch.Tensor]]:
    """The graphs of ``target`` found in the cache; missing ones are left to run eagerly.

    Weights are shared with ``model`` (``user_managed``), not copied, so every graph sees one copy.
    """
    cache = ArtifactCache(cache_dir)
    constants = _constants(model)
    graphs: dict[GraphSpec, Callable[..., torch.Tensor]] = {}
    for spec, (key, fields) in graph_keys(target, all_graph_specs(target.runner)).items():
        path = cache.lookup(key, {"key": key, **fields})  # never another key's artifact
        if path is None:
            continue
        try:
            loader = torch._inductor.aoti_load_package(str(path))
            wanted = set(loader.get_constant_fqns())
            loader.load_constants(
                {k: v for k, v in constants.items() if k in wanted}, check_full_update=True, user_managed=True
            )
        except Exception as e:  # a package that passed its checksum but cannot load is corrupt too
            with cache.lock(key):
                cache.discard(key, f"cannot load {ARTIFACT}: {e}")
            warnings.warn(
                f"{spec.name} runs eagerly until it is compiled again", CorruptArtifactWarning, stacklevel=2
            )
            continue
        graphs[spec] = loader
    return graphs
