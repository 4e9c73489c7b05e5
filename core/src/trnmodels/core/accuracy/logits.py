"""Teacher-forced logit validation.

Comparing free-running generations is fragile: one flipped token (often a near-tie that BF16 cannot
resolve) changes every later position. Under teacher forcing both models score the *same* token
sequence (the reference's greedy tokens are fed back to both), so every position is judged
independently and a flip cannot cascade.

Per position ``t`` of ``actual`` / ``expected`` logits ``[T, V]``:

- *divergence*: the actual argmax differs from the expected argmax **and** the actual logit of the
  expected token is more than one BF16 ULP below the actual max logit. Near-ties within one BF16 ULP
  are not divergences: BF16 cannot order them.
- *tolerance tiers* (:data:`DEFAULT_TOPK_TOLERANCES`): for the indices of the expected top-k logits,
  ``|actual - expected| <= atol + rtol * |expected|``. The tiers get looser further down the ranking
  because low-ranked logits hardly affect sampling; ``None`` means the whole vocabulary.

A report passes iff no position diverges and every tier holds everywhere; with an explicit ``atol``
(used for FP32 exactness checks) it passes iff ``max_abs_error <= atol`` and no position diverges, and
a position is within tolerance iff its own error is within ``atol`` (the tiers are not applied).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from types import MappingProxyType
from typing import Any

import torch

#: top-k of the expected logits -> (atol, rtol); ``None`` is the whole vocabulary.
DEFAULT_TOPK_TOLERANCES: Mapping[int | None, tuple[float, float]] = MappingProxyType(
    {5: (1e-5, 0.011), 50: (1e-5, 0.02), 1000: (1e-5, 0.03), None: (1e-5, 0.05)}
)

_BF16_MANTISSA_BITS = 7
_BF16_TINY = torch.finfo(torch.bfloat16).tiny  # ULP floor: 0 has no exponent of its own


def bf16_ulp(x: float) -> float:
    """One BF16 unit in the last place at ``x``: ``2 ** (floor(log2|x|) - 7)``, floored at the smallest normal."""
    return 2.0 ** (math.floor(math.log2(max(abs(x), _BF16_TINY))) - _BF16_MANTISSA_BITS)


@dataclass(frozen=True)
class PositionReport:
    """Comparison of the logits at one sequence position."""

    position: int
    max_abs_error: float
    expected_token: int
    actual_token: int
    top1_match: bool
    topk_overlap: dict[int, float]
    within_tolerance: bool
    diverged: bool


@dataclass(frozen=True)
class LogitReport:
    """Per-position reports plus aggregates; see the module docstring for the pass rule."""

    positions: list[PositionReport]
    max_abs_error: float
    mean_abs_error: float
    top1_agreement: float
    topk_agreement: dict[int, float]
    first_divergence: int | None
    passed: bool
    atol: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """Plain dict (e.g. for JSON accuracy reports)."""
        return asdict(self)

    def summary(self) -> str:
        """One line: verdict and aggregates."""
        topk = ", ".join(f"top-{k} {v:.3f}" for k, v in self.topk_agreement.items() if k != 1)
        div = "none" if self.first_divergence is None else f"position {self.first_divergence}"
        n_bad = sum(not p.within_tolerance for p in self.positions)
        rule = f"max_abs_err <= {self.atol:g}" if self.atol is not None else f"{n_bad} out of tolerance"
        return (
            f"[{'PASS' if self.passed else 'FAIL'}] {len(self.positions)} positions, "
            f"max abs err {self.max_abs_error:.4g}, mean abs err {self.mean_abs_error:.4g}, "
            f"agreement top-1 {self.top1_agreement:.3f}{', ' + topk if topk else ''}; "
            f"first divergence: {div}; {rule}"
        )

    def format_table(self, max_rows: int | None = 50) -> str:
        """Plain-text table, one row per position, then the summary line.

        With more than ``max_rows`` positions, the failing rows are shown first (they are the
        interesting ones: divergences, then tolerance failures) and the rest are elided.
        """
        k5 = 5 if 5 in self.topk_agreement else max(self.topk_agreement, default=None)
        rows = self.positions
        if max_rows is not None and len(rows) > max_rows:
            # Divergences first, then tolerance failures, then the rest; sorted() is stable.
            by_interest = sorted(rows, key=lambda p: (not p.diverged, p.within_tolerance))
            keep = {p.position for p in by_interest[:max_rows]}
            rows = [p for p in rows if p.position in keep]
        ovl = f"top-{k5} ovl" if k5 else "top-k ovl"
        header = ["pos", "exp tok", "act tok", "max abs err", "top-1", ovl, "ok"]
        table = [header]
        for p in rows:
            status = "DIV" if p.diverged else ("ok" if p.within_tolerance else "TOL")
            overlap = f"{p.topk_overlap[k5]:.2f}" if k5 else "-"
            top1 = "yes" if p.top1_match else "no"
            err = f"{p.max_abs_error:.4g}"
            cells = [p.position, p.expected_token, p.actual_token, err, top1, overlap, status]
            table.append([str(c) for c in cells])
        widths = [max(len(r[i]) for r in table) for i in range(len(header))]
        lines = ["  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in table]
        lines.insert(1, "  ".join("-" * w for w in widths))
        if len(rows) < len(self.positions):
            lines.append(f"... {len(self.positions) - len(rows)} positions not shown")
        lines.append(self.summary())
        return "\n".join(lines)


def _check_shapes(actual: torch.Tensor, expected: torch.Tensor) -> None:
    if actual.dim() != 2 or expected.dim() != 2 or actual.shape != expected.shape:
        raise ValueError(
            f"expected two [T, V] logit tensors of equal shape, got actual {list(actual.shape)} "
            f"and expected {list(expected.shape)}"
        )


def _check_finite(actual: torch.Tensor, expected: torch.Tensor) -> None:
    """A NaN or infinite logit has no rank and no error to compare: name the first one."""
    for name, logits in (("actual", actual), ("expected", expected)):
        bad = (~torch.isfinite(logits)).nonzero()
        if len(bad):
            t, v = bad[0].tolist()
            raise ValueError(
                f"{name} logits hold {len(bad)} non-finite value(s); the first, {logits[t, v].item()}, is at "
                f"position {t}, token {v}"
            )


def compare_teacher_forced_logits(
    actual: torch.Tensor,
    expected: torch.Tensor,
    *,
    ks: Sequence[int] = (1, 5, 50),
    tolerances: Mapping[int | None, tuple[float, float]] = DEFAULT_TOPK_TOLERANCES,
    atol: float | None = None,
) -> LogitReport:
    """Compare ``[T, V]`` logits of two models that scored the same token sequence."""
    _check_shapes(actual, expected)
    _check_finite(actual, expected)
    a = actual.detach().to("cpu", torch.float64)
    e = expected.detach().to("cpu", torch.float64)
    T, V = e.shape
    err = (a - e).abs()
    a_top = a.argmax(-1)
    e_top = e.argmax(-1)

    # Tolerance tiers, vectorised over positions: ok[t] is False if any tier fails at t. With ``atol`` the
    # rule in force is that bound alone, so a position is within tolerance by it (the table then marks
    # the positions the verdict counts, not those the tiers alone would reject).
    if atol is not None:
        ok = (err <= atol).all(-1)
    else:
        ok = torch.ones(T, dtype=torch.bool)
        for k, (tier_atol, tier_rtol) in tolerances.items():
            idx = e.topk(min(k, V), dim=-1).indices if k is not None else torch.arange(V).expand(T, V)
            bound = tier_atol + tier_rtol * e.gather(-1, idx).abs()
            ok &= (err.gather(-1, idx) <= bound).all(-1)

    k_list = sorted({min(k, V) for k in ks})
    a_topk = {k: a.topk(k, dim=-1).indices.tolist() for k in k_list}
    e_topk = {k: e.topk(k, dim=-1).indices.tolist() for k in k_list}

    positions = []
    for t in range(T):
        at, et = int(a_top[t]), int(e_top[t])
        a_max = a[t, at].item()
        diverged = at != et and a_max - a[t, et].item() > bf16_ulp(a_max)
        overlap = {k: len(set(a_topk[k][t]) & set(e_topk[k][t])) / k for k in k_list}
        positions.append(
            PositionReport(
                position=t,
                max_abs_error=err[t].max().item() if V else 0.0,
                expected_token=et,
                actual_token=at,
                top1_match=at == et,
                topk_overlap=overlap,
                within_tolerance=bool(ok[t]),
                diverged=diverged,
            )
        )

    first_div = next((p.position for p in positions if p.diverged), None)
    max_err = err.max().item() if err.numel() else 0.0
    passed = first_div is None and bool(ok.all())
    return LogitReport(
        positions=positions,
        max_abs_error=max_err,
        mean_abs_error=err.mean().item() if err.numel() else 0.0,
        top1_agreement=sum(p.top1_match for p in positions) / T if T else 1.0,
        topk_agreement={k: sum(p.topk_overlap[k] for p in positions) / T if T else 1.0 for k in k_list},
        first_divergence=first_div,
        passed=passed,
        atol=atol,
    )


def _device(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device


@torch.no_grad()
def greedy_teacher_sequence(hf_model: Any, prompt_ids: list[int], num_new_tokens: int) -> list[int]:
    """Greedy-decode exactly ``num_new_tokens`` with the reference; return prompt + generated ids.

    EOS stopping is disabled (``eos_token_id=None``) rather than suppressed with ``min_new_tokens``:
    suppression would mask the EOS logit, so the sequence would no longer be the argmax chain that
    :func:`hf_logits` reproduces.
    """
    input_ids = torch.tensor([prompt_ids], dtype=torch.long, device=_device(hf_model))
    out = hf_model.generate(
        input_ids,
        attention_mask=torch.ones_like(input_ids),
        do_sample=False,
        num_beams=1,
        max_new_tokens=num_new_tokens,
        eos_token_id=None,
    )
    return out[0].tolist()


@torch.no_grad()
def hf_logits(hf_model: Any, token_ids: list[int]) -> torch.Tensor:
    """One forward pass of the reference over the whole sequence; float32 logits ``[T, V]`` on CPU."""
    input_ids = torch.tensor([token_ids], dtype=torch.long, device=_device(hf_model))
    return hf_model(input_ids=input_ids).logits[0].float().cpu()


@torch.no_grad()
def hf_logits_stepwise(hf_model: Any, token_ids: list[int], prefill_len: int) -> torch.Tensor:
    """The reference run as serving runs it: one forward over the first ``prefill_len`` tokens, then one
    cached step per token; float32 logits ``[T, V]`` on CPU. The same logits as ``hf_logits`` up to rounding,
    which differs with the shapes the matmuls see."""
    ids = torch.tensor([token_ids], dtype=torch.long, device=_device(hf_model))
    out = hf_model(input_ids=ids[:, :prefill_len], use_cache=True)
    logits, cache = [out.logits[0]], out.past_key_values
    for p in range(prefill_len, len(token_ids)):
        out = hf_model(input_ids=ids[:, p : p + 1], past_key_values=cache, use_cache=True)
        logits.append(out.logits[0])
        cache = out.past_key_values
    return torch.cat(logits).float().cpu()
