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


def _constants(target: CompileTarget, model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """``model``'s tensors under the names ``target``'s graphs give them, its BF16 linear layers packed
    first where the graphs call core's BF16 GEMM on packed weights (``cpu.packed_layers``)."""
    from ..cpu.packed_layers import graphs_run_core_gemm, pack_for_graphs  # it imports compile's cache

    if graphs_run_core_gemm(target.dtype):
        pack_for_graphs(model)
    # The step modules hold the model as ``self.model``: the exported constants carry that prefix.
    return {f"model.{name}": t for name, t in _named_tensors(model).items()}


def _bind(loader: Any, named: dict[str, torch.Tensor]) -> None:
    """Bind the tensors of ``named`` that the graph of ``loader`` reads, shared with the model, not copied.
    A weight released after packing (``cpu.packed_layers``) is refused: its own memory is gone."""
    from ..cpu.packed_layers import released_for_eager

    fqns = set(loader.get_constant_fqns())
    wanted = {k: v for k, v in named.items() if k in fqns}
    for name, t in wanted.items():
        if released(t):
            raise released_for_eager(name.removeprefix("model."))
    loader.load_constants(wanted, check_full_update=True, user_managed=True)


def load_compiled_module(path: str | Path, module: torch.nn.Module) -> Callable[..., Any]:
    """A package compiled from ``module`` itself, with ``module``'s weights bound by name (shared, not
    copied). Raises if the package cannot load or names a weight ``module`` lacks."""
    loader = torch._inductor.aoti_load_package(str(path))
    _bind(loader, _named_tensors(module))
    return loader


def load_compiled_graphs(
    target: CompileTarget, model: torch.nn.Module, cache_dir: str | None = None
) -> dict[GraphSpec, Callable[..., torch.Tensor]]:
    """The graphs of ``target`` found in the cache; missing ones are left to run eagerly.

    Weights are shared with ``model`` (``user_managed``), not copied, so every graph sees one copy. Where
    the graphs call core's BF16 GEMM, ``model``'s BF16 linear layers are packed for it first
    (``cpu.packed_layers.pack_for_graphs``), and the steps without a graph call it too.
    """
    cache = ArtifactCache(cache_dir)
    constants = _constants(target, model)
    graphs: dict[GraphSpec, Callable[..., torch.Tensor]] = {}
    for spec, (key, fields) in graph_keys(target, all_graph_specs(target.runner)).items():
        path = cache.lookup(key, {"key": key, **fields})  # never another key's artifact
        if path is None:
            continue
        try:
            loader = torch._inductor.aoti_load_package(str(path))
            _bind(loader, constants)
        except InputError:
            raise  # the model's, not the artifact's
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
    with ``eager`` none. Either way ``model``'s BF16 linear layers run core's BF16 GEMM where it can run:
    packed as the graphs read them (``cpu.packed_layers.pack_for_graphs``, which binding does), or, for an
    eager-only model, packed by ``pack_for_eager``, which leaves a layer the GEMM disagrees with to
    ``F.linear``."""
    graphs = {} if eager else load_compiled_graphs(target, model, cache_dir)
    if not graphs:
        from ..cpu.packed_layers import pack_for_eager

        pack_for_eager(model)
    return graphs
