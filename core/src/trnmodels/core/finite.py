"""Where NaN and inf are refused: a non-finite input is bad input, and a non-finite result is an error that
names the stage that produced it (and the first weight holding NaN or inf), never a result.

The checks screen with one ``sum()`` (any NaN or inf makes it non-finite, and it allocates nothing the
size of the tensor, which matters for a decoded video); ``isfinite`` confirms, since a sum of finite
values can also overflow.
"""

from __future__ import annotations

import torch

from .errors import InputError, NonFiniteOutputError


def _non_finite_count(tensor: torch.Tensor) -> int:
    if not tensor.is_floating_point() or tensor.numel() == 0 or tensor.sum().isfinite():
        return 0
    return int((~torch.isfinite(tensor)).sum())


def non_finite_weight(model: torch.nn.Module) -> str:
    """`` (checkpoint key K holds NaN or inf)`` for the first parameter of this rank that does, else ``""``.

    Run only once a result came out non-finite: weights are not scanned at load (``docs/validation.md``).
    A weight released after packing (``cpu.packed``) is the NaN it holds by design, and is skipped: a weight
    holding NaN or inf is never released (``cpu.packed_layers``), so it is still named.
    """
    from .cpu.packed import released

    keys = model.checkpoint_keys() if hasattr(model, "checkpoint_keys") else {}
    for name, p in model.named_parameters():
        if not released(p) and _non_finite_count(p.detach()):
            key = keys.get(name, name)
            return f" ({'checkpoint key' if name in keys else 'parameter'} {key} holds NaN or inf)"
    return ""


def check_finite_input(tensor: torch.Tensor, what: str) -> None:
    """Refuse an input holding NaN or inf, naming it (``what``, e.g. ``"VAE decode: latents"``)."""
    bad = _non_finite_count(tensor)
    if bad:
        raise InputError(f"{what}: NaN or inf in {bad} of {tensor.numel()} values; expected finite values")


def check_finite_output(tensor: torch.Tensor, what: str, model: torch.nn.Module | None = None) -> None:
    """Refuse a result holding NaN or inf, naming the stage (``what``) and, given the model that produced
    it, the first weight holding NaN or inf."""
    bad = _non_finite_count(tensor)
    if bad:
        raise NonFiniteOutputError(
            f"{what}: NaN or inf in {bad} of {tensor.numel()} values, from finite inputs; the "
            "checkpoint's weights, or the dtype's range, give non-finite values"
            + (non_finite_weight(model) if model is not None else "")
        )
