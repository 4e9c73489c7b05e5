"""The benchmark page: targets and verdicts, markdown tables, the JSON and the PNG chart.

Everything here is a pure function of the results dict that ``run_benchmark`` returns (and the JSON
file holds), so the page is always regenerated from raw figures, never edited by hand.

The results hold one entry per workload (``run.workloads``: the bench config, and for a plugin with a real
checkpoint its real weights). Most functions here take a *view*: the run's shared figures (machine,
settings, bandwidth) merged with one workload's (checkpoint, loading, compile, throughput), see ``views``.
With more than one workload every table gains a first column naming the workload and holds each
workload's rows, one after the other; with one, the page is what it was before workloads existed.
"""

from __future__ import annotations

import itertools
import json
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trnmodels.core.cpu.moe import gathers_experts

MB = 1e6
GB = 1e9
Results = Mapping[str, Any]
View = Mapping[str, Any]
SYSTEMS = (("ours_eager", "ours eager"), ("ours_compiled", "ours compiled"), ("hf", "HF eager"))


def views(r: Results) -> list[View]:
    """One view per workload: the run's shared figures with that workload's."""
    shared = {k: v for k, v in r.items() if k != "workloads"}
    return [{**shared, **w} for w in r["workloads"]]


def workload_label(v: View) -> str:
    """How the page names a workload: the bench config, or the real checkpoint's source."""
    return "bench config" if v["workload"] == "bench" else v["checkpoint"]["source"]


def gbps(stats: Mapping[str, Any]) -> float:
    return stats["bytes"] / stats["seconds"] / GB


def step_bytes(r: View) -> float:
    """The weight bytes a batch-1 decode step must read: every weight a token uses, so of a MoE layer only
    the experts the token chose."""
    ck = r["checkpoint"]
    ex = ck.get("experts")
    if not ex:
        return ck["weight_bytes_per_token"]
    unchosen = 1 - ex["experts_per_token"] / ex["num_experts"]
    return ck["weight_bytes_per_token"] - ex["expert_bytes"] * unchosen


def roofline(r: View) -> float:
    """Decode tok/s at batch 1 if a step cost only streaming its weights at the measured bandwidth."""
    return r["bandwidth_bytes_per_s"] / step_bytes(r)


def decode_keys(r: View) -> list[str]:
    return ["decode_b1", f"decode_b{r['settings']['batch']}"]


def _loads(averages: Sequence[float]) -> str:
    return " / ".join(f"{a:.2f}" for a in averages)


def _mb(nbytes: float) -> str:
    return f"{nbytes / MB:.0f} MB"


@dataclass(frozen=True)
class Target:
    key: str
    name: str
    value: float
    op: str  # ">=" or "<="
    threshold: float
    percent: bool = False

    @property
    def met(self) -> bool:
        return self.value >= self.threshold if self.op == ">=" else self.value <= self.threshold

    @property
    def verdict(self) -> str:
        return "met" if self.met else "missed"

    def show(self, x: float) -> str:
        """Three significant digits, so a value just past its threshold does not print equal to it."""
        return f"{x:.2%}" if self.percent else f"{x:.3g}×"


def targets(r: View) -> list[Target]:
    load, ckpt = r["loading"], r["checkpoint"]["bytes"]
    worst_rank = max(s["peak_added"] for s in load["ours_tp"])
    return [
        *decode_targets(r),
        Target(
            "warm_start",
            "warm start (cache hit) ÷ cold compile",
            r["compile"]["warm_seconds"] / r["compile"]["cold_seconds"],
            "<=",
            0.10,
            percent=True,
        ),
        *compile_targets(r),
        Target(
            "load_speed",
            "weight loading ÷ plain safetensors read, GB/s at TP=1",
            gbps(load["ours_tp1"]) / gbps(load["plain"]),
            ">=",
            0.8,
        ),
        Target(
            "rss_tp1",
            "peak RSS of loading ÷ checkpoint bytes, TP=1",
            load["ours_tp1"]["peak_added"] / ckpt,
            "<=",
            1.2,
        ),
        Target(
            "rss_tp",
            f"peak RSS of loading ÷ checkpoint bytes, per rank at TP={load['tp']} (worst rank)",
            worst_rank / ckpt,
            "<=",
            0.7,
        ),
    ]


# The share of the batch-1 roofline a dense model's compiled decode should reach (issue 16).
ROOFLINE_SHARE = 0.85
# The cold-compile speed-up of the most `--jobs` over the fewest on the bench config (issue 16).
JOBS_SPEEDUP = 1.7


def decode_targets(r: View) -> list[Target]:
    """Decode against HF eager: compiled at batch 1 and, for a dense model, at the batch and against the
    roofline (a MoE model's compiled graphs run every expert: its own section says what that costs); eager
    at both."""
    t, batch = r["throughput"], r["settings"]["batch"]

    def ratio(mode: str, key: str) -> float:
        return t[mode][key] / t["hf"][key]

    out = [
        Target(
            "decode", "compiled decode at batch 1 ÷ HF eager", ratio("ours_compiled", "decode_b1"), ">=", 1.5
        )
    ]
    if not r["checkpoint"].get("experts"):
        name = f"compiled decode at batch {batch} ÷ HF eager"
        out.append(Target("decode_batch", name, ratio("ours_compiled", f"decode_b{batch}"), ">=", 1.2))
        name = "compiled decode at batch 1, share of the measured bandwidth roofline"
        share = t["ours_compiled"]["decode_b1"] / roofline(r)
        out.append(Target("roofline_share", name, share, ">=", ROOFLINE_SHARE, percent=True))
    for key, b in (("eager_decode", 1), ("eager_decode_batch", batch)):
        name = f"eager decode at batch {b} ÷ HF eager"
        out.append(Target(key, name, ratio("ours_eager", f"decode_b{b}"), ">=", 1.0))
    return out


def compile_targets(r: View) -> list[Target]:
    """The compile-time targets of the figures this run has (the `--jobs` speed-up on the bench config)."""
    c = r["compile"]
    out = []
    if len(by_jobs := c.get("cold_by_jobs", {})) > 1:
        few, many = _fewest_and_most(by_jobs)
        name = f"cold compile, `--jobs {many}` speed-up over `--jobs {few}`"
        out.append(
            Target(
                "compile_jobs", name, by_jobs[few]["seconds"] / by_jobs[many]["seconds"], ">=", JOBS_SPEEDUP
            )
        )
    if cli := c.get("cli"):
        name = "warm `trnmodels compile` (all hits) ÷ `trnmodels info`, CPU time"
        ratio = cli["compile_warm"]["cpu_seconds"] / cli["info"]["cpu_seconds"]
        out.append(Target("warm_cli", name, ratio, "<=", 1.3))
    return out


def _fewest_and_most(by_jobs: Mapping[str, Any]) -> tuple[str, str]:
    """The keys (worker counts, as strings) of the cold compiles the speed-up compares."""
    ordered = sorted(by_jobs, key=int)
    return ordered[0], ordered[-1]


def best_schedule(seconds: Sequence[float], workers: int) -> float:
    """The shortest makespan of independent jobs of these durations on ``workers`` workers (exhaustive:
    a handful of graphs)."""
    best = sum(seconds)
    for assignment in itertools.product(range(workers), repeat=len(seconds)):
        loads = [0.0] * workers
        for worker, s in zip(assignment, seconds, strict=True):
            loads[worker] += s
        best = min(best, max(loads))
    return best


# -- why a target was missed, from the measured figures ---------------------------------------------


def _why_decode(r: View) -> str:
    hf, ours = r["throughput"]["hf"]["decode_b1"], r["throughput"]["ours_compiled"]["decode_b1"]
    roof, bw, need = roofline(r), r["bandwidth_bytes_per_s"] / GB, 1.5 * r["throughput"]["hf"]["decode_b1"]
    text = (
        f"Decode at batch 1 is bound by memory bandwidth: every token reads "
        f"{_mb(step_bytes(r))} of float32 weights, so at the {bw:.1f} GB/s "
        f"measured in this run the roofline is {roof:.1f} tok/s ({1000 / roof:.1f} ms per token). HF eager "
        f"already reaches {hf:.1f} tok/s ({hf / roof:.0%} of it) and our compiled graphs {ours:.1f} tok/s "
        f"({ours / roof:.0%}, {1000 / ours:.1f} ms per token). 1.5× HF is {need:.1f} tok/s, "
        f"{need / roof:.0%} of the roofline. "
    )
    if need > roof:
        text += "No implementation can reach it on this machine at this precision. "
    else:
        text += (
            f"Reaching it means a step of {1000 / need:.1f} ms, leaving {1000 / need - 1000 / roof:.1f} ms "
            "beyond streaming the weights at full copy bandwidth for everything else a step does (attention "
            "over the cached context, norms, sampling, the runner's host-side bookkeeping). "
        )
    if r["checkpoint"].get("experts"):
        return text + (
            "At batch 1 our compiled graph reads only the chosen experts' weights, as HF's loop does: the "
            "MoE section above has the figures."
        )
    return text + (
        "The target presumes an eager baseline far from the roofline (dominated by per-op dispatch, as on "
        "an accelerator). On this CPU both spend the step in the same memory-bound matrix-vector products: "
        f"HF's step is only {1000 / hf - 1000 / roof:.1f} ms above the roofline, and that is all compiling "
        "could remove."
    )


def _why_roofline(r: View) -> str:
    ours, hf, roof = _step_ms(r, "ours_compiled", 1), _step_ms(r, "hf", 1), 1000 / roofline(r)
    need = roof / ROOFLINE_SHARE
    text = (
        f"Streaming the {_mb(step_bytes(r))} of weights a token reads at the "
        f"{r['bandwidth_bytes_per_s'] / GB:.1f} GB/s measured in this run takes {roof:.1f} ms; our compiled "
        f"step took {ours:.1f} ms ({ours - roof:.1f} ms more), HF's eager step {hf:.1f} ms. "
        f"{ROOFLINE_SHARE:.0%} of the roofline is a step of {need:.1f} ms: {need - roof:.1f} ms for all "
        "that is not streaming weights (attention over the cached context, norms, rotary, sampling, the "
        "runner's host-side bookkeeping), and the matrix-vector products streaming at full copy "
        "bandwidth"
    )
    split = r.get("decode_split")
    if not split:  # a run from before the step was timed piece by piece
        return text + ", which a GEMM reading the weight once in its own order does not quite reach."
    return text + ". " + _decode_split_text(r, split, ours)


def _decode_split_text(r: View, split: Mapping[str, Any], step_ms: float) -> str:
    graph, products = 1000 * split["graph_seconds"], 1000 * split["products_seconds"]
    read = split["read_bandwidth_bytes_per_s"]
    rounds_read = r.get("read_bandwidth_bytes_per_s")
    then = f"; in the throughput rounds it ran at {rounds_read / GB:.1f}" if rounds_read else ""
    products_rate = split["matrix_bytes"] / split["products_seconds"]
    graph_rate = step_bytes(r) / split["graph_seconds"]
    return (
        f"The step timed again piece by piece after the rounds ({split['rounds']} rounds taking turns, with a "
        f"read-only stream between them at {read / GB:.1f} GB/s{then}): the compiled graph alone, called on "
        f"a step's own inputs with nothing of the runner around it, took {graph:.1f} ms (the step in the "
        f"rounds: {step_ms:.1f} ms), reading the step's weights at {graph_rate / GB:.1f} GB/s, "
        f"{graph_rate / read:.0%} of that stream. Of it, the matrix-vector products alone (every linear "
        f"layer's weight and the LM head's against one row: {split['matrices']} matrices, "
        f"{_mb(split['matrix_bytes'])}; core's one-row linear in one graph compiled as the decode graphs "
        f"are) took {products:.1f} ms, reading at {products_rate / GB:.1f} GB/s, "
        f"{products_rate / read:.0%} of the stream; the rest of the graph (attention over the cached "
        f"context, norms, rotary, sampling) took the other {graph - products:.1f} ms."
    )


def _step_ms(r: View, mode: str, batch: int) -> float:
    return 1000 * batch / r["throughput"][mode][f"decode_b{batch}"]


def _why_decode_vs_hf(r: View, mode: str, batch: int, factor: float) -> str:
    ours, hf = _step_ms(r, mode, batch), _step_ms(r, "hf", batch)
    goal = "matching HF" if factor == 1 else f"{factor:g}× HF"
    text = (
        f"Ours took {ours:.1f} ms per decode step at batch {batch}, HF {hf:.1f} ms; {goal} needs "
        f"{hf / factor:.1f} ms. Both read the same weights each step."
    )
    if mode == "ours_compiled":
        context = r["runner"]["context_len_buckets"][-1]
        text += (
            f" The compiled graphs' shapes are static, the context bucket's {context} positions; their "
            "attention reads each sequence's real length where core's decode-attention kernel runs (the "
            "whole bucket where it cannot be built), as HF attends over each batch's real length."
        )
    if r["checkpoint"].get("experts") and mode == "ours_eager":
        text += (
            " The MoE section above gives the expert work per step: ours groups each expert's tokens into "
            "one matmul per expert, HF loops over the experts the batch chose."
        )
    return text


def _why_warm(r: View) -> str:
    c = r["compile"]
    return (
        f"The warm `compile_all` took {c['warm_seconds']:.2f} s against {c['cold_seconds']:.1f} s cold. A hit "
        "still hashes the config file and the source of core and the plugin to find the compile's manifest, "
        "and checks each artifact's sha256 before answering."
    )


def _why_jobs(r: View) -> str:
    by_jobs = r["compile"]["cold_by_jobs"]
    few, many = _fewest_and_most(by_jobs)
    workers = int(many)
    alone = [g["seconds"] for g in by_jobs[few]["graphs"]]
    shared = [g["seconds"] for g in by_jobs[many]["graphs"]]
    # The first graph a process compiles also pays the process's one-time set-up (lazy imports of the
    # compiler stack, its first capture); the others show what a graph alone costs.
    setup = max(0.0, alone[0] - statistics.median(alone[1:])) if len(alone) > 1 else 0.0
    work = [alone[0] - setup, *alone[1:]]
    queues = best_schedule(work, workers)
    return (
        f"Compiled one at a time the {len(alone)} graphs took {', '.join(f'{s:.1f}' for s in alone)} s, the "
        f"run {by_jobs[few]['seconds']:.1f} s (the first graph also paid the process's one-time set-up, about "
        f"{setup:.1f} s, its excess over the median of the others): {JOBS_SPEEDUP}× that speed is "
        f"{by_jobs[few]['seconds'] / JOBS_SPEEDUP:.1f} s. With graphs as "
        f"the unit of parallel work, {workers} compilers can at best split the {sum(work):.1f} s of graph "
        f"work (the set-up left out) into queues of {queues:.1f} s: at most {sum(work) / queues:.2f}×. "
        f"Side by side they took {', '.join(f'{s:.1f}' for s in shared)} s each, and the run "
        f"{by_jobs[many]['seconds']:.1f} s. The compile's own process takes the first graph; a worker is a "
        "fresh process that imports the stack before its first graph starts."
        + _side_by_side_text(
            r["compile"].get("side_by_side"), "a CPU-bound loop", "any {n}-way parallel work"
        )
        + _side_by_side_text(
            r["compile"].get("compiler_side_by_side"),
            "the C++ compiler (on kernels like Inductor's)",
            "a {n}-way parallel compile",
        )
        + _compile_ceiling_text(r["compile"], few, many)
    )


def _side_by_side_text(figures: Mapping[str, Any] | None, what: str, work: str) -> str:
    """The machine's own cap on the speed-up of ``work`` (``{n}``: the copies), measured in the same run
    by running ``what`` side by side (``side_by_side_slowdown``, ``compiler_side_by_side_slowdown``)."""
    if not figures:
        return ""
    text = (
        f" In this run {what} took {figures['slowdown']:.2f}× as long with {figures['copies']} "
        f"copies running at once as alone ({figures['together_seconds']:.2f} s against "
        f"{figures['alone_seconds']:.2f} s)"
    )
    if figures["slowdown"] <= 1.0:
        return text + ": each copy got a whole core, so the machine set no cap here."
    caps = work.format(n=figures["copies"])
    return text + f": this machine caps {caps} at {figures['speedup_ceiling']:.2f}× now."


def _compile_ceiling_text(c: Mapping[str, Any], few: str, many: str) -> str:
    """What the fewest jobs' own use of the cores leaves the most jobs to gain, at the compiler's measured
    side-by-side slowdown (runs recorded before ``cpu_seconds`` was measured have no such text)."""
    alone = c["cold_by_jobs"][few]
    if "cpu_seconds" not in alone or "compiler_side_by_side" not in c:
        return ""
    cores = alone["cpu_seconds"] / alone["seconds"]
    slowdown = max(1.0, c["compiler_side_by_side"]["slowdown"])
    ceiling = int(many) / (cores * slowdown)
    return (
        f" With `--jobs {few}` the compile kept {cores:.2f} cores busy on average ({alone['cpu_seconds']:.1f} "
        f"CPU seconds in {alone['seconds']:.1f} s): with {many} compilers each slowed {slowdown:.2f}× by the "
        f"other, the speed-up cannot pass {ceiling:.2f}× even with no graph waiting for another."
    )


def _why_warm_cli(r: View) -> str:
    cli = r["compile"]["cli"]
    return (
        f"A warm `trnmodels compile` used {cli['compile_warm']['cpu_seconds']:.2f} s of CPU and "
        f"`trnmodels info` {cli['info']['cpu_seconds']:.2f} s: the difference is what the compile command "
        "does beyond importing the CLI."
    )


def _why_load_speed(r: View) -> str:
    ours, plain = r["loading"]["ours_tp1"], r["loading"]["plain"]
    return (
        f"Our loader reached {gbps(ours):.2f} GB/s against {gbps(plain):.2f} GB/s for the plain read. It goes "
        "parameter by parameter, with positioned reads of each parameter's rows straight into its memory "
        "where the checkpoint stores them in the parameter's dtype (other parameters are read into a "
        "temporary tensor and copied in); the plain read makes one large read per tensor into fresh memory "
        "and no per-parameter bookkeeping."
    )


def _why_rss(stats: Mapping[str, Any], r: View, what: str, sharded: bool = False) -> str:
    ckpt, plain = r["checkpoint"]["bytes"], r["loading"]["plain"]
    extra_anon = stats["anon_added"] - stats["bytes"]
    text = (
        f"{what} added {_mb(stats['peak_added'])} of RSS at its peak, "
        f"{stats['peak_added'] / ckpt:.2f}× the {_mb(ckpt)} checkpoint, for {_mb(stats['bytes'])} of "
        f"parameters. The sampled split: +{_mb(stats['anon_added'])} anonymous and "
        f"+{_mb(stats['file_added'])} file-backed pages. "
    )
    if stats["file_added"] > 0.1 * ckpt:
        text += (
            "The file-backed part is the memory-mapped checkpoint: the loader reads through safetensors maps "
            "(`safe_open` / `get_slice`) and keeps the shard handles open until `load_weights` returns, so "
            "every page it has touched counts in the process RSS next to the parameters"
            + (
                " (a rank's column slice of a row-major tensor touches nearly every page of it, so a rank maps "
                "more than its share)"
                if sharded
                else ""
            )
            + ". These are clean page-cache pages the kernel can drop without writing anything, but they "
            "are RSS. The plain `pread` read "
            f"adds only +{_mb(plain['peak_added'])} ({plain['peak_added'] / ckpt:.2f}×): private memory, no "
            "mapping. "
        )
    if extra_anon > 0.05 * ckpt:
        text += (
            f"Anonymous memory exceeds the parameters by {_mb(extra_anon)}: buffers alive during the load, "
            "such as a tensor read into a temporary while it is copied into its parameter (the largest "
            f"tensor is {_mb(r['checkpoint']['largest_tensor_bytes'])})."
        )
    return text


EXPLANATIONS: dict[str, Callable[[View], str]] = {
    "decode": _why_decode,
    "decode_batch": lambda r: _why_decode_vs_hf(r, "ours_compiled", r["settings"]["batch"], 1.2),
    "roofline_share": _why_roofline,
    "eager_decode": lambda r: _why_decode_vs_hf(r, "ours_eager", 1, 1.0),
    "eager_decode_batch": lambda r: _why_decode_vs_hf(r, "ours_eager", r["settings"]["batch"], 1.0),
    "warm_start": _why_warm,
    "compile_jobs": _why_jobs,
    "warm_cli": _why_warm_cli,
    "load_speed": _why_load_speed,
    "rss_tp1": lambda r: _why_rss(r["loading"]["ours_tp1"], r, "Loading at TP=1"),
    "rss_tp": lambda r: _why_rss(
        max(r["loading"]["ours_tp"], key=lambda s: s["peak_added"]),
        r,
        f"At TP={r['loading']['tp']} the worst rank's load",
        True,
    ),
}


# -- tables -----------------------------------------------------------------------------------------


def md_table(headers: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    return "\n".join([*lines, *("| " + " | ".join(row) + " |" for row in rows)])


def workload_table(r: Results, headers: Sequence[str], rows: Callable[[View], list[list[str]]]) -> str:
    """One table of every workload's ``rows``; with more than one workload, a first column names it."""
    vs = views(r)
    if len(vs) == 1:
        return md_table(headers, rows(vs[0]))
    return md_table(["workload", *headers], [[workload_label(v), *row] for v in vs for row in rows(v)])


def target_rows(r: View) -> list[list[str]]:
    return [
        [t.name, t.show(t.value), f"{t.op} {t.show(t.threshold)}", f"**{t.verdict}**"] for t in targets(r)
    ]


def targets_table(r: Results) -> str:
    return workload_table(r, ["target", "measured", "required", "verdict"], target_rows)


def loading_rows(r: View) -> list[list[str]]:
    load, ckpt = r["loading"], r["checkpoint"]["bytes"]
    ours, plain = load["ours_tp1"], load["plain"]

    def speed(s: Mapping[str, Any]) -> str:
        return f"{gbps(s):.2f} GB/s ({_mb(s['bytes'])} in {s['seconds']:.3f} s)"

    def added(s: Mapping[str, Any]) -> str:
        return (
            f"{_mb(s['peak_added'])} = {s['peak_added'] / ckpt:.2f}× checkpoint "
            f"(+{_mb(s['anon_added'])} anon, +{_mb(s['file_added'])} file)"
        )

    rows = [
        ["throughput, TP=1", speed(ours), speed(plain), f"{gbps(ours) / gbps(plain):.2f}×"],
        [
            "peak RSS added by the load, TP=1",
            added(ours),
            added(plain),
            f"{ours['peak_added'] / plain['peak_added']:.2f}×",
        ],
        [
            "peak RSS of the process, TP=1",
            f"{_mb(ours['peak_rss'])} (baseline {_mb(ours['baseline_rss'])})",
            f"{_mb(plain['peak_rss'])} (baseline {_mb(plain['baseline_rss'])})",
            f"{ours['peak_rss'] / plain['peak_rss']:.2f}×",
        ],
    ]
    for s in load["ours_tp"]:
        rank = f"TP={load['tp']}, rank {s['rank']}"
        rows += [
            [
                f"throughput, {rank}",
                speed(s),
                f"{gbps(plain):.2f} GB/s (TP=1)",
                f"{gbps(s) / gbps(plain):.2f}×",
            ],
            [f"peak RSS added by the load, {rank}", added(s), "", ""],
        ]
    return rows


def loading_table(r: Results) -> str:
    headers = ["", "ours: `load_weights`", "plain `safetensors.torch.load_file`", "ours ÷ plain"]
    return workload_table(r, headers, loading_rows)


def throughput_rows(r: View) -> list[list[str]]:
    t = r["throughput"]
    keys = [("prefill", f"prefill, {r['settings']['prefill_len']}-token prompt (tok/s)")]
    keys += [(k, f"decode, batch {k.removeprefix('decode_b')} (tok/s)") for k in decode_keys(r)]
    rows = [
        [
            label,
            *(f"{t[s][k]:.1f}" for s, _ in SYSTEMS),
            f"{t['ours_eager'][k] / t['hf'][k]:.2f}×",
            f"{t['ours_compiled'][k] / t['hf'][k]:.2f}×",
        ]
        for k, label in keys
    ]
    roof = roofline(r)
    rows.append(
        [
            f"decode, batch 1, % of the roofline ({roof:.1f} tok/s)",
            *(f"{t[s]['decode_b1'] / roof:.0%}" for s, _ in SYSTEMS),
            "",
            "",
        ]
    )
    return rows


def throughput_table(r: Results) -> str:
    headers = ["", *(label for _, label in SYSTEMS), "eager ÷ HF", "compiled ÷ HF"]
    return workload_table(r, headers, throughput_rows)


def moe_section(r: View) -> list[str]:
    """For MoE models: decode against HF at batch 1 and the largest batch, and why the ratio is what it is."""
    ex = r["checkpoint"].get("experts")
    if not ex:
        return []
    t, batch = r["throughput"], r["settings"]["batch"]
    n, k, expert_bytes = ex["num_experts"], ex["experts_per_token"], ex["expert_bytes"]
    dense_bytes = r["checkpoint"]["weight_bytes_per_token"] - expert_bytes

    def touched(b: int) -> float:
        """Expected experts per layer that b tokens choose between them (uniform, independent routing)."""
        return n * (1 - (1 - k / n) ** b)

    def graph_experts(b: int) -> float:
        """Expert weights (in experts' worth per layer) our captured graph reads at batch b."""
        return b * k if gathers_experts(b, k, n) else n

    rows = []
    for key, b in (("decode_b1", 1), (f"decode_b{batch}", batch)):
        hf_bytes = dense_bytes + expert_bytes * touched(b) / n
        ours_bytes = dense_bytes + expert_bytes * graph_experts(b) / n
        rows.append(
            [
                f"decode, batch {b}",
                f"{t['ours_compiled'][key]:.1f}",
                f"{t['ours_eager'][key]:.1f}",
                f"{t['hf'][key]:.1f}",
                f"{t['ours_compiled'][key] / t['hf'][key]:.2f}×",
                f"{t['ours_eager'][key] / t['hf'][key]:.2f}×",
                f"{graph_experts(b):g} of {n}" + (" (gathered)" if gathers_experts(b, k, n) else " (all)"),
                f"{touched(b):.1f} of {n}",
                f"{hf_bytes / ours_bytes:.0%}",
            ]
        )
    table = md_table(
        [
            "",
            "ours compiled (tok/s)",
            "ours eager, token-sparse (tok/s)",
            "HF (tok/s)",
            "compiled ÷ HF",
            "eager ÷ HF",
            "experts our graph reads per layer",
            "experts HF runs per layer (expected)",
            "HF's weight bytes per step ÷ our graph's",
        ],
        rows,
    )
    largest = max((b for b in range(1, batch + 1) if gathers_experts(b, k, n)), default=0)
    text = (
        f"The model has {n} experts per layer and routes each token to {k}; expert weights are "
        f"{_mb(expert_bytes)} of the {_mb(r['checkpoint']['weight_bytes_per_token'])} a step can touch. Our "
        "compiled graphs keep shapes static (one captured graph serves every routing). While a step has no "
        f"more (token, expert) pairs than experts (here up to batch {largest}), the graph indexes each "
        "pair's expert weights in place (`trnmodels.core.cpu.moe.gathered_experts_ffn`), so a batch-1 step "
        f"reads the {k} chosen experts of each layer, as HF's loop does. Past that, every local expert runs "
        "on every token and the routing weights (zero for unchosen experts) combine them: one batched "
        f"matmul per projection reads each expert once for all rows, with {n / k:.0f}× the expert arithmetic "
        "the tokens need. HF's eager MoE loops over the experts the batch actually chose and gathers their "
        f"tokens (expected {touched(batch):.1f} of {n} per layer at batch {batch}), with a per-expert "
        "gather/scatter and Python loop. "
    )
    measured = [t["ours_compiled"][key] / t["hf"][key] for key in ("decode_b1", f"decode_b{batch}")]
    byte_share = [
        (dense_bytes + expert_bytes * touched(b) / n) / (dense_bytes + expert_bytes * graph_experts(b) / n)
        for b in (1, batch)
    ]
    text += (
        f"Measured in this run: compiled ÷ HF is {measured[0]:.2f}× at batch 1, where bytes alone would predict "
        f"{byte_share[0]:.2f}×, and {measured[1]:.2f}× at batch {batch}, where they would predict "
        f"{byte_share[1]:.2f}×. "
    )
    if measured[1] < 0.8 * byte_share[1]:
        text += (
            f"At batch {batch} we are behind by more than the bytes explain: the {n / k:.0f}× expert "
            "arithmetic is no longer hidden behind weight streaming on this machine's cores. "
        )
    eager = [t["ours_eager"][key] / t["hf"][key] for key in ("decode_b1", f"decode_b{batch}")]
    text += (
        "Eager calls on CPU run the token-sparse kernel instead (`trnmodels.core.cpu.moe`, as under vLLM): "
        "each expert runs on the tokens that chose it, like HF's loop, so it reads and computes only the "
        f"chosen experts; eager ÷ HF is {eager[0]:.2f}× at batch 1 and {eager[1]:.2f}× at batch {batch}. "
        "On Trainium the expert kernels (the Neuron path) are where a token-sparse dispatch belongs; the "
        "all-experts PyTorch path is the reference those kernels are checked against."
    )
    return ["## Mixture of experts: decode against HF", table, text]


def compile_rows(r: View) -> list[list[str]]:
    c = r["compile"]
    graphs = c["graphs"]
    hits = sum(g["warm"] == "hit" for g in graphs)

    def cold_row(jobs: str, run: Mapping[str, Any]) -> list[str]:
        per_graph = ", ".join(f"{g['name']} {g['cache']} {g['seconds']:.1f} s" for g in run["graphs"])
        return [
            f"cold `compile_all`, {len(run['graphs'])} graphs, {jobs} job" + ("s" if jobs != "1" else ""),
            f"{run['seconds']:.1f}",
            f"fresh artifact cache and fresh Inductor cache, in a fresh process: {per_graph}",
        ]

    rows = [cold_row(jobs, run) for jobs, run in sorted(c["cold_by_jobs"].items(), key=lambda kv: int(kv[0]))]
    rows += [
        [
            "warm `compile_all`, same cache",
            f"{c['warm_seconds']:.3f}",
            f"{hits}/{len(graphs)} hits; {c['warm_seconds'] / c['cold_seconds']:.2%} of cold",
        ],
        [
            "`load_compiled_graphs`",
            f"{c['load_seconds']:.2f}",
            f"{c['loaded_graphs']} packages loaded and bound to the weights; needed after a cold compile too",
        ],
    ]
    cli = c["cli"]
    commands = [
        ("info", "`trnmodels info`", "the CLI's imports and nothing else: the floor of any command"),
        ("compile_warm", "`trnmodels compile`, warm", "every graph a cache hit"),
        (
            "generate_cached",
            "`trnmodels generate`, 1 token",
            "with the cached graphs: load, bind, one prefill",
        ),
        ("generate_eager", "`trnmodels generate --eager`, 1 token", "the same without the graphs"),
    ]
    for key, what, note in commands:
        run = cli[key]
        rows.append(
            [
                f"{what} (CPU time)",
                f"{run['cpu_seconds']:.2f}",
                f"{note}; {run['wall_seconds']:.2f} s wall; {run['cpu_seconds'] / cli['info']['cpu_seconds']:.2f}× "
                "`info`'s CPU time",
            ]
        )
    return rows


def compile_table(r: Results) -> str:
    return workload_table(r, ["", "seconds", ""], compile_rows)


# -- the page, the chart, the files -----------------------------------------------------------------


def _workload_lines(v: View) -> list[str]:
    """The page's bullets on one workload: its checkpoint and the bytes a decode step reads."""
    ck = v["checkpoint"]
    shards = f"{ck['shards']} safetensors shard" + ("s" if ck["shards"] != 1 else "")
    if v["workload"] == "bench":
        what = (
            f"`{ck['architecture']}` built by transformers from the plugin's bundled `bench` config with random "
            f"weights (seed 0): {ck['num_parameters'] / 1e6:.1f} M parameters, float32, a {_mb(ck['bytes'])} "
            f"checkpoint in {shards}."
        )
    else:
        what = (
            f"`{ck['architecture']}` with {ck['source']}'s real trained weights, the checkpoint "
            "`trnmodels real-weights` builds from a package on the index (`trnmodels.core.real_weights`): "
            f"{ck['num_parameters'] / 1e6:.1f} M parameters, float32, a {_mb(ck['bytes'])} checkpoint in {shards}."
        )
    ex = ck.get("experts")
    chosen = (
        f", but of the {_mb(ex['expert_bytes'])} of expert weights only the {ex['experts_per_token']} of "
        f"{ex['num_experts']} experts per layer a token chooses"
        if ex
        else ""
    )
    rounds = v.get("bandwidth_in_rounds")
    where = (
        f" (the copy, the median of its {rounds} measurements between the throughput rounds)"
        if rounds
        else ""
    )
    roof = (
        f"A decode step at batch 1 reads {_mb(step_bytes(v))} of weights (every parameter but the embedding "
        f"tables it only looks up, of which it reads one row per token{chosen}), so the batch-1 roofline is "
        f"{v['bandwidth_bytes_per_s'] / GB:.1f} GB/s{where} ÷ {_mb(step_bytes(v))} = {roofline(v):.1f} tok/s."
    )
    read = v.get("read_bandwidth_bytes_per_s")
    if read:
        ours = v["throughput"]["ours_compiled"]["decode_b1"]
        roof += (
            f" A step only reads its weights, and a stream that only reads ran at {read / GB:.1f} GB/s "
            f"here (the copy: {v['bandwidth_bytes_per_s'] / GB:.1f}): against a roofline at that "
            f"bandwidth ({read / step_bytes(v):.1f} tok/s) our compiled batch-1 decode "
            f"({ours:.1f} tok/s, {ours * step_bytes(v) / GB:.1f} GB/s of weights) is at "
            f"{ours * step_bytes(v) / read:.0%}. The target is set against the copy."
        )
    return [what, roof]


def _tp_ranks(vs: Sequence[View]) -> str:
    """How the loading section names its TP>1 measurement."""
    degrees = {v["loading"]["tp"] for v in vs}
    if degrees == {2}:
        return "at TP=2 two gloo ranks"
    per = ", ".join(f"TP={v['loading']['tp']} for {workload_label(v)}" for v in vs)
    return f"at TP>1 ({per}: the smallest degree that splits the attention heads) that many gloo ranks"


def markdown(r: Results, chart: str | None = None) -> str:
    m, s, rc = r["machine"], r["settings"], r["runner"]
    vs = views(r)
    model = r["model"]
    several = len(vs) > 1
    busy = m["other_processes_cores"] / m["cores"]
    caution = (
        f"**Caution:** other processes used {busy:.0%} of this machine's CPU during the run, so the absolute "
        "figures (and, where the competition varied, the ratios) are perturbed; rerun on a quiet machine."
    )
    runner = (
        f"Runner: max_num_seqs={rc['max_num_seqs']}, max_model_len={rc['max_model_len']}, "
        f"block_size={rc['block_size']}, buckets: tokens {rc['num_batched_tokens_buckets']}, "
        f"batch {rc['num_seqs_buckets']}, context {rc['context_len_buckets']}."
    )
    if several:
        workload_section = [
            "## Model and workloads",
            "Two workloads, the same measurements; every table below has the rows of each. The second is the "
            "plugin's real checkpoint, which a plugin has when `trnmodels.core.real_weights` converts a trained "
            "model of its architecture (`REAL_WEIGHTS` in `benchmarks/llm/run.py`): its many narrow layers "
            "put a different balance of per-op dispatch and weight bandwidth in a decode step than the bench "
            "config's few wide ones.",
            "\n".join(f"- {workload_label(v)}: " + "\n  ".join(_workload_lines(v)) for v in vs)
            + f"\n- {runner}",
        ]
    else:
        what, roof = _workload_lines(vs[0])
        workload_section = ["## Model and workload", f"- {what}\n- {runner}\n- {roof}"]
    parts = [
        f"# Benchmark: {model}",
        *([caution] if busy > 0.1 else []),
        f"Generated by `python -m benchmarks.llm {model}` (nox session `bench-{model}`) on {r['date']}. "
        f"Every figure comes from that one run; the raw figures are in [{model}.json]({model}.json). "
        "Do not edit this page: rerun the session.",
        "## Machine",
        f"- CPU: {m['cpu']}, {m['cores']} cores (torch uses {m['torch_threads']} threads), "
        f"{m['memory_bytes'] / 2**30:.1f} GiB RAM; {m['platform']}\n"
        f"- Python {m['python']}, torch {m['torch']}, transformers {m['transformers']}, "
        f"safetensors {m['safetensors']}\n"
        f"- Other processes used {m['other_processes_cores']:.2f} of the {m['cores']} cores on average "
        f"during the {m['run_seconds'] / 60:.1f}-minute run (machine CPU time from /proc/stat minus the "
        f"run's own); load average (1/5/15 min) {_loads(m['load_average_start'])} at the start, "
        f"{_loads(m['load_average_end'])} at the end. Figures that are compared take turns within every "
        "repeat, so such competition hits both sides of a ratio alike.\n"
        f"- Memory bandwidth, measured at the start of this run: {r['bandwidth_bytes_per_s'] / GB:.1f} GB/s "
        f"(`dst.copy_(src)` of {s['bandwidth_bytes'] / 2**30:.0f} GiB float32, bytes read + written, best of 5)"
        + (
            f"; read only: {r['read_bandwidth_bytes_per_s'] / GB:.1f} GB/s (`src.sum()` of the same, bytes "
            "read, best of 5)"
            if r.get("read_bandwidth_bytes_per_s")
            else ""
        )
        + (
            "; a roofline uses the same streams measured between its workload's throughput rounds (below)"
            if any("bandwidth_in_rounds" in w for w in r["workloads"])
            else ""
        ),
        *workload_section,
        "## Targets",
        targets_table(r),
    ]
    if chart:
        parts.append(f"![throughput and loading, {model}]({chart})")
    cached = (
        "The shards were just written, so they are in the page cache"
        if not several
        else "The bench shards were just written and the real checkpoint is read once before its rounds, so "
        "both are in the page cache"
    )
    baselines = " and ".join(_mb(v["loading"]["ours_tp1"]["baseline_rss"]) for v in vs)
    parts += [
        "## Weight loading",
        f"Each measurement runs in a fresh process; figures are medians over {vs[0]['loading']['repeats']} "
        "processes. Ours builds the model with `build_model(..., load=False)` and times only "
        f"`model.load_weights`; {_tp_ranks(vs)} (`run_on_ranks`, one thread each) load at the same "
        "time and each reports its own time, bytes (its shard) and peak RSS. The plain read is "
        '`safetensors.torch.load_file(shard, backend="pread")` of every shard (the default mmap backend reads '
        f"nothing until a tensor is touched). {cached}: "
        "this measures loading from memory, not from disk. Peak RSS is `VmHWM`, reset just before the "
        "measured block; *added* is that peak minus the RSS at the start of the block, after the imports "
        f"(Python, torch, transformers and the plugin: {baselines} here, the same for any "
        "model size). The RSS targets use *added*. The split into anonymous and file-backed pages is sampled "
        "every 2 ms.",
        loading_table(r),
        "## Throughput",
        "All three systems run the same prompts on the same weights in float32. Prefill: one prompt of "
        f"{s['prefill_len']} tokens, generating 1 token; tok/s = prompt tokens ÷ time. Decode: tok/s = batch × "
        f"{s['new_tokens'] - 1} ÷ (time to generate {s['new_tokens']} tokens − time to generate 1), so the "
        f"prefill is excluded. Batch-1 prompts have {s['decode_prompt_len']} tokens; the batch-{s['batch']} "
        f"prompts have {s['decode_prompt_len']} down to {s['decode_prompt_len'] - 2 * (s['batch'] - 1)} "
        "tokens (HF left-pads them). Ours: `Runner.generate` with `ignore_eos`, eager or with the AOTInductor "
        "graphs from `compile_all` + `load_compiled_graphs`; every decode step runs at the context bucket "
        f"{rc['context_len_buckets'][-1]} (static shapes). HF: `AutoModelForCausalLM.from_pretrained` + "
        "greedy `generate` with `min_new_tokens = max_new_tokens`. One warm-up, then the median of "
        f"{s['repeats']} timings.",
        throughput_table(r),
        *(part for v in vs for part in moe_section(v)),
        "## Compile time",
        compile_table(r),
    ]
    missed = [(v, t) for v in vs for t in targets(v) if not t.met]
    if missed:
        parts.append("## Why targets were missed")
        for v, t in missed:
            where = f"{workload_label(v)}: " if several else ""
            parts += [
                f"### {where}{t.name}: {t.show(t.value)}, required {t.op} {t.show(t.threshold)}",
                EXPLANATIONS[t.key](v),
            ]
    return "\n\n".join(parts) + "\n"


def summary(r: Results) -> str:
    """What the command prints: every table."""
    return "\n\n".join([targets_table(r), loading_table(r), throughput_table(r), compile_table(r)]) + "\n"


def _chart_panels(axes: Any, r: View, prefix: str) -> None:
    """One workload's four panels: prefill, decode at batch 1 (with the roofline) and at the batch, loading."""
    colors = ["#8fb3d9", "#1f5fa8", "#e08a3c"]
    t, load = r["throughput"], r["loading"]
    panels = [("prefill", f"prefill, {r['settings']['prefill_len']}-token prompt")]
    panels += [(k, f"decode, batch {k.removeprefix('decode_b')}") for k in decode_keys(r)]
    for ax, (key, title) in zip(axes.flat, panels, strict=False):
        values = [t[s][key] for s, _ in SYSTEMS]
        ax.bar_label(ax.bar([label for _, label in SYSTEMS], values, color=colors), fmt="%.1f")
        top = max(values)
        if key == "decode_b1":
            ax.axhline(roofline(r), color="gray", linestyle="--")
            ax.annotate(f"roofline {roofline(r):.1f}", (0, roofline(r)), xytext=(-0.35, roofline(r) * 1.02))
            top = max(top, roofline(r))
        ax.set_ylim(0, top * 1.15)
        ax.set_title(prefix + title)
        ax.set_ylabel("tokens/s")
    ax = axes.flat[3]
    tp = load["tp"]
    labels = ["plain read\nTP=1", "ours\nTP=1", *(f"ours TP={tp}\nrank {s['rank']}" for s in load["ours_tp"])]
    values = [gbps(load["plain"]), gbps(load["ours_tp1"]), *(gbps(s) for s in load["ours_tp"])]
    bars = ax.bar(labels, values, color=["#e08a3c", "#1f5fa8", *["#8fb3d9"] * len(load["ours_tp"])])
    ax.bar_label(bars, fmt="%.2f")
    ax.set_ylim(0, max(values) * 1.15)
    ax.set_title(f"{prefix}weight loading (per rank at TP={tp})")
    ax.set_ylabel("GB/s")


def write_chart(r: Results, path: Path) -> None:
    """A 2×2 grid of panels per workload, one grid under the other."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    vs = views(r)
    fig, axes = plt.subplots(2 * len(vs), 2, figsize=(11, 7.5 * len(vs)))
    for i, v in enumerate(vs):
        prefix = "" if len(vs) == 1 else f"{workload_label(v)}: "
        _chart_panels(axes[2 * i : 2 * i + 2], v, prefix)
    m = r["machine"]
    sizes = ", ".join(f"{v['checkpoint']['num_parameters'] / 1e6:.0f} M" for v in vs)
    fig.suptitle(
        f"{r['model']}: {sizes} parameters, float32 — {m['cpu']}, {m['cores']} cores, torch {m['torch']}"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_report(r: Results, out_dir: str | Path) -> list[Path]:
    """``<model>.json``, ``<model>.png`` and ``<model>.md`` in ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model = r["model"]
    paths = [out / f"{model}.json", out / f"{model}.png", out / f"{model}.md"]
    paths[0].write_text(json.dumps(r, indent=2) + "\n")
    write_chart(r, paths[1])
    paths[2].write_text(markdown(r, chart=paths[1].name))
    return paths
