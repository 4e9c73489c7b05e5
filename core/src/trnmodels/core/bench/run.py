"""One benchmark run: every measurement, in order, into one JSON-ready dict."""

from __future__ import annotations

import os
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch

from . import measure
from .measure import BENCH_RUNNER


@dataclass(frozen=True)
class Settings:
    load_repeats: int = 5  # fresh processes per weight-loading measurement (median)
    repeats: int = 5  # timed repetitions per throughput figure (median)
    new_tokens: int = 65  # generated per decode measurement: 1 from the prefill, then 64 decode steps
    prefill_len: int = BENCH_RUNNER.max_model_len
    decode_prompt_len: int = 32
    batch: int = BENCH_RUNNER.max_num_seqs
    jobs: int = 2  # compile workers
    bandwidth_bytes: int = 1 << 30


QUICK = Settings(load_repeats=1, repeats=1, new_tokens=9)


class _Log:
    def __init__(self) -> None:
        self.start = time.perf_counter()

    def __call__(self, message: str) -> None:
        print(f"[bench {time.perf_counter() - self.start:6.1f}s] {message}", file=sys.stderr, flush=True)


def _workload(checkpoint: dict[str, Any], settings: Settings) -> tuple[Any, ...]:
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


def _throughput(checkpoint: dict[str, Any], settings: Settings, cache_dir: str) -> dict[str, Any]:
    """Our runner eager and with the compiled graphs, and HF ``generate``, on the same weights."""
    from transformers import AutoModelForCausalLM

    from ..causal_lm import build_model
    from ..compile import CompileTarget, load_compiled_graphs
    from ..parallel.state import destroy_parallel_state, init_parallel_state
    from ..runner.engine import Runner

    target = CompileTarget(checkpoint["dir"], BENCH_RUNNER)
    init_parallel_state(1)
    try:
        model = build_model(checkpoint["dir"], target.neuron_config(), progress=False)
        start = time.perf_counter()
        graphs = load_compiled_graphs(target, model, cache_dir)
        load_seconds = time.perf_counter() - start
        hf = AutoModelForCausalLM.from_pretrained(checkpoint["dir"], dtype=torch.float32).eval()
        systems = {
            "ours_eager": measure.runner_generate(Runner(model, BENCH_RUNNER)),
            "ours_compiled": measure.runner_generate(Runner(model, BENCH_RUNNER, graphs=graphs)),
            "hf": measure.hf_generate(hf, checkpoint["pad_token_id"]),
        }
        figures = measure.throughput(systems, *_workload(checkpoint, settings))
    finally:
        destroy_parallel_state()
    return {"figures": figures, "graphs_load_seconds": load_seconds, "graphs_loaded": len(graphs)}


def run_benchmark(model: str, settings: Settings | None = None) -> dict[str, Any]:
    """Every figure of the benchmark page, measured in this one run."""
    from ..compile import CompileTarget
    from ..runner.graphs import all_graph_specs

    settings = settings or Settings()
    log = _Log()
    machine_start, own_start = measure.cpu_seconds()
    results: dict[str, Any] = {
        "model": model,
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": measure.machine_info(),
        "settings": asdict(settings),
        "runner": asdict(BENCH_RUNNER),
    }
    saved_env = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    with tempfile.TemporaryDirectory(prefix="trnmodels-bench-") as tmp:
        # A fresh Inductor cache too, so the cold compile is really cold.
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(Path(tmp) / "inductor")
        try:
            log("memory bandwidth")
            results["bandwidth_bytes_per_s"] = measure.memory_bandwidth(settings.bandwidth_bytes)
            log(f"random-weight checkpoint from the {model} plugin's bench config")
            checkpoint = measure.make_checkpoint(model, Path(tmp) / "checkpoint")
            results["checkpoint"] = {k: v for k, v in checkpoint.items() if k != "dir"}
            log(f"weight loading: plain read, ours TP=1, ours TP=2; {settings.load_repeats} rounds")
            results["loading"] = measure.measure_loading(checkpoint["dir"], settings.load_repeats)
            specs = all_graph_specs(BENCH_RUNNER)
            log(f"compile {', '.join(s.name for s in specs)}: cold, then warm")
            cache_dir = str(Path(tmp) / "compile-cache")
            target = CompileTarget(checkpoint["dir"], BENCH_RUNNER)
            results["compile"] = measure.compile_times(target, specs, cache_dir, settings.jobs)
            log(f"throughput: ours eager, ours compiled, HF; {settings.repeats} rounds")
            out = _throughput(checkpoint, settings, cache_dir)
            results["compile"] |= {
                "load_seconds": out["graphs_load_seconds"],
                "loaded_graphs": out["graphs_loaded"],
            }
            results["throughput"] = out["figures"]
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
