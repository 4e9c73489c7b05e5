"""The validation report of a diffusion pipeline checkpoint against its diffusers reference, stage by stage
(``trnmodels validate PIPELINE_DIR``): the seeds' stage / module / step bisection as one run.

The pipeline names its stages in the order a generation runs them (its ``validation_stages`` classmethod;
Wan2.2: the text encoder, then every denoising step's DiT call, then the VAE decode), each teacher-forced:
the stage's inputs are the ones the reference pipeline produced in FP32, so an error cannot carry over from
an earlier stage. Every stage runs four ways, ours and the reference's, each in FP32 and BF16, and is judged
as the LLM logits are:

- FP32: ours against the reference within ``atol + rtol * |reference|`` (both ``1e-4``);
- BF16: ours judged against the FP32 reference, relative to the reference's own BF16 error (the three-way
  rule of ``three_way``, its histograms binned for the stage's size, ``histogram_bins``: a DiT step of a
  small video has about a thousand values, too few for 64 bins).

The first stage that fails either is where the pipeline drifts; the report names it, with its numbers.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch

from ..errors import InputError
from .three_way import ThreeWayReport, compare_three_way, histogram_bins

FP32_RTOL = 1e-4
FP32_ATOL = 1e-4

Side = Literal["ours", "reference"]
#: Test-only: alters one of our freshly loaded components (``hook(component_name, module)``), e.g. to
#: inject a known bug the report must then name.
ComponentHook = Callable[[str, torch.nn.Module], None]


@dataclass(frozen=True)
class ValidationRequest:
    """The generation the stages are taken from."""

    prompt: str
    num_frames: int
    height: int
    width: int
    steps: int
    max_sequence_length: int


@dataclass(frozen=True)
class StageCheck:
    """One stage of a generation: ``run(side, dtype)`` computes its output on the recorded inputs."""

    name: str  # e.g. "step 3/4 (t=750)"
    component: str  # the component the stage runs, e.g. "transformer_2"
    run: Callable[[Side, torch.dtype], torch.Tensor]


@dataclass(frozen=True)
class StageReport:
    name: str
    component: str
    fp32_max_abs_error: float
    fp32_max_excess: float  # max(|ours - ref| - (atol + rtol |ref|)): <= 0 passes
    bf16: ThreeWayReport

    @property
    def fp32_passed(self) -> bool:
        return self.fp32_max_excess <= 0.0

    @property
    def passed(self) -> bool:
        return self.fp32_passed and self.bf16.passed

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "component": self.component,
            "passed": self.passed,
            "fp32": {
                "passed": self.fp32_passed,
                "max_abs_error": self.fp32_max_abs_error,
                "max_excess": self.fp32_max_excess,
                "rtol": FP32_RTOL,
                "atol": FP32_ATOL,
            },
            "bf16": self.bf16.to_dict(),
        }


@dataclass(frozen=True)
class PipelineValidationReport:
    checkpoint: str
    architecture: str
    settings: dict[str, Any]
    stages: list[StageReport] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all(s.passed for s in self.stages)

    @property
    def first_drift(self) -> StageReport | None:
        return next((s for s in self.stages if not s.passed), None)

    def to_dict(self) -> dict[str, Any]:
        drift = self.first_drift
        return {
            "kind": "diffusion",
            "checkpoint": self.checkpoint,
            "architecture": self.architecture,
            "settings": self.settings,
            "passed": self.passed,
            "first_drift": None if drift is None else drift.name,
            "stages": [_finite_or_none(s.to_dict()) for s in self.stages],
        }

    def format(self) -> str:
        s = self.settings
        lines = [
            f"validate {self.checkpoint} [{self.architecture}] against diffusers, stage by stage, teacher-forced",
            f"  {s['num_frames']} frames of {s['height']}x{s['width']}, {s['steps']} steps, prompt {s['prompt']!r}",
            f"  FP32: |ours - ref| <= {FP32_ATOL:g} + {FP32_RTOL:g} |ref|; BF16: three-way against the "
            "reference's BF16 error",
            "",
            f"  {'stage':<28} {'component':<14} {'FP32 max err':>12}  {'BF16 linf/l2 ratio':>18}  verdict",
        ]
        for stage in self.stages:
            ratios = f"{stage.bf16.linf_ratio:.2f} / {stage.bf16.l2_ratio:.2f}"
            verdict = "PASS" if stage.passed else "FAIL" + ("" if stage.fp32_passed else " (FP32)")
            if not stage.bf16.passed:
                verdict += " (BF16)"
            lines.append(
                f"  {stage.name:<28} {stage.component:<14} {stage.fp32_max_abs_error:>12.3g}  {ratios:>18}  {verdict}"
            )
        drift = self.first_drift
        if drift is None:
            lines.append("\nPASS: every stage matches the reference")
        else:
            lines.append(f"\nFAIL: the first stage that drifts is {drift.name} ({drift.component})")
            if not drift.fp32_passed:
                lines.append(
                    f"  FP32 max abs error {drift.fp32_max_abs_error:.3g}, "
                    f"{drift.fp32_max_excess:.3g} over the tolerance"
                )
            if not drift.bf16.passed:
                lines.append(f"  BF16 {drift.bf16}")
        return "\n".join(lines)


def _finite_or_none(value: Any) -> Any:
    """JSON has no infinity or NaN: an error that is not finite (a broken stage) is reported as null."""
    if isinstance(value, dict):
        return {k: _finite_or_none(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite_or_none(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def compare_stage(stage: StageCheck) -> StageReport:
    """Run a stage four ways and judge ours against the reference in FP32 and in BF16."""
    expected = stage.run("reference", torch.float32).double()
    baseline = stage.run("reference", torch.bfloat16)
    ours_fp32 = stage.run("ours", torch.float32).double()
    ours_bf16 = stage.run("ours", torch.bfloat16)
    if not torch.isfinite(expected).all():
        raise InputError(
            f"{stage.name}: the reference's FP32 output is not finite; the checkpoint's {stage.component} "
            "weights (or the request) give no number to compare with"
        )
    if ours_fp32.shape != expected.shape:
        raise ValueError(
            f"{stage.name}: ours gives shape {list(ours_fp32.shape)}, the reference {list(expected.shape)}"
        )
    # A non-finite output of ours fails with an infinite error (NaN would compare as neither).
    error = (ours_fp32 - expected).abs().nan_to_num(nan=math.inf)
    excess = error - (FP32_ATOL + FP32_RTOL * expected.abs())
    ours_bf16 = ours_bf16.double().nan_to_num(nan=math.inf)
    return StageReport(
        name=stage.name,
        component=stage.component,
        fp32_max_abs_error=error.max().item(),
        fp32_max_excess=excess.max().item(),
        bf16=compare_three_way(
            ours_bf16, expected, baseline, name=stage.name, bins=histogram_bins(expected.numel())
        ),
    )


def validate_pipeline(
    checkpoint_dir: str | Path,
    request: ValidationRequest,
    *,
    component_hook: ComponentHook | None = None,
) -> PipelineValidationReport:
    """Every stage of the pipeline serving ``checkpoint_dir`` against its reference (module docstring)."""
    from ..omni.registry import checkpoint_pipeline_hook

    architecture, _, stages_of = checkpoint_pipeline_hook(
        checkpoint_dir, "validation_stages", "it cannot be validated stage by stage"
    )
    stages = stages_of(checkpoint_dir, request, component_hook=component_hook)
    with torch.no_grad():
        reports = [compare_stage(stage) for stage in stages]
    return PipelineValidationReport(str(checkpoint_dir), architecture, asdict(request), reports)
