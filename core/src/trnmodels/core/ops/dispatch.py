"""Kernel dispatch: every functional op has a PyTorch reference, and an NKI kernel where one can run.

The rule: the NKI implementation is used only when the Neuron SDK imports, an NKI adapter is registered
for the op (``register_nki``; see ``neuron.kernels`` for the kernel each op targets), the op's first
tensor lives on a Neuron device, and the op's own shape predicate accepts the call.
The backend can be forced with ``TRNMODELS_KERNEL_BACKEND=torch|nki|auto`` or ``use_backend(...)``;
forcing ``nki`` where it cannot run raises instead of silently falling back.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Callable, Iterator
from typing import Any, ParamSpec, TypeVar

import torch

from .. import neuron
from ..errors import BackendUnavailableError, ConfigError

P = ParamSpec("P")
R = TypeVar("R")

BACKENDS = ("auto", "torch", "nki")
ENV_VAR = "TRNMODELS_KERNEL_BACKEND"

_forced: str | None = None
_nki_impls: dict[str, Callable[..., Any]] = {}
_nki_supports: dict[str, Callable[..., bool]] = {}
_REFERENCES: dict[str, Callable[..., Any]] = {}


def current_backend() -> str:
    mode = _forced or os.environ.get(ENV_VAR, "auto")
    if mode not in BACKENDS:
        raise ConfigError(f"{ENV_VAR}: expected one of {BACKENDS}, got {mode!r}")
    return mode


@contextlib.contextmanager
def use_backend(mode: str) -> Iterator[None]:
    """Force a kernel backend for the duration of the block."""
    global _forced
    if mode not in BACKENDS:
        raise ConfigError(f"kernel backend: expected one of {BACKENDS}, got {mode!r}")
    previous, _forced = _forced, mode
    try:
        yield
    finally:
        _forced = previous


def register_nki(op: str, impl: Callable[..., Any], supports: Callable[..., bool] | None = None) -> None:
    """Bind an NKI implementation to an op, for the whole process: ``neuron.adapters`` calls it for the
    adapters the runtime configuration names (a model build never does, so it cannot change the kernels
    of the other models in the process).

    ``supports(*args, **kwargs)`` is the adapter's own shape predicate (e.g. a kernel's head-size limit):
    calls it rejects run the PyTorch reference under ``auto`` and are an error under forced ``nki``.
    """
    if op not in _REFERENCES:
        raise ConfigError(f"register_nki: unknown op {op!r}; known ops: {sorted(_REFERENCES)}")
    _nki_impls[op] = impl
    if supports is None:
        _nki_supports.pop(op, None)
    else:
        _nki_supports[op] = supports


def _nki_impl(op: str) -> Callable[..., Any] | None:
    # Only explicitly registered adapters: a raw nki-library kernel does not take our op's layouts.
    return _nki_impls.get(op) if neuron.sdk_available() else None


def select_backend(op: str, *args: Any, supports: Callable[..., bool] | None = None, **kwargs: Any) -> str:
    """Which backend runs this call of ``op``: ``"torch"`` or ``"nki"``."""
    mode = current_backend()
    if mode == "torch":
        return "torch"
    first = next((a for a in args if isinstance(a, torch.Tensor)), None)
    on_device = neuron.is_neuron_tensor(first)
    adapter_supports = _nki_supports.get(op)
    if mode == "nki":
        if not neuron.sdk_available():
            raise BackendUnavailableError(
                f"{op}: backend 'nki' forced, but the Neuron SDK does not import here"
            )
        if _nki_impl(op) is None:
            raise BackendUnavailableError(
                f"{op}: backend 'nki' forced, but no NKI kernel adapter is registered for this op"
            )
        if not on_device:
            device = first.device if first is not None else None
            raise BackendUnavailableError(
                f"{op}: backend 'nki' forced, but the input is on {device}, not Neuron"
            )
        if adapter_supports is not None and not adapter_supports(*args, **kwargs):
            raise BackendUnavailableError(
                f"{op}: backend 'nki' forced, but the registered kernel adapter does not support this call"
            )
        return "nki"
    if (
        on_device
        and _nki_impl(op) is not None
        and (supports is None or supports(*args, **kwargs))
        and (adapter_supports is None or adapter_supports(*args, **kwargs))
    ):
        return "nki"
    return "torch"


def kernel_op(
    name: str, supports: Callable[..., bool] | None = None
) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Make a PyTorch reference function the public op ``name``, dispatching to NKI where it can run."""

    def wrap(reference: Callable[P, R]) -> Callable[P, R]:
        _REFERENCES[name] = reference

        @functools.wraps(reference)
        def op(*args: P.args, **kwargs: P.kwargs) -> R:
            if select_backend(name, *args, supports=supports, **kwargs) == "nki":
                return _nki_impls[name](*args, **kwargs)
            return reference(*args, **kwargs)

        op.reference = reference  # type: ignore[attr-defined]
        return op

    return wrap


def registered_ops() -> list[str]:
    return sorted(_REFERENCES)
