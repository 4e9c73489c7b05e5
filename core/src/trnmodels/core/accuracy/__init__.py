"""Accuracy harness: judge our outputs against a Hugging Face reference.

- :mod:`.three_way`: tensor-level check of our error against the error BF16 alone causes.
- :mod:`.logits`: teacher-forced per-position logit comparison (divergences, top-k tolerance tiers).
- :mod:`.kv`: per-layer cosine similarity of the KV cache.
- :mod:`.modules`: load an HF module's weights into ours through our loaders, for module tests.
- :mod:`.validate`: the whole-model report (FP32 logits, BF16 three-way, KV cosine) against HF.
- :mod:`.tasks`: L1, task accuracy through lm-evaluation-harness against lm_eval's ``hf`` model
  (``task_accuracy``; needs the ``eval`` dependency group).
"""

from .kv import KVCache, assert_kv_close, cosine_similarity, hf_kv_cache, kv_cache_similarity
from .logits import (
    DEFAULT_TOPK_TOLERANCES,
    LogitReport,
    PositionReport,
    bf16_ulp,
    compare_teacher_forced_logits,
    greedy_teacher_sequence,
    hf_logits,
    hf_logits_stepwise,
)
from .modules import assert_module_bf16_three_way, load_from_hf_module
from .tasks import TaskReport, task_accuracy
from .three_way import (
    ThreeWayReport,
    assert_close_three_way,
    bhattacharyya,
    compare_three_way,
    distinct_rows,
)
from .validate import ValidationReport, validate_checkpoint

__all__ = [
    "DEFAULT_TOPK_TOLERANCES",
    "KVCache",
    "LogitReport",
    "PositionReport",
    "TaskReport",
    "ThreeWayReport",
    "ValidationReport",
    "assert_close_three_way",
    "assert_kv_close",
    "assert_module_bf16_three_way",
    "bf16_ulp",
    "bhattacharyya",
    "compare_teacher_forced_logits",
    "compare_three_way",
    "cosine_similarity",
    "distinct_rows",
    "greedy_teacher_sequence",
    "hf_kv_cache",
    "hf_logits",
    "hf_logits_stepwise",
    "kv_cache_similarity",
    "load_from_hf_module",
    "task_accuracy",
    "validate_checkpoint",
]
