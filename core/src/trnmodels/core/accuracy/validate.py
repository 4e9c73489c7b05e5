"""The whole-model validation report of a causal LM checkpoint against its transformers reference.

Level 2 of the onboarding guide's validation: teacher-forced logits (HF's greedy continuation is fed to
both models), checked three ways:
- FP32: our logits against HF FP32, per position, with a max-abs-error bound;
- BF16: our BF16 logits judged against HF FP32, relative to HF BF16's own error (three-way);
- KV cache: per-layer cosine similarity of our paged cache against HF's cache (at TP=1, where our
  cache holds every KV head).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from ..runner.score import score_checkpoint
from .kv import hf_kv_cache, kv_cache_similarity
from .logits import LogitReport, compare_teacher_forced_logits, greedy_teacher_sequence, hf_logits
from .three_way import ThreeWayReport, compare_three_way

FP32_MAX_ABS_ERROR = 1e-4
KV_MIN_COSINE = 0.99


@dataclass(frozen=True)
class ValidationReport:
    checkpoint: str
    tp: int
    token_ids: list[int]
    prefill_len: int
    fp32: LogitReport
    bf16: ThreeWayReport
    kv_cosine: dict[str, tuple[float, float]] | None

    @property
    def passed(self) -> bool:
        kv_ok = self.kv_cosine is None or min(min(p) for p in self.kv_cosine.values()) >= KV_MIN_COSINE
        return self.fp32.passed and self.bf16.passed and kv_ok

    def format(self) -> str:
        lines = [
            f"validation of {self.checkpoint} (tp={self.tp}, {len(self.token_ids)} tokens: "
            f"prefill {self.prefill_len}, decode {len(self.token_ids) - self.prefill_len})",
            "",
            f"FP32 teacher-forced logits vs HF FP32 (max abs error ≤ {FP32_MAX_ABS_ERROR:g}):",
            self.fp32.format_table(max_rows=12),
            "",
            "BF16 three-way (ours BF16 vs HF FP32, relative to HF BF16):",
            f"  {self.bf16}",
        ]
        if self.kv_cosine is not None:
            worst = min(self.kv_cosine.items(), key=lambda kv: min(kv[1]))
            lines += [
                "",
                f"KV cache cosine vs HF (min {KV_MIN_COSINE}): {len(self.kv_cosine)} layers, "
                f"worst {worst[0]} k={worst[1][0]:.6f} v={worst[1][1]:.6f}",
            ]
        lines += ["", f"RESULT: {'PASS' if self.passed else 'FAIL'}"]
        return "\n".join(lines)


def validate_checkpoint(
    checkpoint_dir: str | Path,
    prompt_ids: Sequence[int],
    num_new_tokens: int,
    *,
    hf_model_class: type | None = None,
    tp: int = 1,
    prefill_len: int | None = None,
) -> ValidationReport:
    """Run the three checks. ``prefill_len`` defaults to the prompt; the continuation runs as decode steps."""
    from transformers import AutoModelForCausalLM

    cls = hf_model_class or AutoModelForCausalLM
    hf32 = cls.from_pretrained(checkpoint_dir, dtype=torch.float32).eval()
    token_ids = greedy_teacher_sequence(hf32, list(prompt_ids), num_new_tokens)
    prefill_len = prefill_len or len(prompt_ids)
    expected = hf_logits(hf32, token_ids)
    hf_kv = hf_kv_cache(hf32, token_ids) if tp == 1 else None
    hf16 = cls.from_pretrained(checkpoint_dir, dtype=torch.bfloat16).eval()
    baseline = hf_logits(hf16, token_ids)
    del hf16

    ours32, our_kv = score_checkpoint(checkpoint_dir, token_ids, prefill_len, tp=tp, return_kv=True)
    ours16 = score_checkpoint(checkpoint_dir, token_ids, prefill_len, tp=tp, dtype="bfloat16")
    kv_cosine = None
    if hf_kv is not None:
        # Our layers are named by module path, HF's by index; both are in model order.
        kv_cosine = kv_cache_similarity(dict(zip(hf_kv, our_kv.values(), strict=True)), hf_kv)
    return ValidationReport(
        checkpoint=str(checkpoint_dir),
        tp=tp,
        token_ids=token_ids,
        prefill_len=prefill_len,
        fp32=compare_teacher_forced_logits(ours32, expected, atol=FP32_MAX_ABS_ERROR),
        bf16=compare_three_way(ours16, expected, baseline, name="logits"),
        kv_cosine=kv_cosine,
    )
