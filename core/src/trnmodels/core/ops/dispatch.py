"""Kernel dispatch: every functional op has a PyTorch reference, an NKI kernel where one can run, and a
CPU kernel where one is faster than the reference on CPU.

The rule: the NKI implementation is used only when the Neuron SDK imports, an NKI adapter is registered
for the op (``register_nki``; see ``neuron.kernels`` for the kernel each op targets), the op's first
tensor lives on a Neuron device, and the op's own shape predicate accepts the call. A CPU kernel
(``register_cpu``; the kernels are in ``trnmodels.core.cpu``) is used when the op's first tensor lives on
the CPU, the call is eager (graph capture keeps the static reference, unless the kernel registered as
``in_graphs``: static itself, it is captured into the CPU graphs too), its predicate accepts the call
and ``TRNMODELS_CPU_KERNELS`` enables it (default ``all``; ``none``, or a comma-separated list of ops,
to bisect a regression).
Under ``torch.compile`` (vLLM compiles the bridge) a CPU kernel registered with ``fake`` is traced as one
opaque custom op, ``trnmodels::<op>``, which makes its choice when it runs, with the call's real sizes
and values: torch.compile traces once with a symbolic token count and vLLM drops the guards, so a choice
made from the trace's sizes would hold for every later call, and a kernel that branches on values (the
token-sparse MoE) cannot be traced at all. A kernel registered with ``inline`` may instead answer at trace
time, for calls whose choice no size or value changes (a weight packed for a GEMM that traces: the call
is then traced as that GEMM, with no custom op between). ``torch.export`` (our own graph capture, static
shapes) keeps the rule above.
The backend can be forced with ``TRNMODELS_KERNEL_BACKEND=torch|nki|auto`` or ``use_backend(...)``;
``torch`` runs the PyTorch reference of every op; forcing ``nki`` where it cannot run raises instead of
silently falling back.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
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
CPU_KERNELS_ENV_VAR = "TRNMODELS_CPU_KERNELS"

_forced: str | None = None
_nki_impls: dict[str, Callable[..., Any]] = {}
_nki_supports: dict[str, Callable[..., bool]] = {}
_cpu_impls: dict[str, Callable[..., Any]] = {}
_cpu_supports: dict[str, Callable[..., bool]] = {}
_cpu_in_graphs: set[str] = set()
_cpu_kernel_names: tuple[str, ...] = ()  # sorted keys of _cpu_impls, kept by register_cpu
_cpu_runtime_ops: dict[str, Callable[..., Any]] = {}  # trnmodels::<op>, for torch.compile's traces
_cpu_inline: dict[str, Callable[..., Any]] = {}  # trace-time answers, before the runtime op
_REFERENCES: dict[str, Callable[..., Any]] = {}


# Eager calls check the two variables in the bytes mapping behind ``os.environ`` (CPython's, on POSIX):
# ``os.environ.get`` encodes the key and decodes the value on every call, 0.6 us of a linear layer's
# 6 us here, and an eager decode step asks hundreds of times (``_eager_auto_kernels``).
_ENVIRON_BYTES: dict[bytes, bytes] | None = getattr(os.environ, "_data", None) if os.name == "posix" else None


def environ_reader(name: str) -> Callable[[], bytes | str | None]:
    """A cheap read of ``$name``, to tell whether it changed since a kept answer was worked out: its bytes
    where ``os.environ`` keeps them (see above), else ``os.environ.get``."""
    if _ENVIRON_BYTES is not None:
        return functools.partial(_ENVIRON_BYTES.get, name.encode())
    return functools.partial(os.environ.get, name)


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
    _bind("register_nki", _nki_impls, _nki_supports, op, impl, supports)


def register_cpu(
    op: str,
    impl: Callable[..., Any],
    supports: Callable[..., bool] | None = None,
    *,
    in_graphs: bool = False,
    fake: Callable[..., torch.Tensor] | None = None,
    inline: Callable[..., torch.Tensor | None] | None = None,
) -> None:
    """Bind a CPU kernel to an op (``trnmodels.core.cpu`` does, at import). ``supports(*args, **kwargs)``
    is its predicate: calls it rejects run the PyTorch reference. ``in_graphs`` says the kernel is static
    (no branch on values outside ``torch.cond``), so graph capture for the CPU takes it as well.

    ``fake(*args, **kwargs)`` returns an empty tensor of the call's result (shape and dtype from the
    arguments' alone): with it, ``torch.compile`` traces the op as the custom op ``trnmodels::<op>``,
    which dispatches when it runs (see the module's docstring). ``inline(*args, **kwargs)``, tried first
    under ``torch.compile``, returns the call's result traced inline when the kernel's choice is fixed
    for every call of the traced site, else None."""
    global _cpu_kernel_names
    _bind("register_cpu", _cpu_impls, _cpu_supports, op, impl, supports)
    _cpu_kernel_names = tuple(sorted(_cpu_impls))
    if in_graphs:
        _cpu_in_graphs.add(op)
    else:
        _cpu_in_graphs.discard(op)
    if fake is not None and op not in _cpu_runtime_ops:
        _cpu_runtime_ops[op] = _runtime_op(op, fake)
    if inline is None:
        _cpu_inline.pop(op, None)
    else:
        _cpu_inline[op] = inline


# The namespace of the runtime ops. Defined through ``torch.library.Library`` rather than ``custom_op``:
# a call then reaches the kernel through the dispatcher alone (about 3 us of the op's own per call here),
# not through ``custom_op``'s Python layers (36 us over ``F.linear`` on the earlier machine), which showed
# in vLLM's decode (every projection is one call).
_LIBRARY = torch.library.Library("trnmodels", "FRAGMENT")


def _runtime_op(op: str, fake: Callable[..., torch.Tensor]) -> Callable[..., Any]:
    """The op ``trnmodels::<op>``: the CPU kernel or the reference, chosen when it runs (the trace checked
    the backend and ``TRNMODELS_CPU_KERNELS``), behind the reference's schema with every argument
    positional (custom ops take no keyword-only tensors)."""
    reference = _REFERENCES[op]
    signature = inspect.signature(reference)
    parameters = list(signature.parameters.values())
    has_keywords = any(p.kind is p.KEYWORD_ONLY for p in parameters)

    def split(args: tuple[Any, ...]) -> tuple[list[Any], dict[str, Any]]:
        # The dispatcher may leave out trailing arguments that equal their defaults.
        values = [*args, *(p.default for p in parameters[len(args) :])]
        if not has_keywords:
            return values, {}
        positional = [v for p, v in zip(parameters, values, strict=True) if p.kind is not p.KEYWORD_ONLY]
        keywords = {p.name: v for p, v in zip(parameters, values, strict=True) if p.kind is p.KEYWORD_ONLY}
        return positional, keywords

    def choose_when_run(*args: Any) -> Any:
        positional, keywords = split(args)
        supports = _cpu_supports.get(op)
        if supports is None or supports(*positional, **keywords):
            return _cpu_impls[op](*positional, **keywords)
        return reference(*positional, **keywords)

    def fake_of_all(*args: Any) -> torch.Tensor:
        positional, keywords = split(args)
        return fake(*positional, **keywords)

    schema = torch.library.infer_schema(reference, mutates_args=()).replace("*, ", "")
    _LIBRARY.define(op + schema)
    _LIBRARY.impl(op, choose_when_run, "CPU")
    torch.library.register_fake(f"trnmodels::{op}", fake_of_all, lib=_LIBRARY)
    runtime = getattr(torch.ops.trnmodels, op).default

    def call(*args: Any, **kwargs: Any) -> Any:
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        return runtime(*bound.arguments.values())

    return call


def _traced_at_run_time(op: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether this call of ``op`` is traced as ``trnmodels::<op>``: inside ``torch.compile`` (not
    ``torch.export``), a CPU call with an enabled kernel and no gradient to record (custom ops carry
    none)."""
    first = _first_tensor(args)
    return (
        op in _cpu_runtime_ops
        and torch.compiler.is_compiling()
        and not torch.compiler.is_exporting()
        and first is not None
        and first.is_cpu
        and current_backend() != "torch"
        and op in _enabled()
        and not (
            torch.is_grad_enabled()
            and any(isinstance(a, torch.Tensor) and a.requires_grad for a in (*args, *kwargs.values()))
        )
    )


def _bind(
    caller: str,
    impls: dict[str, Callable[..., Any]],
    predicates: dict[str, Callable[..., bool]],
    op: str,
    impl: Callable[..., Any],
    supports: Callable[..., bool] | None,
) -> None:
    if op not in _REFERENCES:
        raise ConfigError(f"{caller}: unknown op {op!r}; known ops: {sorted(_REFERENCES)}")
    impls[op] = impl
    if supports is None:
        predicates.pop(op, None)
    else:
        predicates[op] = supports


def cpu_kernels_enabled() -> list[str]:
    """The ops whose CPU kernel ``TRNMODELS_CPU_KERNELS`` enables (``all``, ``none`` or a list of ops)."""
    return list(_enabled())


def cpu_kernel_enabled(op: str) -> bool:
    """Whether ``op``'s CPU kernel may run: not turned off by ``TRNMODELS_KERNEL_BACKEND=torch`` or left
    out of ``TRNMODELS_CPU_KERNELS`` (a kernel of another library standing in for it asks the same)."""
    return current_backend() != "torch" and op in _enabled()


def cpu_kernels_in_graphs() -> list[str]:
    """The enabled CPU kernels a CPU graph capture takes: part of what a compiled graph computes."""
    if current_backend() == "torch":
        return []
    return [op for op in _enabled() if op in _cpu_in_graphs]


def _enabled() -> tuple[str, ...]:
    value = os.environ.get(CPU_KERNELS_ENV_VAR, "all")
    if torch.compiler.is_compiling():
        # A trace runs this once per call site and keeps the answer; through the cache Dynamo would
        # warn that it ignores it.
        return _parse_enabled(value, _cpu_kernel_names)
    return _enabled_kernels(value, _cpu_kernel_names)


# (the settings it was computed from, the answer) of ``_eager_auto_kernels``.
_read_backend = environ_reader(ENV_VAR)
_read_cpu_kernels = environ_reader(CPU_KERNELS_ENV_VAR)
_eager_auto: tuple[tuple[Any, ...], frozenset[str] | None] | None = None


def _eager_auto_kernels() -> frozenset[str] | None:
    """For an eager call: the ops whose CPU kernel may run when the backend is ``auto``, or None when it is
    forced (the general selection then decides). Recomputed only when a setting changes: an eager decode
    step asks for every op it runs, and reading and parsing the settings each time cost more than the call
    it dispatches (a one-row linear layer)."""
    global _eager_auto
    settings = (_forced, _read_backend(), _read_cpu_kernels(), _cpu_kernel_names)
    if _eager_auto is None or _eager_auto[0] != settings:
        # Both raise on a bad setting, and nothing is remembered until the settings are good.
        kernels = frozenset(_enabled()) if current_backend() == "auto" else None
        _eager_auto = (settings, kernels)
    return _eager_auto[1]


def _parse_enabled(value: str, kernels: tuple[str, ...]) -> tuple[str, ...]:
    value = value.strip()
    if value == "all":
        return kernels
    if value == "none":
        return ()
    names = [name.strip() for name in value.split(",") if name.strip()]
    unknown = [name for name in names if name not in kernels]
    if unknown:
        raise ConfigError(
            f"{CPU_KERNELS_ENV_VAR}: no CPU kernel for {unknown}; expected 'all', 'none' or a "
            f"comma-separated list of {list(kernels)}"
        )
    return tuple(sorted(names))


# Cached: calls outside ``_eager_auto_kernels``'s fast path (forced backends, NKI adapters) ask per call.
_enabled_kernels = functools.lru_cache(maxsize=16)(_parse_enabled)


def _nki_impl(op: str) -> Callable[..., Any] | None:
    # Only explicitly registered adapters: a raw nki-library kernel does not take our op's layouts.
    return _nki_impls.get(op) if neuron.sdk_available() else None


def _first_tensor(args: tuple[Any, ...]) -> torch.Tensor | None:
    for arg in args:
        if isinstance(arg, torch.Tensor):
            return arg
    return None


def _cpu_kernel_runs(
    op: str, first: torch.Tensor | None, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> bool:
    return (
        op in _cpu_impls
        # A captured graph keeps the reference unless the kernel is static: CPU kernels may branch on
        # values (token-sparse MoE).
        and (op in _cpu_in_graphs or not torch.compiler.is_compiling())
        and op in _enabled()
        and _cpu_kernel_accepts(op, first, args, kwargs)
    )


def _cpu_kernel_accepts(
    op: str, first: torch.Tensor | None, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> bool:
    """The call's own conditions for ``op``'s CPU kernel: CPU tensors, and the kernel's predicate."""
    supports = _cpu_supports.get(op)
    return first is not None and first.is_cpu and (supports is None or supports(*args, **kwargs))


def select_backend(op: str, *args: Any, supports: Callable[..., bool] | None = None, **kwargs: Any) -> str:
    """Which backend runs this call of ``op``: ``"torch"``, ``"nki"`` or ``"cpu"``."""
    return _select(current_backend(), op, args, kwargs, supports)


def _select(
    mode: str, op: str, args: tuple[Any, ...], kwargs: dict[str, Any], supports: Callable[..., bool] | None
) -> str:
    if mode == "torch":
        return "torch"
    first = _first_tensor(args)
    if mode == "auto" and op not in _nki_impls:
        # No NKI adapter for the op: only the CPU kernel's conditions are left to ask (every eager op of
        # a CPU decode step comes here, so the Neuron checks are skipped, not made).
        return "cpu" if _cpu_kernel_runs(op, first, args, kwargs) else "torch"
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
    return "cpu" if _cpu_kernel_runs(op, first, args, kwargs) else "torch"


def kernel_op(
    name: str, supports: Callable[..., bool] | None = None
) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Make a PyTorch reference function the public op ``name``, dispatching to NKI or a CPU kernel where
    one can run."""

    def wrap(reference: Callable[P, R]) -> Callable[P, R]:
        _REFERENCES[name] = reference

        @functools.wraps(reference)
        def op(*args: P.args, **kwargs: P.kwargs) -> R:
            # is_compiling first: eager calls (every decode step's linear layers) pay one cheap check.
            if torch.compiler.is_compiling() and _traced_at_run_time(name, args, kwargs):
                inline = _cpu_inline.get(name)
                traced = inline(*args, **kwargs) if inline is not None else None
                return traced if traced is not None else _cpu_runtime_ops[name](*args, **kwargs)
            # Every eager op of a CPU step comes here: with the backend on "auto" and no NKI adapter for the
            # op, only the CPU kernel's own conditions are left to ask (``_select``'s, 2 us a call faster).
            kernels = None if torch.compiler.is_compiling() else _eager_auto_kernels()
            if kernels is not None and name not in _nki_impls:
                if (
                    name in kernels
                    and name in _cpu_impls
                    and _cpu_kernel_accepts(name, _first_tensor(args), args, kwargs)
                ):
                    return _cpu_impls[name](*args, **kwargs)
                return reference(*args, **kwargs)
            # The mode is read once per call: each read of the environment costs about 0.7 us.
            mode = current_backend()
            if name not in _cpu_impls and name not in _nki_impls and mode != "nki":
                # No kernel to choose (a forced "nki" still asks select_backend, which raises).
                return reference(*args, **kwargs)
            backend = _select(mode, name, args, kwargs, supports)
            if backend == "nki":
                return _nki_impls[name](*args, **kwargs)
            if backend == "cpu":
                return _cpu_impls[name](*args, **kwargs)
            return reference(*args, **kwargs)

        op.reference = reference  # type: ignore[attr-defined]
        return op

    return wrap


def registered_ops() -> list[str]:
    return sorted(_REFERENCES)
