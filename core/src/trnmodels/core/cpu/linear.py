"""Half-precision linear layers computed in FP32 on a CPU without half-precision arithmetic.

Without AVX512-BF16 or AMX (an AVX2 CPU such as this machine's AMD EPYC), a BF16 matmul converts its
operands in software inside the GEMM's inner loop, at a cost per multiply-add; converting both operands
to FP32 first costs one pass over the weight, then the FP32 GEMM runs at full speed. Measured here
(2 threads; ms, BF16 ``F.linear`` → operands converted first):

| weight (N × K) | 8 rows | 32 rows | 128 rows |
|---|---|---|---|
| 1024 × 512 | 0.29 → 0.28 | 1.15 → 0.50 | 4.9 → 1.3 |
| 4096 × 1024 | 2.1 → 6.9 | 8.3 → 8.5 | 34.7 → 11.0 |

So a call of ``MIN_ROWS`` rows or more (a prefill, a large decode batch) runs in FP32; fewer rows
(decode, memory-bound) stay BF16. The result is rounded to BF16 once, as a BF16 GEMM rounds its FP32
accumulator once.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from ..ops.dispatch import register_cpu

# From this many rows converting first is no slower for a weight outside the caches (the table above).
MIN_ROWS = 32


@functools.cache
def bf16_in_hardware() -> bool:
    """Whether this CPU multiplies BF16 natively (AVX512-BF16 or AMX), as oneDNN's BF16 GEMMs need."""
    return torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()


def upcast_pays(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> bool:
    """Whether ``x @ weight`` runs faster in FP32 here: BF16 operands, enough rows, no BF16 hardware."""
    rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
    return (
        x.dtype == torch.bfloat16
        and weight.dtype == torch.bfloat16
        and rows >= MIN_ROWS
        and not bf16_in_hardware()
    )


def matmul(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``x @ weight``, in FP32 and rounded once where ``upcast_pays`` (the MoE kernel's expert matmuls)."""
    if upcast_pays(x, weight):
        return (x.float() @ weight.float()).to(x.dtype)
    return x @ weight


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``ops.linear`` in FP32, rounded once to ``x``'s dtype."""
    return F.linear(x.float(), weight.float(), None if bias is None else bias.float()).to(x.dtype)


register_cpu("linear", linear, supports=upcast_pays)
