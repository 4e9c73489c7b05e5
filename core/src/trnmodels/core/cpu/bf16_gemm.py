"""Core's BF16 GEMM for CPUs with AVX512-BF16 or AVX2: a weight packed once into panels of 32 output
columns, then one C++ kernel (``csrc/bf16_gemm.cpp``) for every row count, FP32 sums rounded once to BF16.

Why our own: at decode sizes a BF16 linear layer only streams its weight, so it should read at the
memory's speed. oneDNN's packed matmul (vLLM's CPU GEMM on a CPU without AMX) does not: on the llama3
bench config's weights it read 17-21 GB/s at one to eight rows in two runs (read streams of 31 and
56 GB/s), ``F.linear`` 9-11. The panel layout makes every panel one sequential stream and needs no
horizontal sums: 22-38 GB/s there, 1.24-1.93x oneDNN's, 1.1x at 16 rows; from 32 rows both are bound
by ``VDPBF16PS`` arithmetic and run as fast (0.94-1.07x; ``docs/benchmarks/bf16-gemm.md``,
``nox -s bench-gemm``). Used by the vLLM bridge and by the runner's eager models (``cpu.packed_layers``).

A CPU without AVX512-BF16 has no BF16 arithmetic. On an AVX2 one (an AMD Zen 3 here) torch's BF16
``F.linear`` converts inside its inner loop, and vLLM's oneDNN matmul cannot be built for BF16, so vLLM
falls back to ``F.linear``: on the same weights it read 14.0 GB/s at one row and 2.1 at eight, a 30.8 GB/s read
stream. The AVX2 build reads the same packed weight. It widens each BF16 pair to FP32 in registers
(a mask and a shift), then does two FMAs in ``VDPBF16PS``'s order; rows share a load two at a time.
It read 22.0 GB/s at one row, 10.2 at eight, and 4.9-7.6x ``F.linear`` from 8 to 512 rows
(``docs/benchmarks/bf16-gemm-avx2.md``).

The kernel is part of core's C++ library (``extension``: built once per instruction set and cached;
``extension.why_unavailable`` says why it cannot run). ``TRNMODELS_BF16_GEMM_ISA=avx2`` runs the AVX2
build on a CPU with AVX512-BF16 (to bisect a difference, and so that its tests run there).
"""

from __future__ import annotations

import torch

from . import extension


def _gemm_shape(x: torch.Tensor, packed: torch.Tensor, n: int) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], n))


extension.register_fake("bf16_gemm", _gemm_shape)


def pack(weight: torch.Tensor) -> torch.Tensor:
    """``weight`` [N, K] (BF16) in the kernel's layout: [ceil(N/32), ceil(K/2), 32, 2], zero-padded."""
    _require()
    return torch.ops.trnmodels_cpu.bf16_gemm_pack(weight)


def gemm(x: torch.Tensor, packed: torch.Tensor, n: int) -> torch.Tensor:
    """``x @ weight.T`` for ``packed = pack(weight)`` and ``n = weight.shape[0]``; ``x`` [..., K] BF16."""
    return torch.ops.trnmodels_cpu.bf16_gemm(x, packed, n)


def _require() -> None:
    reason = extension.why_unavailable()
    if reason is not None:
        raise RuntimeError(f"core's BF16 GEMM cannot run: {reason}")
