"""The compile driver: every (phase, bucket) graph captured whole and compiled ahead of time.

On CPU each graph becomes an AOTInductor ``.pt2`` package with the weights left out
(``package_constants_in_so=False``): at load time the rank's own weights are bound by name, so one
artifact serves every rank and every checkpoint of the same config. Capture is ``torch.export`` in
strict mode (TorchDynamo with ``fullgraph`` semantics): a graph break is a ``CompileError`` that names
the offending source line. Compiling needs no weights and no peers: the model is built from its config,
and TP graphs are traced on a fake process group of the right size.
"""

from __future__ import annotations

import dataclasses
import importlib
import re
import time
import warnings
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from .. import neuron
from ..causal_lm import check_model_config
from ..cpu.linear import sgemm_tuned
from ..errors import TrnModelsError
from ..hf_config import load_hf_config
from ..ops.dispatch import cpu_kernels_in_graphs
from ..parallel.state import ParallelLayout, destroy_parallel_state, init_parallel_state
from ..plugins import plugin_for_architecture
from ..runner.config import RunnerConfig
from ..runner.graphs import (
    DECODE,
    DecodeStep,
    GraphSpec,
    PrefillStep,
    all_graph_specs,
    example_inputs,
    flat_caches,
)
from ..runtime_config import NeuronConfig
from .cache import ArtifactCache
from .key import cache_key, source_digest
from .manifest import Keys, manifest_digest, plugin_package, record_keys, recorded_keys
from .schedule import share_queue

COMPILER_FLAGS: dict[str, Any] = {
    "aot_inductor.package_constants_in_so": False,
    # Inductor otherwise inlines small weights (0-dim or a few elements, e.g. Gemma 4's per-layer
    # `layer_scalar`) into the code with the tracing model's values; every weight must stay a constant
    # bound at load time, or one artifact could not serve every checkpoint.
    "always_keep_tensor_constants": True,
}


class CompileError(TrnModelsError):
    """A graph could not be captured whole, or the compiler failed on it."""


@dataclass(frozen=True)
class CompileTarget:
    """What to compile: a checkpoint's model at a TP (and EP) degree and dtype, shaped by a runner config."""

    checkpoint_dir: str
    runner: RunnerConfig
    tp: int = 1
    dtype: str = "float32"
    ep: int = 1

    @property
    def layout(self) -> ParallelLayout:
        return ParallelLayout(tp=self.tp, ep=self.ep)

    def neuron_config(self) -> NeuronConfig:
        return NeuronConfig(
            tp_degree=self.tp,
            ep_degree=self.ep,
            dtype=self.dtype,
            block_size=self.runner.block_size,
            max_model_len=self.runner.max_model_len,
        )

    def runtime_fields(self) -> dict[str, Any]:
        return {"tp": self.tp, "ep": self.ep, "dtype": self.dtype, **dataclasses.asdict(self.runner)}


@dataclass(frozen=True)
class GraphResult:
    name: str
    phase: str
    bucket: list[int]
    seconds: float
    cache: str  # "hit" or "miss"
    path: str


def _shared_key_fields(target: CompileTarget, package: str) -> dict[str, Any]:
    """The key fields every graph of ``target`` shares; ``package`` is its plugin's import name."""
    source = source_digest(importlib.import_module("trnmodels.core"), importlib.import_module(package))
    # The CPU kernels a capture takes change the graph, and the environment picks them
    # (TRNMODELS_CPU_KERNELS, TRNMODELS_KERNEL_BACKEND): a bisecting run must not reuse the others' graphs.
    # So does whether MKL's SGEMM is tuned for this CPU (an Intel CPU's graphs swap no operands).
    # And whether linear layers call core's GEMM on packed weights (BF16, FP32), and decode graphs core's
    # attention kernel (whether core's C++ library builds and runs on this CPU decides).
    from ..cpu.attention import graphs_run_core_attention
    from ..cpu.packed_layers import graphs_run_core_gemm  # it imports this package's cache

    flags = dict(
        COMPILER_FLAGS,
        cpu_kernels_in_graphs=cpu_kernels_in_graphs(),
        sgemm_tuned=sgemm_tuned(),
        core_packed_gemm=graphs_run_core_gemm(target.dtype),
        core_decode_attention=graphs_run_core_attention(),
    )
    return {"dtype": target.dtype, "compiler_flags": flags, "source": source}


def graph_keys(target: CompileTarget, specs: Iterable[GraphSpec], hf_config: Any = None) -> Keys:
    """Cache keys of ``specs``, reading the checkpoint's config (unless given) and hashing the source once."""
    # The full config as transformers reads it, so a bundled config.json and a saved checkpoint of the
    # same model (which spells out every default) share their artifacts.
    config = (hf_config or load_hf_config(target.checkpoint_dir)).to_dict()
    plugin = plugin_for_architecture((config.get("architectures") or ["?"])[0])
    shared = _shared_key_fields(target, plugin.package)
    return {
        spec: cache_key(
            model_config=config,
            runtime_config=target.runtime_fields(),
            graph=spec.phase,
            bucket=spec.bucket,
            **shared,
        )
        for spec in specs
    }


def graph_key(target: CompileTarget, spec: GraphSpec) -> tuple[str, dict[str, Any]]:
    return graph_keys(target, [spec])[spec]


def _model_factory(target: CompileTarget) -> tuple[Any, Callable[..., torch.nn.Module]]:
    """The checkpoint's config and its plugin's model factory (importing the model's code)."""
    hf_config = load_hf_config(target.checkpoint_dir)
    return hf_config, plugin_for_architecture(hf_config.architectures[0]).load_factory()


def build_model_for_tracing(target: CompileTarget) -> torch.nn.Module:
    """The model with uninitialised weights: shapes and code are all a capture needs."""
    hf_config, factory = _model_factory(target)
    return factory(hf_config, target.neuron_config())


def _user_frames(error: BaseException) -> str:
    frames = re.findall(r'File "([^"]+)", line (\d+), in (\S+)', str(error))
    mine = [f"{path}:{line} in {fn}" for path, line, fn in frames if "/torch/" not in path]
    return "; ".join(mine[-3:]) or "(no source line reported)"


_SIDE_EFFECT_SOURCE = re.compile(r"L\['self'\]((?:\._modules\['[^']+'\])+)")
_TREESPEC_DEPRECATION = "`isinstance(treespec, LeafSpec)` is deprecated"


def _expected_warning(message: Warning, step: torch.nn.Module) -> bool:
    """A warning capture always raises for a correct step: each is named here with why it is harmless.

    - Export's "side effects" warning, when every source it names is a ``PagedAttention``: a step binds
      the caches it is passed to its attention layers, and binding them is what the graph is for. A side
      effect anywhere else (a module that stores state in ``forward``) is still shown.
    - torch's own pytree deprecation, raised inside torch when it copies a spec, not by our code.
    """
    from ..attention import PagedAttention

    text = str(message)
    if isinstance(message, FutureWarning):
        return _TREESPEC_DEPRECATION in text
    if not (isinstance(message, UserWarning) and "side effects happened" in text):
        return False
    sources = _SIDE_EFFECT_SOURCE.findall(text)
    if not sources:
        return False
    for path in sources:
        names = re.findall(r"\['([^']+)'\]", path)
        # Export wraps the step in a module whose ``_export_root`` is the step.
        target = ".".join(names[1:] if names[:1] == ["_export_root"] else names)
        try:
            module = step.get_submodule(target)
        except AttributeError:
            return False
        if not isinstance(module, PagedAttention):
            return False
    return True


@contextmanager
def _expected_warnings_hidden(step: torch.nn.Module) -> Iterator[None]:
    """Show every warning raised inside except the expected ones (``_expected_warning``)."""
    caught: list[warnings.WarningMessage] = []
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            yield
    finally:
        # Outside the recording context, so they reach the caller's filters (also when capture failed).
        for w in caught:
            if not _expected_warning(w.message, step):
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno, source=w.source)


def capture(step: torch.nn.Module, args: tuple[torch.Tensor, ...], name: str) -> torch.export.ExportedProgram:
    try:
        with _expected_warnings_hidden(step):
            return torch.export.export(step, args, strict=True)
    except Exception as e:
        first_line = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CompileError(
            f"{name}: the graph cannot be captured whole at {_user_frames(e)}: {first_line}"
        ) from e


def _step_for(model: torch.nn.Module, spec: GraphSpec) -> torch.nn.Module:
    return DecodeStep(model) if spec.phase == DECODE else PrefillStep(model)


class _TracingGroup:
    """A fake process group of the target's mesh, so TP/EP collectives trace without peers."""

    def __init__(self, layout: ParallelLayout):
        self.layout = layout

    def __enter__(self) -> None:
        world = self.layout.world_size
        if world > 1:
            from torch.testing._internal.distributed.fake_pg import FakeStore

            dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)
        init_parallel_state(self.layout.tp, ep_degree=self.layout.ep)

    def __exit__(self, *exc: object) -> None:
        destroy_parallel_state()
        if self.layout.world_size > 1:
            dist.destroy_process_group()


def _compile_to(target: CompileTarget, spec: GraphSpec, path: Path) -> None:
    from ..cpu.packed_layers import graphs_run_core_gemm, pack_for_graphs

    with _TracingGroup(target.layout), torch.no_grad():
        model = build_model_for_tracing(target)
        if graphs_run_core_gemm(target.dtype):
            pack_for_graphs(model, probe=False)  # as binding packs the loaded model (compile.load)
        step = _step_for(model, spec)
        args = example_inputs(
            spec, target.runner, model.vocab_size, flat_caches(step.kv_spec, target.runner.num_blocks)
        )
        compile_module(step, args, path, spec.name)


def compile_module(step: torch.nn.Module, args: tuple[torch.Tensor, ...], path: Path, name: str) -> None:
    """Capture ``step`` whole on ``args`` and compile it into ``path``, weights left out of the artifact.

    Shared by the bucket graphs here and the per-component graphs of diffusion pipelines."""
    if neuron.sdk_available():
        from .neuron import compile_for_neuron

        compile_for_neuron(step, args, path)
        return
    program = capture(step, args, name)
    try:
        # A copy: AOTInductor adds its own entries to the dict it is given, which would change keys.
        flags = dict(COMPILER_FLAGS)
        with _expected_warnings_hidden(step):
            torch._inductor.aoti_compile_and_package(program, package_path=str(path), inductor_configs=flags)
    except Exception as e:
        raise CompileError(f"{name}: AOTInductor failed: {e}") from e


def compile_graph(
    target: CompileTarget,
    spec: GraphSpec,
    cache_dir: str | None = None,
    keyed: tuple[str, dict[str, Any]] | None = None,
) -> GraphResult:
    """Compile one graph into the cache (or find it there). ``keyed`` passes a key computed by the
    caller, so workers file their artifacts under exactly the key the caller will look up."""
    cache = ArtifactCache(cache_dir)
    key, fields = keyed or graph_key(target, spec)
    start = time.perf_counter()
    path, hit = cache.get_or_build(key, lambda p: _compile_to(target, spec, p), {"key": key, **fields})
    return GraphResult(
        spec.name,
        spec.phase,
        list(spec.bucket),
        time.perf_counter() - start,
        "hit" if hit else "miss",
        str(path),
    )


def compile_all(
    target: CompileTarget,
    cache_dir: str | None = None,
    *,
    jobs: int = 1,
    specs: Iterable[GraphSpec] | None = None,
    on_result: Callable[[GraphResult], None] | None = None,
) -> list[GraphResult]:
    """Compile every graph of the target, up to ``jobs`` at a time (this process and ``jobs - 1`` workers).

    Cache hits are answered here without starting a worker; results come back in ``specs`` order. When
    the manifest of an earlier compile of the same inputs finds every graph in the cache, nothing else
    runs (see ``manifest``); otherwise the model's config is checked first, so a mesh or config the
    model refuses fails here, not in every compile worker. The workers start before that check, and
    get ready (``_get_ready``) while this process makes it.
    """
    specs = list(specs or all_graph_specs(target.runner))
    cache = ArtifactCache(cache_dir)
    package = plugin_package(target.checkpoint_dir)
    digest = package and manifest_digest(
        target.checkpoint_dir, target.runtime_fields(), specs, _shared_key_fields(target, package)
    )
    recorded = recorded_keys(cache, digest, specs) if digest else None
    results = _hits(cache, recorded or {})

    def deliver(spec: GraphSpec, result: GraphResult) -> None:
        results[spec] = result
        if on_result:
            on_result(result)

    if recorded is not None and len(results) == len(specs):
        if on_result:
            for result in results.values():
                on_result(result)
        return [results[spec] for spec in specs]
    # At most the graphs the manifest did not find, less the one this process compiles.
    with _workers(target, min(jobs, len(specs) - len(results)) - 1) as pool:
        keys = graph_keys(target, specs, check_model_config(target.checkpoint_dir, target.neuron_config()))
        results = {}
        for spec, result in _hits(cache, keys).items():
            deliver(spec, result)
        misses = {spec: keyed for spec, keyed in keys.items() if spec not in results}
        _compile_misses(target, cache_dir, misses, pool, deliver)
    if digest:
        record_keys(cache, digest, keys)
    return [results[spec] for spec in specs]


@dataclass(frozen=True)
class _Pool:
    executor: ProcessPoolExecutor
    workers: int


@contextmanager
def _workers(target: CompileTarget, workers: int) -> Iterator[_Pool | None]:
    """``workers`` compile processes (none if fewer than one), each told to get ready at once."""
    if workers < 1:
        yield None
        return
    with ProcessPoolExecutor(max_workers=workers, mp_context=get_context("spawn")) as executor:
        # A task is what starts a process; one each, so every worker gets ready side by side.
        for _ in range(workers):
            executor.submit(_get_ready, target)
        yield _Pool(executor, workers)


def _get_ready(target: CompileTarget) -> None:
    """What a fresh process does before its first graph, done while the compile's own process reads the
    model's config: import the compile stack and the plugin's model, and have the C++ compiler probe the
    CPU's vector instructions (Inductor's probe compiles about ten test programs, about 8 s, and keeps
    the answers in its cache, where the compile's own process then finds them)."""
    from torch._inductor import compile_fx, cpu_vec_isa  # noqa: F401  (the compile stack's imports)

    _model_factory(target)
    if not neuron.sdk_available():
        cpu_vec_isa.pick_vec_isa()


def _compile_misses(
    target: CompileTarget,
    cache_dir: str | None,
    misses: Keys,
    pool: _Pool | None,
    deliver: Callable[[GraphSpec, GraphResult], None],
) -> None:
    """Compile ``misses`` in order: this process and the workers of ``pool`` sharing one queue
    (``share_queue``).

    This process compiles too, and takes the first graph (a prefill graph, the largest) while the
    workers get ready: with graphs as the unit of work (a handful per config), a worker's start is
    on the critical path, and a queue shared by the compilers puts no graph behind a slow one.
    """

    def here(item: tuple[GraphSpec, tuple[str, dict[str, Any]]]) -> GraphResult:
        return compile_graph(target, item[0], cache_dir, item[1])

    def delivered(item: tuple[GraphSpec, tuple[str, dict[str, Any]]], result: GraphResult) -> None:
        deliver(item[0], result)

    def in_worker(item: tuple[GraphSpec, tuple[str, dict[str, Any]]]) -> GraphResult:
        assert pool is not None
        return pool.executor.submit(compile_graph, target, item[0], cache_dir, item[1]).result()

    workers = min(pool.workers if pool else 0, len(misses) - 1)
    share_queue(misses.items(), [here, *[in_worker] * max(workers, 0)], delivered)


def _hits(cache: ArtifactCache, keys: Keys) -> dict[GraphSpec, GraphResult]:
    """The graphs of ``keys`` already in the cache."""
    hits = {}
    for spec, (key, fields) in keys.items():
        start = time.perf_counter()
        if (path := cache.lookup(key, {"key": key, **fields})) is not None:
            seconds = time.perf_counter() - start
            hits[spec] = GraphResult(spec.name, spec.phase, list(spec.bucket), seconds, "hit", str(path))
    return hits
