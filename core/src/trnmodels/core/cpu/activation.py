"""GELU with the tanh approximation on the CPU: the same function through a sigmoid, for FP32 calls.

``0.5 x (1 + tanh(u)) = x σ(2u)`` with ``u = √(2/π) (x + 0.044715 x³)``. torch's vectorised ``tanh`` is
slow on this machine's AMD EPYC (AVX512): ``F.gelu(x, approximate="tanh")`` over a Wan FFN's
``[320, 2048]`` FP32 activations took 0.75–0.98 ms (2 threads), the sigmoid form 0.34–0.40 ms; in a
captured graph, where Inductor vectorises either, 0.61 ms against 0.20 ms, and the compiled Wan DiT
step spent 2.3 ms of its 67 ms in its four FFN activations. The sigmoid form has no cancellation
(``σ(2u)`` multiplies ``x``, it is not subtracted from 1), and its largest error against a float64 truth
was 5.2e-7 against ``F.gelu``'s 4.3e-7 over values up to 12 (FP32's spacing there is 9.5e-7); infinities
and NaN come out as ``F.gelu``'s. It is static, so the CPU graphs take it too. Only FP32: in BF16 the
reference computes in float32 and rounds once, which a chain of BF16 ops would not.
"""

from __future__ import annotations

import math

import torch

from ..ops.dispatch import register_cpu

# 2u = x (A + B x²), the constants of the tanh approximation folded once.
A = 2 * math.sqrt(2 / math.pi)
B = A * 0.044715


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    """``ops.gelu_tanh`` of an FP32 tensor as ``x σ(2u)``."""
    return x * torch.sigmoid(x * (A + B * x * x))


def _fp32(x: torch.Tensor) -> bool:
    return x.dtype == torch.float32


register_cpu("gelu_tanh", gelu_tanh, supports=_fp32, in_graphs=True)
