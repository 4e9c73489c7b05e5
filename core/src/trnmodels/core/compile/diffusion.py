"""Per-component compile for diffusion pipelines: one graph set per component, each under its own name.

A video pipeline is not one model but several (text encoder, one or two DiT experts, the VAE decoder and,
for image conditioning, the VAE encoder), each run with its own fixed shapes. Each component graph is
captured whole and compiled by the same driver and artifact cache as the LLM bucket graphs
(:func:`trnmodels.core.compile.driver.compile_module`, :class:`~trnmodels.core.compile.ArtifactCache`);
its cache key carries the component's ``model_name`` (``wan22_transformer``, ``wan22_vae_decoder``...),
its config, the input signature, the mesh and a digest of the source of core and the plugin.

A ``ComponentGraph`` is a description plus a ``build`` callable: the key is computed without building
anything, so a cache hit costs a hash and a checksum; only a miss builds the module (with uninitialised
weights, on a fake process group of the component's mesh) and compiles it.
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from ..parallel.state import ParallelLayout, destroy_parallel_state, init_parallel_state
from .cache import ArtifactCache
from .driver import COMPILER_FLAGS, compile_module
from .key import cache_key, source_digest
from .load import load_compiled_module

Builder = Callable[[], tuple[torch.nn.Module, tuple[torch.Tensor, ...]]]


@dataclass(frozen=True)
class ComponentGraph:
    """One graph of one pipeline component.

    ``inputs`` is the signature the graph is compiled for (``[(shape, dtype), ...]`` of the tensors it is
    called with); ``build()`` returns the module to capture and example inputs of that signature.
    """

    model_name: str
    graph: str
    package: str  # the plugin package whose source the graph runs, e.g. "trnmodels.wan22"
    model_config: dict[str, Any]
    inputs: tuple[tuple[tuple[int, ...], str], ...]
    dtype: str
    build: Builder = field(compare=False, repr=False)
    layout: ParallelLayout = field(default_factory=ParallelLayout)
    runtime_config: dict[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return f"{self.model_name}/{self.graph}"

    def key(self) -> tuple[str, dict[str, Any]]:
        source = source_digest(
            importlib.import_module("trnmodels.core"), importlib.import_module(self.package)
        )
        return cache_key(
            model_config=self.model_config,
            runtime_config={
                "model_name": self.model_name,
                "inputs": [[list(shape), dtype] for shape, dtype in self.inputs],
                "layout": [self.layout.tp, self.layout.ep, self.layout.cp, self.layout.cfg],
                **self.runtime_config,
            },
            graph=self.name,
            bucket=self.inputs[0][0] if self.inputs else (),
            dtype=self.dtype,
            compiler_flags=dict(COMPILER_FLAGS),
            source=source,
        )


def signature(tensors: Sequence[torch.Tensor]) -> tuple[tuple[tuple[int, ...], str], ...]:
    return tuple((tuple(t.shape), str(t.dtype).removeprefix("torch.")) for t in tensors)


@dataclass(frozen=True)
class ComponentResult:
    name: str
    inputs: list[list[int]]
    seconds: float
    cache: str  # "hit" or "miss"
    path: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "inputs": self.inputs,
            "seconds": round(self.seconds, 3),
            "cache": self.cache,
        }


class TracingMesh:
    """A fake process group of a component's mesh, so its collectives trace without peers.

    Entered only when no real process group exists (a compile session); inside a running pipeline the
    component is traced in the live mesh it was built in."""

    def __init__(self, layout: ParallelLayout):
        self.layout = layout
        self._owned = False

    def __enter__(self) -> None:
        if self.layout.world_size > 1 and not dist.is_initialized():
            from torch.testing._internal.distributed.fake_pg import FakeStore

            dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=self.layout.world_size)
            init_parallel_state(
                self.layout.tp, ep_degree=self.layout.ep, cp_degree=self.layout.cp, cfg_degree=self.layout.cfg
            )
            self._owned = True

    def __exit__(self, *exc: object) -> None:
        if self._owned:
            destroy_parallel_state()
            dist.destroy_process_group()


def compile_component_graph(graph: ComponentGraph, cache: ArtifactCache) -> ComponentResult:
    """Compile ``graph`` into the cache, or find it there."""
    key, fields = graph.key()
    start = time.perf_counter()

    def build(path: Path) -> None:
        with TracingMesh(graph.layout), torch.no_grad():
            module, args = graph.build()
            compile_module(module.eval(), args, path, graph.name)

    path, hit = cache.get_or_build(key, build, {"key": key, **fields})
    return ComponentResult(
        graph.name,
        [list(shape) for shape, _ in graph.inputs],
        time.perf_counter() - start,
        "hit" if hit else "miss",
        str(path),
    )


def compile_components(
    graphs: Iterable[ComponentGraph],
    cache_dir: str | Path | None = None,
    on_result: Callable[[ComponentResult], None] | None = None,
) -> list[ComponentResult]:
    """Compile every graph in order (components are few and large: one at a time bounds host memory)."""
    cache = ArtifactCache(cache_dir)
    results = []
    for graph in graphs:
        results.append(compile_component_graph(graph, cache))
        if on_result:
            on_result(results[-1])
    return results


def load_component_graph(
    graph: ComponentGraph, module: torch.nn.Module, cache_dir: str | Path | None = None
) -> Callable[..., Any] | None:
    """The compiled graph bound to ``module``'s weights, or None if it is not in the cache."""
    cache = ArtifactCache(cache_dir)
    key, fields = graph.key()
    path = cache.lookup(key, {"key": key, **fields})  # never another key's artifact
    return None if path is None else load_compiled_module(path, module)


def format_table(results: Sequence[ComponentResult], cache_dir: str | Path | None = None) -> str:
    """The human-readable compile report: one line per graph, then the totals."""
    width = max([len(r.name) for r in results] + [5])
    lines = [f"  {'graph':<{width}}  {'cache':<5}  {'seconds':>8}  inputs"]
    for r in results:
        shapes = " ".join("x".join(map(str, s)) for s in r.inputs[:1])
        lines.append(f"  {r.name:<{width}}  {r.cache:<5}  {r.seconds:8.2f}  {shapes}")
    hits = sum(r.cache == "hit" for r in results)
    where = f", cache at {ArtifactCache(cache_dir).root}" if results else ""
    lines.append(f"{len(results)} graphs, {hits} cache hits, {sum(r.seconds for r in results):.1f} s{where}")
    return "\n".join(lines)
