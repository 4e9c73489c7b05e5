"""Three-way numerical comparison: is our error no worse than the error BF16 itself causes?

Comparing a BF16 kernel directly against an FP32 reference with a fixed tolerance is either too
loose (hides real bugs) or too tight (fails on honest rounding). Instead we run the reference twice:

- ``expected_fp32``: the gold reference (e.g. Hugging Face in FP32),
- ``baseline_bf16``: the same reference in BF16, which measures the error BF16 arithmetic alone causes,
- ``target``: our output (typically BF16),

and judge the target error ``|target - expected_fp32|`` relative to the base error
``|baseline_bf16 - expected_fp32|``. All three are upcast to float64 before anything is computed.

Metrics (base and target alike):

- ``linf = max|err| / max(max|expected|, tiny)`` and ``l2 = ||err||_2 / max(||expected||_2, tiny)``,
- ``linf_ratio = target_linf / base_linf``, ``l2_ratio = target_l2 / base_l2``,
- ``sigma_ratio = RMS(target err) / RMS(base err)``,
- ``bc``: Bhattacharyya coefficient ``sum(sqrt(p * q))`` of the two error histograms (shared bin
  edges over ``[0, max of both errors]``, normalised to probability mass); 1.0 when both are all zero.

Flooring: a BF16 baseline can be exact by accident (e.g. values that are representable in BF16), and
a zero base error would make every ratio infinite. The base error metric in each ratio's denominator
is therefore floored at ``eps = float32 machine epsilon x the matching norm of the gold`` (max-abs for
L-inf, L2 norm for L2, RMS for sigma): an error below FP32 resolution is not a meaningful yardstick.
Only if the floor itself is 0 (the gold is all zero) is a ratio 0 when the target error is 0 and
+inf otherwise. Reported ``base_*`` values are the unfloored ones.

Pass rule (the contract)::

    passed  iff  (bc >= bc_min  or  sigma_ratio <= sigma_max)
                 and linf_ratio < linf_ratio_max
                 and l2_ratio < l2_ratio_max

with defaults ``bc_min=0.99``, ``sigma_max=1.0``, ``linf_ratio_max=5.0``, ``l2_ratio_max=3.0``: the
target error must either be distributed like the BF16 error or be no larger in spread, and its worst
case and total must stay within a small multiple of what BF16 alone produces.

Repeated samples: ``sigma_ratio`` and ``bc`` compare two error *distributions*, so each independent
value should count once. Teacher-forced logits of a greedy continuation that loops (a small model's
often does) hold one state's row many times over: 30 copies of one row make the histogram that row's
rounding luck. ``rows`` (``distinct_rows``) restricts those two metrics to the rows that are not
repeats; the worst case and the total (``linf``, ``l2``) still cover every element, so an error at a
repeated row still fails the comparison.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import torch

BC_MIN = 0.99
SIGMA_MAX = 1.0
LINF_RATIO_MAX = 5.0
L2_RATIO_MAX = 3.0

_TINY = torch.finfo(torch.float64).tiny
_FP32_EPS = torch.finfo(torch.float32).eps

#: Rows of a gold tensor closer than this many FP32 epsilons (of its max-abs) are one state: the same
#: context reached at two positions differs only by the rounding of its position encoding (2 eps on a
#: looping tiny gpt-oss), while two different contexts differ by orders of magnitude more.
REPEAT_EPS = 32


@dataclass(frozen=True)
class ThreeWayReport:
    """All metrics and thresholds of one three-way comparison; ``passed`` applies the module's rule."""

    name: str
    shape: tuple[int, ...]
    base_linf: float
    target_linf: float
    linf_ratio: float
    base_l2: float
    target_l2: float
    l2_ratio: float
    base_rms: float
    target_rms: float
    sigma_ratio: float
    bc: float
    bins: int
    bc_min: float
    sigma_max: float
    linf_ratio_max: float
    l2_ratio_max: float
    passed: bool
    rows: int | None = None  # rows (dim 0) of the tensors, when sigma and bc sample only some of them
    rows_sampled: int | None = None  # the distinct rows sigma and bc sample (``distinct_rows``)

    def __str__(self) -> str:
        status = "PASS" if self.passed else "FAIL"
        name = self.name or "tensor"
        return (
            f"[{status}] {name} {list(self.shape)}: "
            f"linf_ratio={self.linf_ratio:.3g} (<{self.linf_ratio_max:g}), "
            f"l2_ratio={self.l2_ratio:.3g} (<{self.l2_ratio_max:g}), "
            f"sigma_ratio={self.sigma_ratio:.3g} (<={self.sigma_max:g}) or bc={self.bc:.4f} (>={self.bc_min:g}); "
            f"target linf={self.target_linf:.3g} l2={self.target_l2:.3g} vs "
            f"bf16 linf={self.base_linf:.3g} l2={self.base_l2:.3g}"
            + (
                ""
                if self.rows_sampled is None or self.rows_sampled == self.rows
                else f"; sigma and bc over the {self.rows_sampled} distinct of {self.rows} rows"
            )
        )

    def to_dict(self) -> dict[str, Any]:
        """Plain dict (e.g. for JSON accuracy reports)."""
        d = asdict(self)
        d["shape"] = list(self.shape)
        return d


def _ratio(target: float, base: float, floor: float) -> float:
    """``target / max(base, floor)``; 0/0 is 0 (both exact), x/0 is +inf."""
    denom = max(base, floor)
    if denom == 0.0:
        return 0.0 if target == 0.0 else math.inf
    return target / denom


def _max(x: torch.Tensor) -> float:
    return x.max().item() if x.numel() else 0.0


def _rms(x: torch.Tensor) -> float:
    return math.sqrt(x.square().mean().item()) if x.numel() else 0.0


def bhattacharyya(a: torch.Tensor, b: torch.Tensor, bins: int = 64) -> float:
    """Bhattacharyya coefficient of the histograms of two non-negative samples on shared edges."""
    a = a.detach().flatten().to("cpu", torch.float64)
    b = b.detach().flatten().to("cpu", torch.float64)
    hi = max(_max(a), _max(b))
    if hi == 0.0:
        return 1.0  # both all zero: identical (degenerate) distributions
    p = torch.histc(a, bins=bins, min=0.0, max=hi)
    q = torch.histc(b, bins=bins, min=0.0, max=hi)
    p, q = p / p.sum(), q / q.sum()
    return min(1.0, (p * q).sqrt().sum().item())


def histogram_bins(numel: int) -> int:
    """Bins for the error histograms of ``numel`` values each. The coefficient of two samples of one
    distribution falls short of 1 by about ``(bins - 1) / (4 * numel)``, so 64 bins over 1,024 values
    average 0.985, below ``BC_MIN`` with no difference at all; ``numel / 256`` bins (8 to 64) keep that
    shortfall under 0.002 from 1,024 values up."""
    return min(64, max(8, numel // 256))


def distinct_rows(gold: torch.Tensor, repeat_eps: float = REPEAT_EPS) -> torch.Tensor:
    """Indices of the rows (dim 0) of ``gold`` that do not repeat an earlier row, in order: a row is a
    repeat when its max-abs difference to a kept row is at most ``repeat_eps`` FP32 epsilons of
    ``gold``'s max-abs (``REPEAT_EPS``)."""
    if gold.dim() == 0:
        raise ValueError("distinct_rows: a 0-d tensor has no rows")
    if gold.shape[0] == 0:
        return torch.zeros(0, dtype=torch.long)
    g = gold.detach().to("cpu", torch.float64).reshape(gold.shape[0], -1)
    tolerance = repeat_eps * _FP32_EPS * _max(g.abs())
    kept = [0]
    for i in range(1, g.shape[0]):
        if (g[kept] - g[i]).abs().amax(dim=1).min().item() > tolerance:
            kept.append(i)
    return torch.tensor(kept)


def compare_three_way(
    target: torch.Tensor,
    expected_fp32: torch.Tensor,
    baseline_bf16: torch.Tensor,
    *,
    name: str = "",
    rows: torch.Tensor | None = None,
    bins: int = 64,
    bc_min: float = BC_MIN,
    sigma_max: float = SIGMA_MAX,
    linf_ratio_max: float = LINF_RATIO_MAX,
    l2_ratio_max: float = L2_RATIO_MAX,
) -> ThreeWayReport:
    """Measure ``target`` against the gold, using the BF16 run of the reference as the yardstick.
    ``rows`` (indices along dim 0, e.g. ``distinct_rows(expected_fp32)``) are the samples ``sigma_ratio``
    and ``bc`` compare; ``linf`` and ``l2`` always cover every element. ``bins``: ``histogram_bins`` of
    the sampled size."""
    shapes = (tuple(target.shape), tuple(expected_fp32.shape), tuple(baseline_bf16.shape))
    if len(set(shapes)) != 1:
        raise ValueError(
            f"{name or 'compare_three_way'}: shape mismatch: target {list(shapes[0])}, "
            f"expected_fp32 {list(shapes[1])}, baseline_bf16 {list(shapes[2])}"
        )
    t, e, b = (x.detach().to("cpu", torch.float64) for x in (target, expected_fp32, baseline_bf16))
    base_err, target_err = (b - e).abs(), (t - e).abs()

    e_max = _max(e.abs())
    e_l2 = torch.linalg.vector_norm(e).item()
    linf_den, l2_den = max(e_max, _TINY), max(e_l2, _TINY)
    base_linf, target_linf = _max(base_err) / linf_den, _max(target_err) / linf_den
    base_l2 = torch.linalg.vector_norm(base_err).item() / l2_den
    target_l2 = torch.linalg.vector_norm(target_err).item() / l2_den
    if rows is not None:
        if e.dim() == 0 or rows.numel() == 0:
            raise ValueError(
                f"{name or 'compare_three_way'}: rows needs a tensor of rows and at least one row"
            )
        e, base_err, target_err = (x.index_select(0, rows.to("cpu")) for x in (e, base_err, target_err))
    base_rms, target_rms = _rms(base_err), _rms(target_err)

    # Floors in the units of each metric: FP32 epsilon times the gold's max-abs / L2 / RMS.
    linf_ratio = _ratio(target_linf, base_linf, _FP32_EPS * e_max / linf_den)
    l2_ratio = _ratio(target_l2, base_l2, _FP32_EPS * e_l2 / l2_den)
    sigma_ratio = _ratio(target_rms, base_rms, _FP32_EPS * _rms(e))
    bc = bhattacharyya(base_err, target_err, bins)

    shape_ok = bc >= bc_min or sigma_ratio <= sigma_max
    passed = shape_ok and linf_ratio < linf_ratio_max and l2_ratio < l2_ratio_max
    return ThreeWayReport(
        name=name,
        shape=shapes[0],
        base_linf=base_linf,
        target_linf=target_linf,
        linf_ratio=linf_ratio,
        base_l2=base_l2,
        target_l2=target_l2,
        l2_ratio=l2_ratio,
        base_rms=base_rms,
        target_rms=target_rms,
        sigma_ratio=sigma_ratio,
        bc=bc,
        bins=bins,
        bc_min=bc_min,
        sigma_max=sigma_max,
        linf_ratio_max=linf_ratio_max,
        l2_ratio_max=l2_ratio_max,
        passed=passed,
        rows=None if rows is None else shapes[0][0],
        rows_sampled=None if rows is None else int(rows.numel()),
    )


def assert_close_three_way(
    target: torch.Tensor,
    expected_fp32: torch.Tensor,
    baseline_bf16: torch.Tensor,
    *,
    name: str = "",
    **thresholds: Any,
) -> ThreeWayReport:
    """Like :func:`compare_three_way` (``thresholds`` are its keyword arguments) but raise on failure.

    The AssertionError carries the full one-line report so a failing test says by how much it failed.
    """
    report = compare_three_way(target, expected_fp32, baseline_bf16, name=name, **thresholds)
    if not report.passed:
        raise AssertionError(f"three-way comparison failed: {report}")
    return report
