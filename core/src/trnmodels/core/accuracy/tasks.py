"""Level 1 of the validation guide: task accuracy through lm-evaluation-harness, beside L2 (logits) and
L3 (modules).

``task_accuracy(checkpoint)`` runs the project's offline tasks (``trnmodels.core.eval.L1_TASKS``) with
lm_eval's ``simple_evaluate`` on the ``trnmodels`` model and, unless ``reference=False``, on lm_eval's own
``hf`` model in FP32 with the same ``max_length``; the report judges ours against HF by the L1 pass rule
(FP32: each accuracy task within one question, perplexity within 1e-4 relative; BF16: perplexity within
2% relative). Needs the ``eval`` dependency group (lm-eval).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class TaskReport:
    checkpoint: str
    dtype: str
    tp: int
    limit: int | None
    ours: dict[str, dict[str, float]]  # task -> metric -> value
    reference: dict[str, dict[str, float]] | None  # HF FP32, same layout
    rules: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def passed(self) -> bool:
        return all(r["passed"] for r in self.rules)

    def format(self) -> str:
        lines = [
            f"L1 task accuracy of {self.checkpoint} (ours {self.dtype}, tp={self.tp}"
            + (f", {self.limit} documents per task" if self.limit else "")
            + f"; {self.seconds:.0f} s):"
        ]
        for task, metrics in self.ours.items():
            for metric, value in metrics.items():
                if metric == "sample_len":
                    continue
                ref = "" if self.reference is None else f"   HF FP32 {self.reference[task][metric]:.6g}"
                lines.append(f"  {task} {metric}: ours {value:.6g}{ref}")
        for r in self.rules:
            lines.append(
                f"  {'pass' if r['passed'] else 'FAIL'}: {r['rule']} = {r['value']:.3g} (limit {r['limit']})"
            )
        return "\n".join(lines)


def task_accuracy(
    checkpoint: str | Path,
    *,
    tp: int = 1,
    dtype: str = "float32",
    eager: bool = True,
    limit: int | None = None,
    reference: bool = True,
    model_args: dict[str, Any] | None = None,
) -> TaskReport:
    """Run the shipped L1 tasks on ours (and on HF FP32 unless ``reference=False``) and judge them.

    ``model_args`` override the runner settings of ``trnmodels.core.eval.run.RUNNER_ARGS``
    (``max_model_len`` is also given to HF, so both score the same windows).
    """
    import time

    from ..eval.run import (
        ACC_TASKS,
        BF16_PPL_RTOL,
        FP32_PPL_RTOL,
        FP32_QUESTIONS,
        PPL_METRIC,
        PPL_TASK,
        RUNNER_ARGS,
        Config,
        run_config,
    )

    start = time.perf_counter()
    runner_args = {**RUNNER_ARGS, **(model_args or {})}
    ours_config = Config(
        "ours",
        "ours",
        "trnmodels",
        {"pretrained": str(checkpoint), **runner_args, "dtype": dtype, "eager": eager, "tp": tp},
        fp32=dtype == "float32",
    )
    ours = run_config(ours_config, limit)
    ref = None
    rules: list[dict[str, Any]] = []
    if reference:
        hf_args = {
            "pretrained": str(checkpoint),
            "dtype": "float32",
            "device": "cpu",
            "max_length": runner_args["max_model_len"],
            "batch_size": 8,
        }
        ref = run_config(Config("hf_fp32", "HF FP32", "hf", hf_args), limit)
        hf_ppl = ref.metrics[PPL_TASK][PPL_METRIC]
        rel = abs(ours.metrics[PPL_TASK][PPL_METRIC] - hf_ppl) / hf_ppl
        if ours_config.fp32:
            for task in ACC_TASKS:
                diff = abs(ours.counts[task] - ref.counts[task])
                rules.append(
                    {"rule": f"{task}: |questions right − HF's|", "value": diff, "limit": FP32_QUESTIONS,
                     "passed": diff <= FP32_QUESTIONS}
                )  # fmt: skip
        limit_rel = FP32_PPL_RTOL if ours_config.fp32 else BF16_PPL_RTOL
        rules.append(
            {"rule": f"{PPL_TASK} {PPL_METRIC}: relative difference", "value": rel, "limit": limit_rel,
             "passed": rel <= limit_rel}
        )  # fmt: skip
    return TaskReport(
        checkpoint=str(checkpoint),
        dtype=dtype,
        tp=tp,
        limit=limit,
        ours=ours.metrics,
        reference=None if ref is None else ref.metrics,
        rules=rules,
        seconds=time.perf_counter() - start,
    )
