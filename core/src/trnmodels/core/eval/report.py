"""The L1 comparison page: lm_eval's own ``hf`` model in FP32 against ours FP32, BF16, compiled and TP>1.

    python -m trnmodels.core.eval.report llama3 --out-dir docs/benchmarks   # what `nox -s eval-llama3` runs

Every configuration runs the shipped tasks (``L1_TASKS``) through ``lm_eval.simple_evaluate`` with the
same ``max_length``, so the same prompts and the same rolling windows are scored. Writes
``eval-<model>.md`` and ``.json`` and exits 1 if the pass rule fails:

- every FP32 configuration of ours (eager, compiled, TP): each accuracy task within 1 question of HF
  FP32, and the docstring perplexity within 1e-4 relative of HF's;
- BF16: perplexity within 2% relative of HF FP32's;
- compiled: the runner actually ran compiled graphs.

The TP configuration uses TP=2 when the model's attention heads split over two ranks, else the smallest
degree that splits them (SmolLM2-135M has 9 query and 3 KV heads: TP=3, three ranks on the cores there are).
``--render eval-<model>.json`` rewrites the page from a saved JSON without running anything.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import L1_TASKS, TASKS_DIR, register

FP32_QUESTIONS = 1
FP32_PPL_RTOL = 1e-4
BF16_PPL_RTOL = 0.02
ACC_TASKS = {"trnmodels_facts": "acc", "trnmodels_facts_gen": "exact_match"}
PPL_TASK, PPL_METRIC = "trnmodels_pydoc_ppl", "word_perplexity"

# The runner settings of every configuration of ours, and the `trnmodels compile` flags that match them.
# Two graphs (one prefill bucket, one decode bucket): a compile costs minutes per graph on two cores.
RUNNER_ARGS = {
    "max_model_len": 256,
    "max_num_seqs": 8,
    "num_batched_tokens_buckets": "256",
    "num_seqs_buckets": "8",
    "context_len_buckets": "256",
}


def compile_flags(dtype: str = "float32", tp: int = 1) -> list[str]:
    return [
        "--max-model-len",
        str(RUNNER_ARGS["max_model_len"]),
        "--max-num-seqs",
        str(RUNNER_ARGS["max_num_seqs"]),
        "--num-batched-tokens-buckets",
        RUNNER_ARGS["num_batched_tokens_buckets"].replace(":", ","),
        "--num-seqs-buckets",
        RUNNER_ARGS["num_seqs_buckets"].replace(":", ","),
        "--context-len-buckets",
        RUNNER_ARGS["context_len_buckets"].replace(":", ","),
        "--dtype",
        dtype,
        "--tp",
        str(tp),
    ]


@dataclass(frozen=True)
class Config:
    name: str
    label: str
    model: str  # lm_eval model name
    args: dict[str, Any]
    fp32: bool = True
    compiled: bool = False


def tp_degree(checkpoint: str) -> int:
    """2 if the attention heads split over two ranks, else the smallest degree up to 8 that splits them
    (KV heads split too, or are replicated: the degree a multiple of their count)."""
    from ..hf_config import read_config_dict

    raw = read_config_dict(checkpoint)
    raw = raw.get("text_config", raw)
    heads = raw.get("num_attention_heads", 2)
    kv = raw.get("num_key_value_heads") or heads
    for tp in range(2, 9):
        if heads % tp == 0 and (kv % tp == 0 or tp % kv == 0):
            return tp
    return 2


def configs(checkpoint: str, batch_size: int, tp: int = 2) -> list[Config]:
    ours = {"pretrained": checkpoint, **RUNNER_ARGS}
    return [
        Config(
            "hf_fp32",
            "HF FP32 (lm_eval `hf`)",
            "hf",
            {
                "pretrained": checkpoint,
                "dtype": "float32",
                "device": "cpu",
                "max_length": RUNNER_ARGS["max_model_len"],
                "batch_size": batch_size,
            },
        ),
        Config("ours_fp32", "ours FP32 (eager)", "trnmodels", {**ours, "dtype": "float32", "eager": True}),
        Config(
            "ours_compiled",
            "ours FP32 compiled",
            "trnmodels",
            {**ours, "dtype": "float32", "eager": False},
            compiled=True,
        ),
        Config(
            "ours_tp",
            f"ours FP32 TP={tp}",
            "trnmodels",
            {**ours, "dtype": "float32", "eager": True, "tp": tp},
        ),
        Config(
            "ours_bf16", "ours BF16 (eager)", "trnmodels", {**ours, "dtype": "bfloat16", "eager": True}, False
        ),
    ]


@dataclass
class Outcome:
    config: Config
    seconds: float
    metrics: dict[str, dict[str, float]]  # task -> metric -> value
    answers: dict[str, list[Any]]  # accuracy task -> per-question answer (chosen index or generated text)
    counts: dict[str, int]  # accuracy task -> questions right
    n_docs: dict[str, int]
    runner: dict[str, Any] = field(default_factory=dict)


def _answers(samples: list[dict[str, Any]], task: str) -> tuple[list[Any], int]:
    samples = sorted(samples, key=lambda s: s["doc_id"])
    metric = ACC_TASKS[task]
    right = sum(round(s[metric]) for s in samples)
    if task == "trnmodels_facts":
        answers = [
            max(range(len(s["filtered_resps"])), key=lambda i: s["filtered_resps"][i][0]) for s in samples
        ]
    else:
        answers = [s["filtered_resps"][0] for s in samples]
    return answers, right


def run_config(config: Config, limit: int | None = None) -> Outcome:
    import lm_eval
    from lm_eval.api.registry import get_model
    from lm_eval.tasks import TaskManager

    register()
    start = time.perf_counter()
    lm = get_model(config.model).create_from_arg_obj(dict(config.args))
    try:
        out = lm_eval.simple_evaluate(
            model=lm,
            tasks=list(L1_TASKS),
            task_manager=TaskManager(include_path=str(TASKS_DIR), include_defaults=False),
            limit=limit,
            log_samples=True,
            random_seed=0,
            numpy_random_seed=0,
            torch_random_seed=0,
            fewshot_random_seed=0,
        )
        runner = lm.runner_info() if hasattr(lm, "runner_info") else {}
    finally:
        if hasattr(lm, "close"):
            lm.close()
    seconds = time.perf_counter() - start
    metrics = {
        task: {
            k.split(",")[0]: v for k, v in values.items() if isinstance(v, int | float) and "_stderr" not in k
        }
        for task, values in out["results"].items()
    }
    answers, counts = {}, {}
    for task in ACC_TASKS:
        answers[task], counts[task] = _answers(out["samples"][task], task)
    n_docs = {task: len(out["samples"][task]) for task in L1_TASKS}
    return Outcome(config, seconds, metrics, answers, counts, n_docs, runner)


def compile_graphs(checkpoint: str, cache_dir: str | None) -> tuple[float, str]:
    cmd = ["trnmodels", "compile", checkpoint, *compile_flags(), "--jobs", "2"]
    if cache_dir:
        cmd += ["--cache-dir", cache_dir]
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "trnmodels.core.cli", *cmd[1:]], check=True)
    return time.perf_counter() - start, " ".join(cmd)


def judge(outcomes: dict[str, Outcome]) -> list[dict[str, Any]]:
    """One row per rule: ``{"config", "rule", "value", "limit", "passed"}``."""
    hf = outcomes["hf_fp32"]
    rules = []
    hf_ppl = hf.metrics[PPL_TASK][PPL_METRIC]
    for name, o in outcomes.items():
        if name == "hf_fp32":
            continue
        rel = abs(o.metrics[PPL_TASK][PPL_METRIC] - hf_ppl) / hf_ppl
        if o.config.fp32:
            for task in ACC_TASKS:
                diff = abs(o.counts[task] - hf.counts[task])
                rules.append(
                    dict(config=name, rule=f"{task}: |questions right − HF's|", value=diff, limit=FP32_QUESTIONS,
                         passed=diff <= FP32_QUESTIONS)
                )  # fmt: skip
            rules.append(
                dict(config=name, rule=f"{PPL_TASK} {PPL_METRIC}: relative difference", value=rel,
                     limit=FP32_PPL_RTOL, passed=rel <= FP32_PPL_RTOL)
            )  # fmt: skip
        else:
            rules.append(
                dict(config=name, rule=f"{PPL_TASK} {PPL_METRIC}: relative difference", value=rel,
                     limit=BF16_PPL_RTOL, passed=rel <= BF16_PPL_RTOL)
            )  # fmt: skip
        if o.config.compiled:
            steps = o.runner.get("graph_steps", 0)
            rules.append(
                dict(config=name, rule="runner steps that ran a compiled graph", value=steps, limit="> 0",
                     passed=steps > 0)
            )  # fmt: skip
    return rules


def machine() -> dict[str, Any]:
    import lm_eval
    import torch
    import transformers

    cpuinfo = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").is_file() else ""
    cpu = next(
        (line.split(":", 1)[1].strip() for line in cpuinfo.splitlines() if line.startswith("model name")),
        platform.processor() or "unknown",
    )
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "lm_eval": lm_eval.__version__,
        "platform": platform.platform(),
        # Other processes may share the cores: the 1, 5 and 15 minute load averages at the start.
        "load_average_start": os.getloadavg(),
    }


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1e-2 and value != 0 else f"{value:.6g}"
    return str(value)


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def render(data: dict[str, Any]) -> str:
    outcomes = data["configs"]
    names = list(outcomes)
    hf = outcomes["hf_fp32"]
    n_facts = hf["n_docs"]["trnmodels_facts"]
    lines = [
        f"# L1 task accuracy: {data['model']} ({Path(data['checkpoint']).name})",
        "",
        "Generated by `nox -s eval-" + data["model"] + "` (`python -m trnmodels.core.eval.report "
        f"{data['model']}`); do not edit by hand. {'**PASS**' if data['passed'] else '**FAIL**'}.",
        "",
        "lm-evaluation-harness runs the project's offline tasks (`core/src/trnmodels/core/eval/tasks/`) on "
        f"lm_eval's own `hf` model in FP32 and on the `trnmodels` model in {len(names) - 1} configurations, with the "
        f"same `max_length={data['runner_args']['max_model_len']}` (so the same prompts and rolling windows):",
        "",
        f"- `trnmodels_facts`: {n_facts} four-choice general-knowledge questions written by the project, "
        "zero-shot, choice by loglikelihood (`acc`; `acc_norm` normalises by length);",
        "- `trnmodels_facts_gen`: the same questions answered by greedy generation until a newline (one fixed "
        "worked example first), exact match ignoring case, punctuation and a leading article;",
        f"- `trnmodels_pydoc_ppl`: `loglikelihood_rolling` over {hf['n_docs'][PPL_TASK]} Python "
        f"{data['machine']['python']} standard-library module docstrings read at run time "
        "(word perplexity; byte perplexity and bits per byte beside it).",
        "",
        "## Results"
        + (f" (smoke run: --limit {data['limit']} documents per task)" if data.get("limit") else ""),
        "",
    ]
    if data.get("errors"):
        lines += [f"- **{name} failed**: `{error}`" for name, error in data["errors"].items()] + [""]
    header = ["", *(outcomes[n]["label"] for n in names)]
    rows = [
        [f"facts acc ({n_facts} q)"]
        + [f"{o['metrics']['trnmodels_facts']['acc']:.4f} ({o['counts']['trnmodels_facts']})" for o in outcomes.values()],
        ["facts acc_norm"] + [f"{o['metrics']['trnmodels_facts']['acc_norm']:.4f}" for o in outcomes.values()],
        ["facts answers ≠ HF's"] + [str(o["answer_diffs"]["trnmodels_facts"]) for o in outcomes.values()],
        ["facts_gen exact match"]
        + [
            f"{o['metrics']['trnmodels_facts_gen']['exact_match']:.4f} ({o['counts']['trnmodels_facts_gen']})"
            for o in outcomes.values()
        ],
        ["facts_gen generations ≠ HF's"] + [str(o["answer_diffs"]["trnmodels_facts_gen"]) for o in outcomes.values()],
        ["pydoc word perplexity"] + [f"{o['metrics'][PPL_TASK]['word_perplexity']:.6f}" for o in outcomes.values()],
        ["pydoc byte perplexity"] + [f"{o['metrics'][PPL_TASK]['byte_perplexity']:.6f}" for o in outcomes.values()],
        ["pydoc bits per byte"] + [f"{o['metrics'][PPL_TASK]['bits_per_byte']:.6f}" for o in outcomes.values()],
        ["word ppl rel. diff vs HF"]
        + [
            _fmt(abs(o["metrics"][PPL_TASK][PPL_METRIC] - hf["metrics"][PPL_TASK][PPL_METRIC]) / hf["metrics"][PPL_TASK][PPL_METRIC])
            for o in outcomes.values()
        ],
        ["compiled graphs loaded / steps on them"]
        + [
            f"{o['runner'].get('compiled_graphs', '–')} / {o['runner'].get('graph_steps', '–')}" if o["runner"] else "–"
            for o in outcomes.values()
        ],
        ["wall time (s)"] + [f"{o['seconds']:.0f}" for o in outcomes.values()],
    ]  # fmt: skip
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    lines += [
        "",
        "## Pass rule",
        "",
        f"Ours in FP32 (eager, compiled, TP): each accuracy task within {FP32_QUESTIONS} question of HF FP32 "
        f"and word perplexity within {FP32_PPL_RTOL:g} relative; BF16: word perplexity within "
        f"{BF16_PPL_RTOL:.0%} relative; the compiled configuration ran compiled graphs.",
        "",
        "| config | rule | value | limit | |",
        "|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['config']} | {_cell(r['rule'])} | {_fmt(r['value'])} | {r['limit']} | {'pass' if r['passed'] else '**FAIL**'} |"
        for r in data["rules"]
    ]
    m = data["machine"]
    lines += [
        "",
        "## How it ran",
        "",
        f"- Ours: `--model trnmodels --model_args pretrained=CKPT,{','.join(f'{k}={v}' for k, v in data['runner_args'].items())}"
        ",dtype=...,eager=...,tp=...`. Loglikelihood and rolling loglikelihood run as packed eager prefills "
        "over the paged KV cache in every configuration (the compiled graphs return sampled token ids, not "
        "logits); the compiled configuration differs in generation, which runs the compiled prefill and "
        "decode graphs.",
        f"- Compiled graphs: `{data['compile']['command']}` ({data['compile']['seconds']:.0f} s, "
        "before the compiled configuration; the cache key covers core's source, so every source change "
        "compiles anew).",
        *(
            [
                f"- TP: `tp={outcomes['ours_tp']['args']['tp']}`, the smallest degree ≥ 2 that splits the model's "
                "attention heads across ranks (`report.tp_degree`); its ranks share the machine's cores."
            ]
            if "ours_tp" in outcomes
            else []
        ),
        f"- HF: `--model hf --model_args {','.join(f'{k}={v}' for k, v in outcomes['hf_fp32']['args'].items() if k != 'pretrained')}`.",
        f"- Machine: {m['cpu']}, {m['cores']} cores; Python {m['python']}, torch {m['torch']}, transformers "
        f"{m['transformers']}, lm_eval {m['lm_eval']}; load average at the start {', '.join(f'{x:.1f}' for x in m['load_average_start'])} "
        "(other processes shared the cores).",
        f"- Wall time: {data['seconds']:.0f} s in all ({data['seconds'] / 60:.1f} min), compile included.",
        "",
    ]  # fmt: skip
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m trnmodels.core.eval.report", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "model", help="plugin name (llama3 evaluates the SmolLM2-135M-Instruct real checkpoint)"
    )
    parser.add_argument(
        "--checkpoint", help="checkpoint folder (default for llama3: `trnmodels real-weights`)"
    )
    parser.add_argument("--out-dir", default="docs/benchmarks")
    parser.add_argument("--batch-size", type=int, default=8, help="the hf model's batch size")
    parser.add_argument("--limit", type=int, help="documents per task (a smoke run; the page says so)")
    parser.add_argument("--cache-dir", help="compiled artifacts (default: the artifact cache's)")
    parser.add_argument(
        "--configs", help="comma-separated subset of " + ",".join(c.name for c in configs("", 1))
    )
    parser.add_argument("--render", metavar="JSON", help="only rewrite the page from a saved JSON")
    args = parser.parse_args(argv)
    if args.render:
        data = json.loads(Path(args.render).read_text())
        Path(args.render).with_suffix(".md").write_text(render(data))
        return 0 if data["passed"] else 1

    checkpoint = args.checkpoint
    if checkpoint is None:
        if args.model != "llama3":
            parser.error(f"no real checkpoint ships for {args.model}: pass --checkpoint PATH")
        from ..real_weights import real_checkpoint

        checkpoint = str(real_checkpoint()[0])
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

    wanted = configs(checkpoint, args.batch_size, tp_degree(checkpoint))
    if args.configs:
        keep = set(args.configs.split(",")) | {"hf_fp32"}
        wanted = [c for c in wanted if c.name in keep]
    start = time.perf_counter()
    info = machine()
    outcomes: dict[str, Outcome] = {}
    compile_info = {"command": "(not run)", "seconds": 0.0}
    errors: dict[str, str] = {}
    for config in wanted:
        if config.compiled:
            seconds, command = compile_graphs(checkpoint, args.cache_dir)
            compile_info = {"command": command.replace(checkpoint, "CKPT"), "seconds": seconds}
            if args.cache_dir:
                config.args["cache_dir"] = args.cache_dir
        print(f"== {config.name}: {config.model} {config.args}", flush=True)
        try:
            outcomes[config.name] = run_config(config, args.limit)
        except Exception as e:  # the other configurations still run; the page names the failure
            if config.name == "hf_fp32":
                raise
            errors[config.name] = f"{type(e).__name__}: {e}"
            print(f"== {config.name} failed: {errors[config.name]}", flush=True)
            continue
        print(
            f"== {config.name}: {outcomes[config.name].metrics} ({outcomes[config.name].seconds:.0f} s)",
            flush=True,
        )
    rules = judge(outcomes)
    rules += [
        dict(config=name, rule="the configuration ran", value="failed", limit="ran", passed=False)
        for name in errors
    ]
    hf = outcomes["hf_fp32"]
    data = {
        "model": args.model,
        "checkpoint": checkpoint,
        "limit": args.limit,
        "runner_args": RUNNER_ARGS,
        "machine": info,
        "compile": compile_info,
        "configs": {
            name: {
                "label": o.config.label,
                "model": o.config.model,
                "args": {k: v for k, v in o.config.args.items() if k != "pretrained"},
                "seconds": o.seconds,
                "metrics": o.metrics,
                "counts": o.counts,
                "n_docs": o.n_docs,
                "answer_diffs": {
                    task: sum(a != b for a, b in zip(o.answers[task], hf.answers[task], strict=True))
                    for task in ACC_TASKS
                },
                "runner": o.runner,
            }
            for name, o in outcomes.items()
        },
        "rules": rules,
        "errors": errors,
        "passed": all(r["passed"] for r in rules),
        "seconds": time.perf_counter() - start,
    }
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = out_dir / f"eval-{args.model}"
    stem.with_suffix(".json").write_text(json.dumps(data, indent=2, default=str) + "\n")
    page = render(data)
    stem.with_suffix(".md").write_text(page)
    print(page)
    print(f"wrote {stem}.md and {stem}.json: {'PASS' if data['passed'] else 'FAIL'}")
    return 0 if data["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
