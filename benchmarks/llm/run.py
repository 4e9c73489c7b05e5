"""One benchmark run: every measurement of every workload, in order, into one JSON-ready dict.

The workloads: always ``bench``, random weights from the plugin's bundled ``bench`` config (about 100M
parameters, sharded). Then, for a plugin that has one, ``real``: a real trained checkpoint of the plugin's
architecture, built by ``trnmodels.core.real_weights`` (``trnmodels real-weights``) from a package on the
index. ``REAL_WEIGHTS`` says which plugin gets which: today llama3 gets SmolLM2-135M-Instruct, whose 30
narrow layers (hidden 576) put a different balance of per-op dispatch and weight bandwidth in a decode step
than the bench config's few wide ones. Every workload gets the same measurements, and the page puts its
rows in the same tables.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch

from ..machine import machine_info
from ..parallelism import tp_degree
from . import measure
from .measure import BENCH_RUNNER

# plugin -> the trnmodels.core.real_weights source of its real-weights workload. A source is a trained model
# of the plugin's architecture; a plugin without one is benchmarked on its bench config alone.
REAL_WEIGHTS = {"llama3": "SmolLM2-135M-Instruct"}
WORKLOADS = ("bench", "real")


@dataclass(frozen=True)
class Settings:
    load_repeats: int = 5  # fresh processes per weight-loading measurement (median)
    repeats: int = 5  # timed repetitions per throughput figure (median)
    new_tokens: int = 65  # generated per decode measurement: 1 from the prefill, then 64 decode steps
    prefill_len: int = BENCH_RUNNER.max_model_len
    decode_prompt_len: int = 32
    batch: int = BENCH_RUNNER.max_num_seqs
    jobs: int = 2  # compile workers
    jobs_compared: int = 1  # the bench config is also compiled cold with this many workers, for the speed-up
    cli_repeats: int = 3  # timed runs per CLI start-up figure (median)
    bandwidth_bytes: int = 1 << 30


QUICK = Settings(load_repeats=1, repeats=1, new_tokens=9, cli_repeats=1)


class _Log:
    def __init__(self) -> None:
        self.start = time.perf_counter()

    def __call__(self, message: str) -> None:
        print(f"[bench {time.perf_counter() - self.start:6.1f}s] {message}", file=sys.stderr, flush=True)


def workloads(model: str) -> tuple[str, ...]:
    """The workloads ``model`` has: ``bench``, and ``real`` if ``REAL_WEIGHTS`` names a source for it."""
    return WORKLOADS if model in REAL_WEIGHTS else ("bench",)


def _prompts(checkpoint: dict[str, Any], settings: Settings) -> tuple[Any, ...]:
    """The same prompts for every system: one long prefill prompt; decode at batch 1 and at ``batch``
    (ragged lengths, so HF's batch is left-padded)."""
    vocab = checkpoint["vocab_size"]
    prefill = measure.random_prompts([settings.prefill_len], vocab, seed=1)[0]
    lengths = [settings.decode_prompt_len - 2 * i for i in range(settings.batch)]
    batches = {
        "decode_b1": measure.random_prompts(lengths[:1], vocab, seed=2),
        f"decode_b{settings.batch}": measure.random_prompts(lengths, vocab, seed=3),
    }
    return prefill, batches, settings.new_tokens, settings.repeats


def eager_and_bound_models(
    build: Callable[[], torch.nn.Module], bind: Callable[[torch.nn.Module], dict[Any, Any]]
) -> tuple[torch.nn.Module, torch.nn.Module, dict[Any, Any], float]:
    """Two models of one checkpoint: one the eager runner runs, as ``trnmodels generate --eager`` does, and
    one the compiled graphs are bound to (``bind``; its seconds are returned too). Binding packs the linear
    layers for core's GEMMs and gives the plain weights back, and a step without a graph then runs the
    packed GEMM: on the bound model, "eager" would not be what ``--eager`` runs."""
    eager_model = build()
    model = build()
    start = time.perf_counter()
    graphs = bind(model)
    return eager_model, model, graphs, time.perf_counter() - start


def _throughput(checkpoint: dict[str, Any], settings: Settings, cache_dir: str) -> dict[str, Any]:
    """Our runner eager and with the compiled graphs, and HF ``generate``, on the same weights."""
    from transformers import AutoModelForCausalLM

    from trnmodels.core.causal_lm import build_model
    from trnmodels.core.compile import CompileTarget, load_compiled_graphs
    from trnmodels.core.parallel.state import destroy_parallel_state, init_parallel_state
    from trnmodels.core.runner.engine import Runner
    from trnmodels.core.runner.graphs import DECODE, GraphSpec

    target = CompileTarget(checkpoint["dir"], BENCH_RUNNER)
    init_parallel_state(1)
    try:
        eager_model, model, graphs, load_seconds = eager_and_bound_models(
            lambda: build_model(checkpoint["dir"], target.neuron_config(), progress=False),
            lambda bound: load_compiled_graphs(target, bound, cache_dir),
        )
        hf = AutoModelForCausalLM.from_pretrained(checkpoint["dir"], dtype=torch.float32).eval()
        # The batch-1 decode graph keeps its latest inputs: after the rounds, a dense model's step is timed
        # again piece by piece (``measure.decode_split``), for what the roofline's section says.
        batch1 = GraphSpec(DECODE, (1, BENCH_RUNNER.context_len_buckets[-1]))
        recording = measure.RecordingGraph(graphs[batch1]) if batch1 in graphs else None
        if recording is not None:
            graphs[batch1] = recording
        systems = {
            "ours_eager": measure.runner_generate(Runner(eager_model, BENCH_RUNNER)),
            "ours_compiled": measure.runner_generate(Runner(model, BENCH_RUNNER, graphs=graphs)),
            "hf": measure.hf_generate(hf, checkpoint["pad_token_id"]),
        }
        # The roofline's bandwidth is measured between the rounds: this shared VM's speed drifts over a
        # run, and a step is compared with the bandwidth of the same minutes.
        streams: dict[str, list[float]] = {"bandwidth_bytes_per_s": [], "read_bandwidth_bytes_per_s": []}

        def measure_streams() -> None:
            streams["bandwidth_bytes_per_s"].append(measure.memory_bandwidth(settings.bandwidth_bytes))
            streams["read_bandwidth_bytes_per_s"].append(measure.read_bandwidth(settings.bandwidth_bytes))

        figures = measure.throughput(systems, *_prompts(checkpoint, settings), between_rounds=measure_streams)
        split = (
            measure.decode_split(recording, model, settings.repeats)
            if recording is not None and not checkpoint["experts"]
            else None
        )
    finally:
        destroy_parallel_state()
    return {
        "figures": figures,
        "graphs_load_seconds": load_seconds,
        "graphs_loaded": len(graphs),
        "decode_split": split,
        "bandwidth": {name: statistics.median(values) for name, values in streams.items()}
        | {"bandwidth_in_rounds": len(streams["bandwidth_bytes_per_s"])},
    }


def _checkpoint(model: str, workload: str, work_dir: Path, log: _Log) -> dict[str, Any]:
    if workload == "bench":
        log(f"random-weight checkpoint from the {model} plugin's bench config")
        return measure.make_checkpoint(model, work_dir / "checkpoint")
    from trnmodels.core.real_weights import real_checkpoint

    log(f"real checkpoint {REAL_WEIGHTS[model]} (`trnmodels real-weights`)")
    path, _ = real_checkpoint(REAL_WEIGHTS[model])
    # Read once, so its loading is measured from the page cache like the bench checkpoint just written.
    measure.read_into_page_cache(path)
    return measure.checkpoint_info(path) | {"source": REAL_WEIGHTS[model]}


def _run_workload(model: str, workload: str, settings: Settings, work_dir: Path, log: _Log) -> dict[str, Any]:
    """The checkpoint, its loading, its cold and warm compile, and its throughput against HF."""
    from trnmodels.core.runner.graphs import all_graph_specs

    work_dir.mkdir(parents=True)
    # A fresh Inductor cache per workload, so each cold compile is really cold.
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(work_dir / "inductor")
    checkpoint = _checkpoint(model, workload, work_dir, log)
    out: dict[str, Any] = {
        "workload": workload,
        "checkpoint": {k: v for k, v in checkpoint.items() if k != "dir"},
    }
    tp = tp_degree(checkpoint["dir"])
    log(f"{workload}: weight loading: plain read, ours TP=1, ours TP={tp}; {settings.load_repeats} rounds")
    out["loading"] = measure.measure_loading(checkpoint["dir"], settings.load_repeats, tp)
    specs = all_graph_specs(BENCH_RUNNER)
    jobs = (settings.jobs_compared, settings.jobs) if workload == "bench" else (settings.jobs,)
    log(f"{workload}: compile {', '.join(s.name for s in specs)}: cold at {jobs} jobs, warm, CLI start-up")
    out["compile"] = measure.compile_times(checkpoint["dir"], work_dir, jobs, settings.cli_repeats)
    cache_dir = measure.compile_cache_dir(work_dir, settings.jobs)
    log(f"{workload}: throughput: ours eager, ours compiled, HF; {settings.repeats} rounds")
    figures = _throughput(checkpoint, settings, cache_dir)
    out["compile"] |= {
        "load_seconds": figures["graphs_load_seconds"],
        "loaded_graphs": figures["graphs_loaded"],
    }
    out["throughput"] = figures["figures"]
    if figures["decode_split"] is not None:
        out["decode_split"] = figures["decode_split"]
    # The workload's own bandwidth figures (``views`` puts them over the run's, for its roofline).
    out |= figures["bandwidth"]
    return out


def run_benchmark(
    model: str, settings: Settings | None = None, only: Sequence[str] | None = None
) -> dict[str, Any]:
    """Every figure of the benchmark page, measured in this one run, for each of the model's workloads
    (``only``: a subset of them)."""
    settings = settings or Settings()
    unknown = sorted(set(only or ()) - set(workloads(model)))
    if unknown or only == []:
        raise ValueError(f"{model} has the workloads {', '.join(workloads(model))}; asked for {only}")
    chosen = [w for w in workloads(model) if only is None or w in only]
    log = _Log()
    machine_start, own_start = measure.cpu_seconds()
    results: dict[str, Any] = {
        "model": model,
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": machine_info(),
        "settings": asdict(settings),
        "runner": asdict(BENCH_RUNNER),
    }
    saved_env = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    with tempfile.TemporaryDirectory(prefix="trnmodels-bench-") as tmp:
        try:
            log("memory bandwidth")
            results["bandwidth_bytes_per_s"] = measure.memory_bandwidth(settings.bandwidth_bytes)
            results["read_bandwidth_bytes_per_s"] = measure.read_bandwidth(settings.bandwidth_bytes)
            results["workloads"] = [
                _run_workload(model, workload, settings, Path(tmp) / workload, log) for workload in chosen
            ]
        finally:
            if saved_env is None:
                os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
            else:
                os.environ["TORCHINDUCTOR_CACHE_DIR"] = saved_env
    machine_end, own_end = measure.cpu_seconds()
    wall = time.perf_counter() - log.start
    results["machine"] |= {
        "load_average_end": os.getloadavg(),
        "run_seconds": wall,
        "other_processes_cores": max(0.0, (machine_end - machine_start) - (own_end - own_start)) / wall,
    }
    log("done")
    return results
