"""Core's FP32 GEMM for compiled graphs: a weight packed once into panels of 32 output columns, then one
C++ kernel (``csrc/fp32_gemm.cpp``) for every row count, as the BF16 GEMM (``cpu.bf16_gemm``) does for BF16.

Why our own: a compiled FP32 decode step only streams its weights, and in the graphs each one-row product
was Inductor's reduction over the plain weight, one output at a time, which read SmolLM2-135M's weights at
23-26 GB/s against a 29-33 GB/s read stream; MKL's SGEMV read them at 13. Each panel of the packed weight
is one sequential stream and needs no horizontal sums: one row read them at 27 GB/s, two at 27, eight at
15 (the graphs' few-rows reductions: 6-8). From 64 rows it runs as a GEMM that kept up with MKL's SGEMM
(0.94-1.1x). So compiled FP32 graphs read one packed copy of each linear weight for every row count
(``cpu.packed_layers.pack_for_graphs``); eager FP32 calls keep torch's GEMMs (``cpu.linear``).

Each output is one FP32 FMA chain over K, in order: the error of a sequential sum, which the tests bound
against a float64 truth.
"""

from __future__ import annotations

import torch

from . import extension


def _gemm_shape(x: torch.Tensor, packed: torch.Tensor, n: int) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], n))


extension.register_fake("fp32_gemm", _gemm_shape)


def pack(weight: torch.Tensor) -> torch.Tensor:
    """``weight`` [N, K] (FP32) in the kernel's layout: [ceil(N/32), K, 32], the last panel zero-padded."""
    reason = extension.why_unavailable()
    if reason is not None:
        raise RuntimeError(f"core's FP32 GEMM cannot run: {reason}")
    return torch.ops.trnmodels_cpu.fp32_gemm_pack(weight)


def gemm(x: torch.Tensor, packed: torch.Tensor, n: int) -> torch.Tensor:
    """``x @ weight.T`` for ``packed = pack(weight)`` and ``n = weight.shape[0]``; ``x`` [..., K] FP32."""
    return torch.ops.trnmodels_cpu.fp32_gemm(x, packed, n)
