"""Skip markers shared by the packages' tests."""

from __future__ import annotations

import pytest

from ..cpu import extension


def needs_cpu_extension(what: str = "core's C++ kernels") -> pytest.MarkDecorator:
    """Skip where core's C++ library (the BF16 and FP32 GEMMs, decode attention) cannot be built or run, saying why."""
    reason = extension.why_unavailable()
    return pytest.mark.skipif(reason is not None, reason=f"{what}: {reason}")
