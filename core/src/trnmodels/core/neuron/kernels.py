"""Which nki-library kernel backs which functional op. Imported only where the SDK imports.

Each entry is ``op name -> (module, attribute)``; the kernel is resolved lazily the first time the op
dispatches to it. A model that needs a kernel not listed here (phase 2 of onboarding) adds a binding with
``bind_kernel`` from its own package, under the same kernel-selection switch.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

NKILIB_BINDINGS: dict[str, tuple[str, str]] = {
    "rms_norm": ("nkilib.core.normalization", "rmsnorm"),
    "gated_mlp": ("nkilib.core.mlp", "mlp"),
    "prefill_attention": ("nkilib.core.attention", "attention_cte"),
    "decode_attention": ("nkilib.core.attention", "attention_tkg"),
}


def resolve(op: str) -> Callable[..., object]:
    module, attr = NKILIB_BINDINGS[op]
    return getattr(importlib.import_module(module), attr)
