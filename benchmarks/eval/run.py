"""The measuring half of the ``eval-<model>`` page: every configuration through lm_eval, then the pass rule.

``evaluate`` returns the JSON-ready dict that ``page.render`` turns into the page (and the page's JSON holds).
"""

from __future__ import annotations

import subprocess
import sys
import time
from typing import Any

from trnmodels.core.eval.run import (
    ACC_TASKS,
    BF16_PPL_RTOL,
    FP32_PPL_RTOL,
    FP32_QUESTIONS,
    PPL_METRIC,
    PPL_TASK,
    RUNNER_ARGS,
    Config,
    Outcome,
    run_config,
)

from ..machine import machine_info
from ..parallelism import tp_degree


def compile_flags(dtype: str = "float32", tp: int = 1) -> list[str]:
    """The ``trnmodels compile`` flags that match ``RUNNER_ARGS``."""
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


def evaluate(
    model: str,
    checkpoint: str,
    *,
    batch_size: int = 8,
    limit: int | None = None,
    cache_dir: str | None = None,
    only: set[str] | None = None,
) -> dict[str, Any]:
    """Every configuration (``only``: a subset; HF FP32 always runs, it is the reference) on ``checkpoint``,
    judged by the pass rule. A configuration of ours that fails is recorded and fails the rule; the others
    still run."""
    wanted = configs(checkpoint, batch_size, tp_degree(checkpoint))
    if only:
        wanted = [c for c in wanted if c.name in only | {"hf_fp32"}]
    start = time.perf_counter()
    info = machine_info(("torch", "transformers", "lm_eval"))
    outcomes: dict[str, Outcome] = {}
    compile_info = {"command": "(not run)", "seconds": 0.0}
    errors: dict[str, str] = {}
    for config in wanted:
        if config.compiled:
            seconds, command = compile_graphs(checkpoint, cache_dir)
            compile_info = {"command": command.replace(checkpoint, "CKPT"), "seconds": seconds}
            if cache_dir:
                config.args["cache_dir"] = cache_dir
        print(f"== {config.name}: {config.model} {config.args}", flush=True)
        try:
            outcomes[config.name] = run_config(config, limit)
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
    return {
        "model": model,
        "checkpoint": checkpoint,
        "limit": limit,
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
