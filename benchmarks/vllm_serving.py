"""The vLLM serving benchmark behind ``nox -s bench-vllm``: our plugin against vLLM's own implementation.

    python -m benchmarks.vllm_serving [PLUGIN] [--out docs/benchmarks/vllm.md] [--quick]

One run builds a random-weight checkpoint from the plugin's bundled ``bench`` config (about 100M
parameters), then serves it four times on 127.0.0.1 with the same flags: our plugin and vLLM's own
implementation (``TRNMODELS_VLLM_DISABLE``), each with vLLM's default flags (torch.compile) and in eager
mode. The servers start one after another and then stay up side by side, and the measurements take
turns: ``ROUNDS`` rounds, each measuring every server once, in an order rotated from round to round, so a
slow spell of the shared machine falls on every server compared rather than on whichever ran at the time.
A round's measurement of one server is a fixed set of random token-id prompts sent as streaming
``/v1/completions`` requests by a bounded number of concurrent clients (per request the time to the first
token, TTFT, and the time per output token after it, TPOT; output tokens per second over the whole load),
then decode at batch 1 and 8 (waves of that many requests sent together): decode tok/s = batch ÷ median
TPOT, the prefill excluded, the definition ``benchmarks.llm`` uses against HF. Each figure on the page is
the median over the rounds; the page and a JSON of the raw figures (every round's too) are written from
that one run.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

from trnmodels.core.vllm.registration import DISABLE_ENV

from .machine import wait_until_quiet
from .pages import save_page
from .vllm_server import VllmServer


@dataclass(frozen=True)
class Load:
    num_prompts: int = 32
    input_len: int = 128
    output_len: int = 64
    concurrency: int = 8
    dtype: str = "bfloat16"
    max_model_len: int = 512


QUICK = Load(num_prompts=8, input_len=32, output_len=16, concurrency=4)


@dataclass(frozen=True)
class DecodeLoad:
    """Waves of ``batch`` requests sent together, each of ``input_len`` prompt tokens and ``output_len``
    output tokens, so the engine decodes them as one batch; the batch sizes of ``benchmarks.llm``."""

    batches: tuple[int, ...] = (1, 8)
    waves: int = 3
    input_len: int = 32
    output_len: int = 33


QUICK_DECODE = DecodeLoad(waves=1, output_len=9)

# Measurements of every server, taking turns (``--quick``: one). Five, not three: on the 2-vCPU machine one
# server's rounds moved by up to 7%, more than the margin a verdict is read at, and a median of three
# follows a single slow round.
ROUNDS = 5
# A measurement starts once the machine keeps fewer cores busy than this over a window of this many
# seconds (``machine.wait_until_quiet``).
QUIET_CORES = 0.15
QUIET_WINDOW = 0.5

# name -> (extra server flags, plugin disabled, what it is, start-up timeout in s). vLLM's own class is
# compiled by default; inductor on a 2-core shared machine can take many minutes, hence its long timeout.
SYSTEMS: dict[str, tuple[list[str], bool, str, float]] = {
    "plugin": ([], False, "trnmodels plugin (vLLM's default flags: torch.compile)", 2400),
    "plugin-eager": (["--enforce-eager"], False, "trnmodels plugin, `--enforce-eager`", 900),
    "vllm-eager": (["--enforce-eager"], True, "vLLM's own implementation, `--enforce-eager`", 900),
    "vllm": ([], True, "vLLM's own implementation (vLLM's default flags: torch.compile)", 2400),
}
# The pairs the ratios compare (plugin side, vLLM side, label): like for like first, then the plugin as
# served by default against vLLM's own eager class.
PAIRS: tuple[tuple[str, str, str], ...] = (
    ("plugin", "vllm", "both with vLLM's default flags (compiled)"),
    ("plugin-eager", "vllm-eager", "both `--enforce-eager`"),
    ("plugin", "vllm-eager", "the plugin with vLLM's default flags, vLLM's own `--enforce-eager`"),
)


def prompts(load: Load, vocab: int, seed: int = 0) -> list[list[int]]:
    # Ids from 6 up: 0-5 are the tokenizer's special tokens (BOS, EOS, PAD, chat roles).
    rng = random.Random(seed)
    return [[rng.randrange(6, vocab) for _ in range(load.input_len)] for _ in range(load.num_prompts)]


def one_request(server: VllmServer, prompt: list[int], load: Load) -> dict[str, float]:
    body = {
        "prompt": prompt,
        "max_tokens": load.output_len,
        "temperature": 0.0,
        "ignore_eos": True,
        "stream_options": {"include_usage": True},
    }
    start = time.perf_counter()
    first = None
    tokens = 0
    for event in server.stream("/v1/completions", body):
        if first is None and event.get("choices"):
            first = time.perf_counter()
        if event.get("usage"):
            tokens = event["usage"]["completion_tokens"]
    end = time.perf_counter()
    if first is None or tokens != load.output_len:
        raise RuntimeError(f"request answered {tokens} tokens, expected {load.output_len}")
    return {"ttft": first - start, "tpot": (end - first) / max(tokens - 1, 1), "latency": end - start}


def run_load(server: VllmServer, load: Load, vocab: int) -> dict[str, Any]:
    # Warm-up outside the measurement: the first requests pay one-time costs (graph capture, allocations).
    for p in prompts(QUICK, vocab, seed=1)[: load.concurrency]:
        one_request(server, p[:8], Load(output_len=4, concurrency=1))
    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=load.concurrency) as pool:
        per_request = list(pool.map(lambda p: one_request(server, p, load), prompts(load, vocab)))
    wall = time.perf_counter() - start
    return {
        "wall_seconds": wall,
        "output_tokens_per_s": load.num_prompts * load.output_len / wall,
        "ttft_median_ms": 1000 * statistics.median(r["ttft"] for r in per_request),
        "ttft_p90_ms": 1000 * statistics.quantiles([r["ttft"] for r in per_request], n=10)[-1],
        "tpot_median_ms": 1000 * statistics.median(r["tpot"] for r in per_request),
        "tpot_p90_ms": 1000 * statistics.quantiles([r["tpot"] for r in per_request], n=10)[-1],
    }


def run_decode(server: VllmServer, decode: DecodeLoad, vocab: int) -> dict[str, dict[str, float]]:
    """Per batch size: decode tok/s = batch ÷ median TPOT over every request of its waves."""
    figures = {}
    for batch in decode.batches:
        load = Load(input_len=decode.input_len, output_len=decode.output_len, concurrency=batch)
        tpots = []
        for wave in range(decode.waves):
            wave_prompts = prompts(replace(load, num_prompts=batch), vocab, seed=100 + wave)
            with ThreadPoolExecutor(max_workers=batch) as pool:
                answers = pool.map(lambda p, load=load: one_request(server, p, load), wave_prompts)
                tpots += [r["tpot"] for r in answers]
        tpot = statistics.median(tpots)
        figures[str(batch)] = {"tpot_median_ms": 1000 * tpot, "decode_tokens_per_s": batch / tpot}
    return figures


PLUGIN_LOG = "trnmodels: "  # the prefix of the bridge's own lines in the server's log


def start_server(name: str, checkpoint: Path, load: Load, decode: DecodeLoad, log_dir: Path) -> VllmServer:
    """Start system ``name`` and wait until it serves (a compiled server compiles first); checks that the
    plugin serves the model exactly when it should."""
    flags, disable, _, timeout = SYSTEMS[name]
    env = {k: v for k, v in os.environ.items() if k != DISABLE_ENV}
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # four servers side by side: 1 GiB each is ample
    if disable:
        env[DISABLE_ENV] = "all"
    args = ["--dtype", load.dtype, "--max-model-len", str(load.max_model_len), "--seed", "0", *flags]
    args += ["--max-num-seqs", str(max(load.concurrency, *decode.batches))]
    server = VllmServer(checkpoint, args, log_dir / f"{name}.log", env)
    try:
        server.wait_ready(timeout)
        served_by_plugin = "is served by plugin" in server.log()
        if served_by_plugin == disable:
            raise RuntimeError(
                f"{name}: expected the plugin {'off' if disable else 'on'}; see {server.log_path}"
            )
    except BaseException:
        server.kill()
        raise
    return server


def measure(server: VllmServer, load: Load, decode: DecodeLoad, vocab: int) -> dict[str, Any]:
    """One round's figures for one server: the load, then decode at each batch size."""
    return {**run_load(server, load, vocab), "decode": run_decode(server, decode, vocab)}


def median_of_rounds(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Each figure's median over the rounds (decode per batch size), and the rounds themselves."""
    figures: dict[str, Any] = {
        key: statistics.median(r[key] for r in rounds) for key in rounds[0] if key != "decode"
    }
    figures["decode"] = {
        batch: {
            key: statistics.median(r["decode"][batch][key] for r in rounds)
            for key in rounds[0]["decode"][batch]
        }
        for batch in rounds[0]["decode"]
    }
    return {**figures, "rounds": rounds}


def serve_and_measure_all(
    checkpoint: Path, load: Load, decode: DecodeLoad, vocab: int, log_dir: Path, rounds: int
) -> dict[str, dict[str, Any]]:
    """Start every system, measure them taking turns for ``rounds`` rounds, stop them. vLLM's own compiled
    class is a reference, not required: if it does not start, the page records why."""
    servers: dict[str, VllmServer] = {}
    results: dict[str, dict[str, Any]] = {}
    try:
        for name in SYSTEMS:
            print(f"[bench-vllm] starting {SYSTEMS[name][2]}", file=sys.stderr, flush=True)
            try:
                servers[name] = start_server(name, checkpoint, load, decode, log_dir)
            except RuntimeError as e:
                if name != "vllm":
                    raise
                results[name] = {"error": str(e).splitlines()[0]}
        names = list(servers)
        per_round: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
        for r in range(rounds):
            for name in names[r % len(names) :] + names[: r % len(names)]:
                quiet = wait_until_quiet(QUIET_CORES, QUIET_WINDOW)
                if not quiet["quiet"]:
                    print(
                        f"[bench-vllm] the machine kept {quiet['busy_cores']:.2f} cores busy for "
                        f"{quiet['seconds']:.0f} s: measuring {name} anyway",
                        file=sys.stderr,
                        flush=True,
                    )
                figures = measure(servers[name], load, decode, vocab)
                per_round[name].append(
                    {
                        **figures,
                        "quiet_wait_seconds": quiet["seconds"],
                        "busy_cores_before": quiet["busy_cores"],
                    }
                )
                print(
                    f"[bench-vllm] round {r + 1}, {name}: {per_round[name][-1]}", file=sys.stderr, flush=True
                )
        for name, server in servers.items():
            # What the bridge reported at start-up (the served class, and which kernels it chose).
            said = [
                line[line.index(PLUGIN_LOG) :] for line in server.log().splitlines() if PLUGIN_LOG in line
            ]
            server.stop()
            results[name] = {
                "startup_seconds": server.startup_seconds,
                **median_of_rounds(per_round[name]),
                **({"plugin_log": said} if said else {}),
            }
    finally:
        for server in servers.values():
            server.kill()
    return {name: results[name] for name in SYSTEMS}


# The targets of the performance issue: parity in eager mode, and within 10% of vLLM's own compiled model
# with vLLM's default flags, where both traces go through Inductor.
EAGER_TARGET = 1.0
COMPILED_TARGET = 0.9


def verdict(mine: dict[str, Any], theirs: dict[str, Any], target: float = EAGER_TARGET) -> str:
    met = mine["output_tokens_per_s"] >= target * theirs["output_tokens_per_s"]
    return "met" if met else "missed"


def ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}×" if b else "n/a"


def quiet_starts(systems: dict[str, Any]) -> str:
    """The page's sentence on how each measurement waited for a quiet machine."""
    starts = [r for s in systems.values() for r in s.get("rounds", []) if "quiet_wait_seconds" in r]
    if not starts:
        return "Measurements did not wait for a quiet machine."
    busy = [r for r in starts if r["busy_cores_before"] >= QUIET_CORES]
    return (
        f"Each measurement started once the machine kept fewer than {QUIET_CORES} cores busy over "
        f"{QUIET_WINDOW:g} s (a vLLM server keeps a core busy for about a second after its last request, which the next "
        f"server measured would share): the longest wait was {max(r['quiet_wait_seconds'] for r in starts):.1f} s"
        + (
            f"; {len(busy)} of {len(starts)} started on a busy machine after waiting "
            f"{max(r['quiet_wait_seconds'] for r in busy):.0f} s."
            if busy
            else f", and all {len(starts)} started quiet."
        )
    )


def write_page(results: dict[str, Any], out: Path) -> None:
    r = results["systems"]
    load = results["load"]
    m = results["machine"]
    bf16 = (
        "BF16 arithmetic in hardware"
        if m["bf16_in_hardware"]
        else "no BF16 arithmetic in hardware (no AVX512-BF16 or AMX: BF16 matmuls convert in software)"
    )
    plugin, own, eager = r["plugin"], r["vllm"], r["vllm-eager"]
    name, arch = results["plugin"], results["checkpoint"]["architecture"]
    decode = results["decode_load"]
    lines = [
        f"# Benchmark: vLLM serving, trnmodels plugin vs vLLM's own implementation ({name})",
        "",
        f"Generated by `python -m benchmarks.vllm_serving {name}` (nox session `bench-vllm -- {name}`; "
        f"`bench-{name}` runs it too) on {results['date']}. Every figure comes from that one run; the raw figures are in "
        f"[{out.with_suffix('.json').name}]({out.with_suffix('.json').name}). Do not edit this page: rerun "
        "the session.",
        "",
        "## Machine and software",
        "",
        f"- CPU: {m['cpu']}, {m['cores']} cores, torch CPU capability {m['cpu_capability']}, {bf16}; "
        f"{m['memory_gib']:.1f} GiB RAM; load average at the start "
        f"{m['load_average_start'][0]:.2f} (a one-minute average: it still counts the processes of a run "
        "just before this one; the machine is shared, and the rounds spread whatever else runs over "
        "all four servers)",
        f"- vllm-cpu {results['versions']['vllm-cpu']}, torch {results['versions']['torch']}, "
        f"trnmodels-core {results['versions']['trnmodels-core']}, "
        f"{results['plugin_distribution']} {results['versions']['plugin']}",
        "",
        "## Model and load",
        "",
        f"- `{results['checkpoint']['architecture']}` from the {results['plugin']} plugin's bundled `bench` "
        f"config, random weights: {results['checkpoint']['num_parameters'] / 1e6:.1f} M parameters, served "
        f"in {load['dtype']}.",
        *[f"- The plugin's start-up log: `{line}`" for line in plugin.get("plugin_log", [])],
        f"- {load['num_prompts']} streaming `/v1/completions` requests of {load['input_len']} random prompt "
        f"tokens and exactly {load['output_len']} output tokens (greedy, `ignore_eos`), {load['concurrency']} "
        f"concurrent clients on 127.0.0.1; the servers run with `--max-num-seqs {results['max_num_seqs']}` "
        "and otherwise the same flags. A short warm-up precedes each measured load.",
        f"- The four servers run side by side: started one after another, then measured taking turns, "
        f"{results.get('rounds', 1)} round(s), each measuring every server once (the load, then the "
        "decode waves below) in an order rotated from round to round, so a slow spell of the shared "
        "machine falls on every server compared. Each figure below is the median over the rounds; every "
        "round's figures are in the JSON.",
        f"- {quiet_starts(r)}",
        f"- Decode at batch {' and '.join(map(str, decode['batches']))}: {decode['waves']} wave(s) per batch "
        f"size of that many requests sent together ({decode['input_len']} prompt tokens, "
        f"{decode['output_len']} output tokens each), so the engine decodes them as one batch. Decode tok/s "
        "= batch ÷ median TPOT (TPOT: time from a request's first token to its last, per later token), "
        f"which excludes the prefill like the HF comparison of [{name}.md]({name}.md) (that page runs in "
        "float32 with the trnmodels runner; this one serves in "
        f"{load['dtype']} through vLLM, so compare ratios, not absolute figures).",
        "",
        "## Results",
        "",
        "| server | output tok/s | TTFT median (p90), ms | TPOT median (p90), ms | start-up, s |",
        "|---|---|---|---|---|",
    ]
    for name, (_, _, what, _) in SYSTEMS.items():
        s = r[name]
        if "error" in s:
            lines.append(f"| {what} | did not start: {s['error']} | | | |")
            continue
        lines.append(
            f"| {what} | {s['output_tokens_per_s']:.1f} | {s['ttft_median_ms']:.0f} ({s['ttft_p90_ms']:.0f}) | "
            f"{s['tpot_median_ms']:.1f} ({s['tpot_p90_ms']:.1f}) | {s['startup_seconds']:.0f} |"
        )
    pairs = [pair for pair in PAIRS if "error" not in r[pair[0]] and "error" not in r[pair[1]]]
    lines += [
        "",
        "## Ratios (plugin ÷ vLLM's own; above 1 is better for throughput, below 1 for latencies)",
        "",
        "| plugin ÷ vLLM's own | output tok/s | TTFT median | TPOT median |",
        "|---|---|---|---|",
    ]
    for mine, theirs, label in pairs:
        a, b = r[mine], r[theirs]
        lines.append(
            f"| {label} | "
            f"{ratio(a['output_tokens_per_s'], b['output_tokens_per_s'])} | "
            f"{ratio(a['ttft_median_ms'], b['ttft_median_ms'])} | {ratio(a['tpot_median_ms'], b['tpot_median_ms'])} |"
        )
    batches = decode["batches"]
    lines += [
        "",
        "## Decode (the last rows: plugin ÷ vLLM's own)",
        "",
        "| server | " + " | ".join(f"decode tok/s, batch {b}" for b in batches) + " |",
        "|---|" + "---|" * len(batches),
    ]
    for system, (_, _, what, _) in SYSTEMS.items():
        if "error" not in r[system]:
            figures = [r[system]["decode"][str(b)]["decode_tokens_per_s"] for b in batches]
            lines.append(f"| {what} | " + " | ".join(f"{f:.1f}" for f in figures) + " |")
    for mine, theirs, label in pairs:
        ratios = [
            ratio(
                r[mine]["decode"][str(b)]["decode_tokens_per_s"],
                r[theirs]["decode"][str(b)]["decode_tokens_per_s"],
            )
            for b in batches
        ]
        lines.append(f"| plugin ÷ vLLM's own, {label} | " + " | ".join(ratios) + " |")

    def compile_effect(compiled: str, eager_name: str) -> str:
        if "error" in r[compiled]:
            return "did not finish compiling within the start-up timeout"
        gain = r[compiled]["output_tokens_per_s"] / r[eager_name]["output_tokens_per_s"]
        return f"{gain:.2f}×"

    plugin_eager = r["plugin-eager"]
    lines += [
        "",
        "## Reading the ratios",
        "",
        "Goal: parity or better with vLLM's own implementation, like for like. Output throughput with "
        f"vLLM's default flags: {ratio(plugin['output_tokens_per_s'], own['output_tokens_per_s'])}, "
        f"target ≥ {COMPILED_TARGET}× (**{verdict(plugin, own, COMPILED_TARGET)}**); both "
        f"`--enforce-eager`: {ratio(plugin_eager['output_tokens_per_s'], eager['output_tokens_per_s'])}, "
        f"target ≥ {EAGER_TARGET}× (**{verdict(plugin_eager, eager)}**).",
        "",
        "- Both run inside the same engine: vLLM's scheduler, its paged KV cache and its CPU attention "
        "kernel (the plugin's attention modules are backed by vLLM's attention layer), and its sampler. "
        "What differs is the model code between the attention calls: the plugin's model file (our "
        f"linear, norm, rotary and MLP ops) against vLLM's `{arch}` with its fused CPU ops.",
        "- Both opt into vLLM's compile: with vLLM's default flags, vLLM's CPU backend traces each model's "
        "forward once with a symbolic token count and compiles it with Inductor, which fuses the "
        "elementwise work (norms, rotary, activations) between the matmuls and the attention calls. "
        "Output throughput, default ÷ eager, in this run: the plugin "
        f"{compile_effect('plugin', 'plugin-eager')}, vLLM's own class {compile_effect('vllm', 'vllm-eager')}. "
        "In the plugin's "
        "graph, a linear layer whose weight a packed GEMM took (below) is traced as that GEMM, as vLLM's "
        "own graph calls its own; the other linear layers (and a MoE model's token-sparse experts when they "
        "run) are custom ops that choose their kernel when they run (`trnmodels::linear`, "
        "`trnmodels::moe_experts`; `trnmodels.core.ops.dispatch`), since the trace's sizes are not the "
        "calls'.",
        "- On CPU, vLLM's own linear layers choose a GEMM once, after loading "
        "(`dispatch_cpu_unquantized_gemm`): the sgl-kernel `weight_packed_linear` on a CPU with AMX, else "
        "a oneDNN matmul primitive built for the weight (it reorders the weight once, into its own "
        "layout), else torch's `F.linear`; its rotary embedding is a C++ kernel, and its RMSNorm goes "
        "through vLLM's IR op registry (on a CPU, to its native PyTorch form, as composite as ours). "
        "After loading, the bridge packs each of the plugin's BF16 linear weights (the small replicated "
        "projections too: a Gemma 4 layer's per-layer input gate and projection, a gpt-oss router) for "
        "one GEMM, which core's `linear` op then runs (`trnmodels.core.vllm.packed_linear`; the start-up "
        "log above says which GEMM and for how many layers): on a CPU with AVX512-BF16 or AVX2, core's BF16 "
        "GEMM (`trnmodels.core.cpu.bf16_gemm`, a C++ kernel over the weight packed once into panels of 32 "
        "output columns, which reads a weight faster than vLLM's oneDNN GEMM at decode sizes; "
        "[bf16-gemm.md](bf16-gemm.md) times the two side by side, and [bf16-gemm-avx2.md](bf16-gemm-avx2.md) "
        "its AVX2 build, where vLLM's dispatch falls back to `F.linear`), else the GEMM vLLM's dispatch returns "
        "(also with `TRNMODELS_BF16_GEMM=vllm`). Where there is none, the op calls `F.linear`, or on a "
        "CPU without BF16 arithmetic computes BF16 calls of 32 rows or more in FP32 and rounds once "
        "(`trnmodels.core.cpu.linear`). The plugin's "
        "norms and rotary are composite PyTorch ops. A MoE model's "
        "BF16 experts run vLLM's fused C++ MoE kernel (`cpu_fused_moe`) on both sides: after loading, the "
        "bridge swaps the plugin's experts modules for it (`trnmodels.core.vllm.fused_moe`; the start-up "
        "log above says whether it did), since core's token-sparse kernel (`trnmodels.core.cpu.moe`), "
        "built from torch ops, passes over an expert's BF16 weight once per token on a CPU without BF16 "
        "arithmetic. This run does not attribute the remaining gaps between those.",
        "",
    ]
    save_page(out, lines, results)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.vllm_serving", description=__doc__)
    parser.add_argument("plugin", nargs="?", default="llama3", help="plugin name (default llama3)")
    parser.add_argument("--out", type=Path, default=Path("docs/benchmarks/vllm.md"))
    parser.add_argument("--quick", action="store_true", help="a small load: a smoke run, same page")
    args = parser.parse_args(argv)
    load = QUICK if args.quick else Load()
    decode = QUICK_DECODE if args.quick else DecodeLoad()

    from trnmodels.core.plugins import discover_plugins
    from trnmodels.core.testing import train_tokenizer

    from .llm.measure import make_checkpoint
    from .machine import machine_info

    plugin = discover_plugins()[args.plugin]
    with tempfile.TemporaryDirectory(prefix="trnmodels-vllm-bench-") as tmp:
        checkpoint = make_checkpoint(args.plugin, Path(tmp) / "checkpoint")
        train_tokenizer().save_pretrained(checkpoint["dir"])
        vocab = 320  # the trained tokenizer's ids; the model's vocabulary is larger
        rounds = 1 if args.quick else ROUNDS
        systems = serve_and_measure_all(Path(checkpoint["dir"]), load, decode, vocab, Path(tmp), rounds)
    machine = machine_info()
    machine["memory_gib"] = machine.pop("memory_bytes") / 2**30
    results = {
        "plugin": args.plugin,
        "plugin_distribution": plugin.distribution,
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": machine,
        "versions": {
            "vllm-cpu": metadata.version("vllm-cpu"),
            "torch": machine["torch"],
            "trnmodels-core": metadata.version("trnmodels-core"),
            "plugin": plugin.version,
        },
        "checkpoint": {k: v for k, v in checkpoint.items() if k != "dir"},
        "load": asdict(load),
        "decode_load": asdict(decode),
        "max_num_seqs": max(load.concurrency, *decode.batches),
        "rounds": rounds,
        "systems": systems,
    }
    write_page(results, args.out)
    print(f"wrote {args.out} and {args.out.with_suffix('.json')}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
