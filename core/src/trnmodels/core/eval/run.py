"""One lm_eval run of one model configuration over the shipped L1 tasks, and the L1 pass rule's limits.

``run_config`` is what ``trnmodels validate``'s L1 level (:mod:`trnmodels.core.accuracy.tasks`) and the
``eval-<model>`` page (``benchmarks/eval``) both run: ``lm_eval.simple_evaluate`` with fixed seeds and the
same ``max_length`` for every configuration, so the same prompts and rolling windows are scored.

The pass rule: ours in FP32 within ``FP32_QUESTIONS`` question of HF FP32 on each accuracy task and within
``FP32_PPL_RTOL`` relative on word perplexity; BF16 within ``BF16_PPL_RTOL`` relative on word perplexity.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from . import L1_TASKS, TASKS_DIR, register

FP32_QUESTIONS = 1
FP32_PPL_RTOL = 1e-4
BF16_PPL_RTOL = 0.02
ACC_TASKS = {"trnmodels_facts": "acc", "trnmodels_facts_gen": "exact_match"}
PPL_TASK, PPL_METRIC = "trnmodels_pydoc_ppl", "word_perplexity"

# The runner settings of every configuration of ours. Two graphs (one prefill bucket, one decode
# bucket): a compile costs minutes per graph on two cores.
RUNNER_ARGS = {
    "max_model_len": 256,
    "max_num_seqs": 8,
    "num_batched_tokens_buckets": "256",
    "num_seqs_buckets": "8",
    "context_len_buckets": "256",
}


@dataclass(frozen=True)
class Config:
    name: str
    label: str
    model: str  # lm_eval model name
    args: dict[str, Any]
    fp32: bool = True
    compiled: bool = False


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
    """The L1 tasks on ``config`` (``limit``: documents per task, for a smoke run)."""
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
