"""Load the compiled graphs that are in the cache, binding this rank's weights to each by name."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from ..cpu.packed import released
from ..errors import InputError
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
    _check_not_released(named)
    return {f"model.{name}": t for name, t in named.items()}


def _check_not_released(named: dict[str, torch.Tensor]) -> None:
    """A graph reads a weight's own memory, which an eager-only model gives back (``cpu.packed_layers``)."""
    for name, t in named.items():
        if released(t):
            raise InputError(
                f"{name}: this model's weight was packed for eager runs and released "
                "(cpu.packed_layers.pack_for_eager); compiled graphs need a model built again"
            )


def load_compiled_module(path: str | Path, module: torch.nn.Module) -> Callable[..., Any]:
    """A package compiled from ``module`` itself, with ``module``'s weights bound by name (shared, not
    copied). Raises if the package cannot load or names a weight ``module`` lacks."""
    loader = torch._inductor.aoti_load_package(str(path))
    named = _named_tensors(module)
    _check_not_released(named)
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


def runner_graphs(
    target: CompileTarget, model: torch.nn.Module, cache_dir: str | None = None, *, eager: bool = False
) -> dict[GraphSpec, Callable[..., torch.Tensor]]:
    """The graphs a runner of ``model`` takes: those cached for ``target`` (``load_compiled_graphs``), or
    with ``eager`` none. With none (``eager``, or nothing compiled yet) ``model``'s BF16 linear layers are
    packed for core's BF16 GEMM instead (``cpu.packed_layers.pack_for_eager``: no graph reads their
    released weights); with some, every step that has no graph runs ``F.linear`` on the weights they read."""
    graphs = {} if eager else load_compiled_graphs(target, model, cache_dir)
    if not graphs:
        from ..cpu.packed_layers import pack_for_eager

        pack_for_eager(model)
    return graphs
