"""The validation report of a causal LM checkpoint against its transformers reference: the onboarding
guide's three levels in one run.

- L3, module level (``bisect``): every decoder layer's output, and each sub-module transformers has
  under the same name, over one prefill, inside the error HF's own BF16 model makes there. In this
  process at TP=1, where every module is whole.
- L2, teacher-forced logits (HF's greedy continuation is fed to both models), at the requested mesh:
  - FP32: our logits against HF FP32, per position, with a max-abs-error bound;
  - BF16: our BF16 logits judged against HF FP32, relative to HF BF16's own error (three-way; the
    larger error of two HF BF16 runs, ``bf16_yardstick``). In an
    MoE model the BF16 run replays the expert picks of our FP32 run (teacher-forced routing,
    ``ops.route_trace``), and the report counts the picks BF16 rounding would have changed;
  - KV cache: per-layer cosine similarity of our paged cache against HF's cache (at TP=1, where our
    cache holds every KV head).
- L1, task accuracy through lm-evaluation-harness (``tasks``), when asked for: it takes minutes.

With ``bisect`` the report adds the bisection: each layer's error against its envelope, the first layer
outside it, and within that layer the first module outside (where a failing L2 comes from).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..ops.route_trace import RouteTrace, tracing_routes
from .bisect import ModuleReport, capture, compare_modules, decoder_layers, shared_children
from .kv import hf_kv_cache, kv_cache_similarity
from .logits import (
    LogitReport,
    compare_teacher_forced_logits,
    greedy_teacher_sequence,
    hf_logits,
    hf_logits_stepwise,
)
from .tasks import TaskReport
from .three_way import ThreeWayReport, compare_three_way, distinct_rows, histogram_bins

FP32_MAX_ABS_ERROR = 1e-4
KV_MIN_COSINE = 0.99

#: Test-only: alters our freshly loaded model (e.g. injects a known bug), in this process at TP=1.
ModelHook = Callable[[torch.nn.Module], None]


@dataclass(frozen=True)
class ValidationReport:
    checkpoint: str
    tp: int
    token_ids: list[int]
    prefill_len: int
    fp32: LogitReport
    bf16: ThreeWayReport
    kv_cosine: dict[str, tuple[float, float]] | None
    ep: int = 1
    modules: ModuleReport | None = None  # L3
    tasks: TaskReport | None = None  # L1
    bisect: bool = False  # report the bisection (layer by layer, then within the first departing layer)
    bf16_baseline: str = "one prefill"  # the HF BF16 run the three-way measures against (bf16_yardstick)
    # MoE only: (choices free BF16 routing would make otherwise, choices), over tokens x routed layers.
    bf16_route_flips: tuple[int, int] | None = None

    @property
    def kv_passed(self) -> bool:
        return self.kv_cosine is None or min(min(p) for p in self.kv_cosine.values()) >= KV_MIN_COSINE

    @property
    def logits_passed(self) -> bool:
        return self.fp32.passed and self.bf16.passed and self.kv_passed

    @property
    def passed(self) -> bool:
        levels = [self.logits_passed]
        levels += [] if self.modules is None else [self.modules.passed]
        levels += [] if self.tasks is None else [self.tasks.passed]
        return all(levels)

    def format(self) -> str:
        verdict = {True: "PASS", False: "FAIL"}
        lines = [
            f"validation of {self.checkpoint} (tp={self.tp}, ep={self.ep}, {len(self.token_ids)} tokens: "
            f"prefill {self.prefill_len}, decode {len(self.token_ids) - self.prefill_len})",
        ]
        if self.modules is not None:
            lines += [
                "",
                f"L3 module level (TP=1, one prefill; ours FP32 vs HF FP32 inside HF BF16's error): "
                f"{verdict[self.modules.passed]}",
                f"  {self.modules.summary()}",
            ]
            lines += [f"  not compared: {s}" for s in self.modules.skipped]
        lines += [
            "",
            f"L2 teacher-forced logits: {verdict[self.logits_passed]}",
            f"FP32 teacher-forced logits vs HF FP32 (max abs error ≤ {FP32_MAX_ABS_ERROR:g}):",
            self.fp32.format_table(max_rows=12),
            "",
            f"BF16 three-way (ours BF16 vs HF FP32, relative to HF BF16 run as {self.bf16_baseline}: "
            "the larger error of its two runs):",
            f"  {self.bf16}",
        ]
        if self.bf16_route_flips is not None:
            differing, choices = self.bf16_route_flips
            lines.append(
                f"  expert routing teacher-forced from our FP32 run: free BF16 routing picks other experts "
                f"for {differing} of {choices} token x layer choices (near-ties BF16 rounding breaks)"
            )
        if self.kv_cosine is not None:
            worst = min(self.kv_cosine.items(), key=lambda kv: min(kv[1]))
            lines += [
                "",
                f"KV cache cosine vs HF (min {KV_MIN_COSINE}): {len(self.kv_cosine)} layers, "
                f"worst {worst[0]} k={worst[1][0]:.6f} v={worst[1][1]:.6f}",
            ]
        lines.append("")
        if self.tasks is None:
            lines.append("L1 task level: not run (--tasks runs the shipped lm-eval tasks; minutes per model)")
        else:
            lines += [f"L1 task level: {verdict[self.tasks.passed]}", self.tasks.format()]
        if self.modules is not None and self.bisect:
            lines += ["", "bisection (hidden states after every layer, then within the first that departs):"]
            lines += self.modules.bisection()
        lines += ["", f"RESULT: {verdict[self.passed]}"]
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        culprit = None if self.modules is None else self.modules.culprit
        first = None if self.modules is None else self.modules.first_layer
        return {
            "checkpoint": self.checkpoint,
            "tp": self.tp,
            "ep": self.ep,
            "token_ids": self.token_ids,
            "prefill_len": self.prefill_len,
            "passed": self.passed,
            "L3": None if self.modules is None else self.modules.to_dict(),
            "L2": {
                "passed": self.logits_passed,
                "fp32": self.fp32.to_dict(),
                "bf16": self.bf16.to_dict(),
                "bf16_baseline": self.bf16_baseline,
                "bf16_route_flips": None
                if self.bf16_route_flips is None
                else dict(zip(("differing", "choices"), self.bf16_route_flips, strict=True)),
                "kv_cosine": self.kv_cosine,
                "kv_min_cosine": KV_MIN_COSINE,
            },
            "L1": None if self.tasks is None else {"passed": self.tasks.passed, **self.tasks.__dict__},
            "bisection": None
            if self.modules is None or not self.bisect
            else {
                "first_layer": None if first is None else first.describe(),
                "culprit": None if culprit is None else culprit.describe(),
            },
        }


def _our_logits(
    checkpoint_dir: str | Path,
    token_ids: Sequence[int],
    prefill_len: int,
    *,
    tp: int,
    ep: int,
    dtype: str,
    return_kv: bool = False,
    route_trace: RouteTrace,
    model_hook: ModelHook | None = None,
) -> tuple[Any, RouteTrace]:
    """``(logits or (logits, kv), trace)``: the expert picks recorded into, or replayed from, ``route_trace``."""
    from ..runner.score import score_checkpoint

    if model_hook is None:
        return score_checkpoint(
            checkpoint_dir,
            token_ids,
            prefill_len,
            tp=tp,
            ep=ep,
            dtype=dtype,
            return_kv=return_kv,
            route_trace=route_trace,
        )
    if tp * ep != 1:
        raise ValueError("model_hook alters the model in this process: it needs tp=ep=1")
    from ..causal_lm import build_model
    from ..parallel import init_parallel_state
    from ..runner.score import check_finite_logits, teacher_forced_logits
    from ..runtime_config import NeuronConfig

    init_parallel_state()
    model = build_model(checkpoint_dir, NeuronConfig(dtype=dtype), progress=False)
    model_hook(model)
    with tracing_routes(route_trace):
        result = teacher_forced_logits(model, token_ids, prefill_len, return_kv=return_kv)
    check_finite_logits(result[0] if return_kv else result, model)
    return result, route_trace


def module_report(
    checkpoint_dir: str | Path,
    token_ids: Sequence[int],
    hf32: torch.nn.Module,
    hf16: torch.nn.Module,
    model_hook: ModelHook | None = None,
) -> ModuleReport:
    """L3 over one prefill of ``token_ids``: our FP32 model (built here at TP=1) against both HF models."""
    from ..causal_lm import build_model
    from ..parallel import init_parallel_state
    from ..runner.score import teacher_forced_logits
    from ..runtime_config import NeuronConfig

    init_parallel_state()
    ours = build_model(checkpoint_dir, NeuronConfig(), progress=False)
    if model_hook is not None:
        model_hook(ours)
    num_layers = hf32.config.get_text_config().num_hidden_layers
    our_layers, hf_layers = decoder_layers(ours, num_layers), decoder_layers(hf32, num_layers)
    names = shared_children(our_layers, hf_layers)
    ids = torch.tensor([list(token_ids)])
    return compare_modules(
        capture(our_layers, names, lambda: teacher_forced_logits(ours, token_ids)),
        capture(hf_layers, names, lambda: hf32(input_ids=ids)),
        capture(decoder_layers(hf16, num_layers), names, lambda: hf16(input_ids=ids)),
        len(token_ids),
    )


def hf_class_of(checkpoint_dir: str | Path) -> type:
    """The transformers class the checkpoint's ``architectures[0]`` names."""
    import transformers

    from ..causal_lm import resolve_checkpoint

    _, hf_config = resolve_checkpoint(checkpoint_dir)
    return getattr(transformers, hf_config.architectures[0])


def load_hf_reference(cls: type, checkpoint_dir: str | Path, dtype: torch.dtype) -> Any:
    """transformers' model of the checkpoint in ``dtype``, with eager attention and experts: the readable
    reference, which every architecture implements (and grouped_mm refuses some shapes on CPU).

    An MXFP4 checkpoint (gpt-oss as published) is dequantized: without that, transformers on a CPU keeps
    its experts in BF16 beside FP32 layers and refuses to multiply them. Every MXFP4 value is a BF16
    value, so the cast to ``dtype`` is exact."""
    import transformers

    from ..causal_lm import resolve_checkpoint

    kwargs: dict[str, Any] = {"attn_implementation": "eager", "experts_implementation": "eager"}
    _, hf_config = resolve_checkpoint(checkpoint_dir)
    quant = getattr(hf_config, "quantization_config", None)
    method = quant.get("quant_method") if isinstance(quant, dict) else getattr(quant, "quant_method", None)
    if method == "mxfp4":
        kwargs["quantization_config"] = transformers.Mxfp4Config(dequantize=True)
    return cls.from_pretrained(checkpoint_dir, dtype=dtype, **kwargs).to(dtype).eval()


def _as_hf_layers(ours: dict[str, Any], hf: dict[str, Any]) -> dict[str, Any]:
    """Our cache under HF's layer names (ours are module paths, HF's indices; both in model order), cut to
    the positions HF keeps: its sliding-window layers hold only the last window, ours every position."""
    out = {}
    for name, (k, v) in zip(hf, ours.values(), strict=True):
        kept = hf[name][0].shape[-2]
        out[name] = (k[..., -kept:, :], v[..., -kept:, :])
    return out


def bf16_yardstick(
    hf16: torch.nn.Module, token_ids: list[int], prefill_len: int, expected: torch.Tensor
) -> tuple[torch.Tensor, str]:
    """HF BF16's logits as the three-way's baseline, and which run gave them.

    Two honest BF16 runs of the same model differ: the rounding follows the shapes the matmuls see. So HF
    BF16 runs twice, as one prefill and as ours runs (prefill, then cached decode steps), and the run with
    the larger RMS error against HF FP32 is the yardstick: BF16 arithmetic alone makes that error. One
    run alone under-states it about half of the time, and on a tiny model that decides the verdict.
    """
    runs = {
        "one prefill": hf_logits(hf16, token_ids),
        f"prefill {prefill_len} + decode": hf_logits_stepwise(hf16, token_ids, prefill_len),
    }
    name = max(runs, key=lambda k: (runs[k] - expected).square().mean().item())
    return runs[name], name


def _bf16_three_way(ours16: torch.Tensor, expected: torch.Tensor, baseline: torch.Tensor) -> ThreeWayReport:
    """The logits' three-way. A greedy continuation that loops feeds one state many times over (a tiny
    random model's often does): its spread and shape (sigma, bc) sample each distinct position once, and
    the histograms are binned for that sample's size, as the pipeline stages are."""
    rows = distinct_rows(expected)
    sampled = rows.numel() * expected[0].numel()
    return compare_three_way(
        ours16, expected, baseline, name="logits", rows=rows, bins=histogram_bins(sampled)
    )


def validate_checkpoint(
    checkpoint_dir: str | Path,
    prompt_ids: Sequence[int],
    num_new_tokens: int,
    *,
    hf_model_class: type | None = None,
    tp: int = 1,
    ep: int = 1,
    prefill_len: int | None = None,
    modules: bool = True,
    tasks: bool = False,
    task_limit: int | None = None,
    bisect: bool = False,
    model_hook: ModelHook | None = None,
) -> ValidationReport:
    """Run the levels. ``prefill_len`` defaults to the prompt; the continuation runs as decode steps.
    ``modules`` runs L3 (and so the bisection), ``tasks`` runs L1 (``task_limit`` documents per task)."""
    cls = hf_model_class or hf_class_of(checkpoint_dir)
    hf32 = load_hf_reference(cls, checkpoint_dir, torch.float32)
    token_ids = greedy_teacher_sequence(hf32, list(prompt_ids), num_new_tokens)
    prefill_len = prefill_len or len(prompt_ids)
    expected = hf_logits(hf32, token_ids)
    hf_kv = hf_kv_cache(hf32, token_ids) if tp == 1 else None
    hf16 = load_hf_reference(cls, checkpoint_dir, torch.bfloat16)
    baseline, baseline_run = bf16_yardstick(hf16, token_ids, prefill_len, expected)
    module_errors = module_report(checkpoint_dir, token_ids, hf32, hf16, model_hook) if modules else None
    del hf16, hf32

    ours = dict(tp=tp, ep=ep, model_hook=model_hook)
    (ours32, our_kv), routes = _our_logits(
        checkpoint_dir,
        token_ids,
        prefill_len,
        dtype="float32",
        return_kv=True,
        route_trace=RouteTrace(),
        **ours,
    )
    ours16, replayed = _our_logits(
        checkpoint_dir, token_ids, prefill_len, dtype="bfloat16", route_trace=routes.replayed(), **ours
    )
    kv_cosine = None
    if hf_kv is not None:
        kv_cosine = kv_cache_similarity(_as_hf_layers(our_kv, hf_kv), hf_kv)
    task_report = None
    if tasks:
        from .tasks import task_accuracy

        task_report = task_accuracy(checkpoint_dir, tp=tp, limit=task_limit)
    return ValidationReport(
        checkpoint=str(checkpoint_dir),
        tp=tp,
        ep=ep,
        token_ids=token_ids,
        prefill_len=prefill_len,
        fp32=compare_teacher_forced_logits(ours32, expected, atol=FP32_MAX_ABS_ERROR),
        bf16=_bf16_three_way(ours16, expected, baseline),
        bf16_baseline=baseline_run,
        kv_cosine=kv_cosine,
        modules=module_errors,
        tasks=task_report,
        bisect=bisect,
        bf16_route_flips=(replayed.differing, replayed.choices) if replayed.calls else None,
    )
