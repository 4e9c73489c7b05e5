"""Which NKI kernel adapters a process binds: named explicitly by configuration, never by building a model.

Kernel dispatch is process-wide (``ops.register_nki``): an adapter bound as a side effect of building one
model would change the kernels of every other model in the process. So adapters are bound only when the
runtime configuration names them, ``TRNMODELS_NKI_ADAPTERS=attention_cte[,...]`` (read by
``build_model``), or when a caller passes the names to ``register_adapters``; and only where the Neuron SDK
imports. Names are the keys of ``NKI_ADAPTERS``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from .. import neuron, ops
from ..errors import ConfigError
from . import attention_cte

ENV_VAR = "TRNMODELS_NKI_ADAPTERS"


@dataclass(frozen=True)
class NkiAdapter:
    """A kernel binding: the op it serves, the argument conversion, and its shape predicate."""

    op: str
    impl: Callable[..., Any]
    supports: Callable[..., bool] | None = None


NKI_ADAPTERS: dict[str, NkiAdapter] = {
    "attention_cte": NkiAdapter(
        "prefill_attention", attention_cte.attention_cte_adapter, attention_cte.supports
    ),
}


def configured_adapters() -> tuple[str, ...]:
    """The adapter names ``TRNMODELS_NKI_ADAPTERS`` lists (comma-separated; unset or empty: none)."""
    return tuple(name.strip() for name in os.environ.get(ENV_VAR, "").split(",") if name.strip())


def register_adapters(names: Iterable[str]) -> list[str]:
    """Bind the named adapters to their ops where the Neuron SDK imports; returns the names bound.

    An unknown name is an error everywhere (a typo must not silently leave the reference running)."""
    names = list(names)
    unknown = sorted(set(names) - set(NKI_ADAPTERS))
    if unknown:
        raise ConfigError(f"{ENV_VAR}: unknown NKI adapters {unknown}; known: {sorted(NKI_ADAPTERS)}")
    if not neuron.sdk_available():
        return []
    for name in names:
        adapter = NKI_ADAPTERS[name]
        ops.register_nki(adapter.op, adapter.impl, supports=adapter.supports)
    return names


def register_configured_adapters() -> list[str]:
    """``register_adapters`` over the names the runtime configuration gives (``TRNMODELS_NKI_ADAPTERS``)."""
    return register_adapters(configured_adapters())
