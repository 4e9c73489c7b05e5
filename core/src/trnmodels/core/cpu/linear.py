"""Linear layers on the CPU: one-row FP32 calls through oneDNN, a few rows against a large weight as a
swapped SGEMM (in captured graphs, one row and five to eight rows are reductions Inductor fuses), and BF16
computed in FP32 where faster. On an Intel CPU, where MKL's SGEMM runs its own tuned kernels, eager calls
keep it but for five or more rows against a large weight (see the notes at the end of the FP32 part).

FP32: ``F.linear`` runs MKL's SGEMM, which packs the weight into its own blocked layout on every call.
With one row (a batch-1 decode step) the packing is most of the call. oneDNN's inner product
(``torch.ops.mkldnn._linear_pointwise``, the kernel Inductor's own CPU freezing passes use) reads the
plain weight in place. Measured here (2 threads, one row; ms, ``F.linear`` → oneDNN): 4096 × 768,
0.73 → 0.24; 32000 × 768 (an LM head), 9.5 → 5.9; 768 × 2048, 0.14 → 0.12.

Only one row: from two rows on oneDNN sums in a coarser order than SGEMM. Its largest error against a
float64 truth was 2–4× SGEMM's at every shape measured here (2 to 256 rows; 1536 × 576, 576 × 1536,
49152 × 576, 4096 × 768), while at one row it was 0.5–0.7× SGEMM's. Over SmolLM2's 30 layers the
multi-row difference added up to FP32 logits 1.6e-4 from transformers' (the parity bound is 1e-4;
SGEMM stays at 8e-5). So a call of two or more FP32 rows keeps an SGEMM: no accuracy is traded for speed.

A few FP32 rows against a large weight (a batch-8 decode step, an LM head) run the same SGEMM with the
operands swapped, ``(weight @ x.T).T``: MKL then packs the few rows instead of the weight. Its error
against a float64 truth was SGEMM's own at every shape measured (equal from 16 rows on, within
0.5–1.6× of it below). Measured here (2 threads; ms, ``F.linear`` with bias → swapped):

| weight (N × K) | 2 rows | 8 rows | 32 rows | 64 rows |
|---|---|---|---|---|
| 49152 × 576 (SmolLM2's LM head) | 18.7 → 5.2 | 20.9 → 9.5 | 30.1 → 20.8 | 42.8 → 43.4 |
| 5760 × 2880 | 5.9 → 3.4 | 7.7 → 5.6 | 12.6 → 9.7 | 20.1 → 16.2 |
| 4096 × 768 | 0.71 → 0.45 | 1.11 → 0.99 | 2.09 → 1.78 | 3.53 → 2.88 |
| 2048 × 768 | 0.30 → 0.22 | 0.42 → 0.47 | 0.88 → 0.74 | 1.48 → 1.33 |
| 1536 × 576 | 0.16 → 0.13 | 0.27 → 0.29 | 0.52 → 0.46 | 0.85 → 0.80 |

So weights of ``SWAP_MIN_WEIGHT`` elements or more (8 MB in FP32, past this CPU's caches; smaller ones
lose at 8 rows) swap from 2 to ``SWAP_MAX_ROWS`` rows (at 64 the LM head breaks even, from 128 it loses).

Up to ``SWAP_FEW_ROWS`` rows, smaller weights swap too. The table above times one weight over and over,
from the caches; in a decode step every weight comes from memory. With cold weights (a new weight every
call, 300 MB of them) MKL's SGEMM read a weight at 5–10 GB/s with 2 rows (a call took longer than one of
8 rows), the swapped call at 17–30 GB/s. Speed-up of the swapped call (2 threads; cold, then hot):

| weight (N × K) | 2 rows | 3 rows | 4 rows | 6 rows |
|---|---|---|---|---|
| 256 × 256 | 2.61×, 0.91× | 2.08×, 0.80× | 2.22×, 0.85× | 1.45×, 0.68× |
| 512 × 512 | 2.91×, 1.17× | 3.92×, 1.43× | 2.65×, 1.50× | 0.88×, 0.95× |
| 576 × 576 | 2.55×, 0.93× | 2.02×, 1.24× | 2.02×, 1.69× | 1.27×, 0.76× |
| 3072 × 576 | 3.48×, 1.47× | 3.44×, 1.36× | 2.11×, 1.56× | 1.46×, 0.75× |
| 576 × 1536 | 1.71×, 1.35× | 1.83×, 1.32× | 1.14×, 1.51× | 0.71×, 0.85× |
| 4096 × 768 | 5.11×, 1.15× | 4.87×, 1.46× | 2.83×, 2.04× | 1.27×, 0.95× |
| 768 × 2048 | 2.38×, 1.18× | 1.90×, 1.18× | 1.20×, 1.79× | 0.78×, 1.07× |

So from ``SWAP_FEW_ROWS_MIN_WEIGHT`` elements (512 × 512) calls of 2 to 4 rows swap. On the runner's
default batch buckets (1, 2, 4, 8), eager decode of SmolLM2-135M went from 100.5 to 43.6 ms a step at
batch 2 and from 81.6 to 58.5 at batch 4; the llama3 bench config's from 25.5 to 21.2 and from 27.6 to
23.4 (the same tokens; medians of 3, old and new code taking turns).

From 5 rows the gain depends on the weight's width K, not its size: with cold weights (200 MB of them,
a new one every call), the swapped call's speed-up over ``F.linear`` (2 threads; N = 576, 1536, 3072 in each cell):

| K | 5 rows | 6 rows | 8 rows | 12 rows | 16 rows |
|---|---|---|---|---|---|
| 576 | 1.72, 1.96, 2.20 | 1.38, 2.20, 2.60 | 1.29, 1.55, 1.65 | 0.76, 0.77, 0.80 | 1.00, 1.15, 1.09 |
| 768 | 1.79, 1.73, 1.87 | 1.54, 1.81, 1.89 | 1.08, 1.06, 1.24 | 0.77, 0.74, 0.88 | 1.13, 1.13, 1.10 |
| 1024 | 1.12, 0.99, 1.30 | 1.09, 1.28, 1.52 | 1.03, 1.01, 1.09 | 0.84, 0.88, 0.86 | 1.22, 1.12, 1.32 |
| 1152 | 1.25, 0.99, 1.28 | 1.07, 1.20, 1.52 | 0.93, 0.99, 0.96 | | |
| 1536 | 0.72, 0.96, 1.04 | 0.70, 0.79, 0.97 | 0.71, 0.81, 0.84 | | |
| 2048 | 0.95, 1.06, 1.26 | 0.82, 0.85, 1.06 | 0.89, 0.89, 0.92 | | |

So calls of 5 to ``SWAP_NARROW_MAX_ROWS`` rows swap from the same size when the weight is at most
``SWAP_NARROW_MAX_K`` wide (SmolLM2's projections but its MLP's down projection; a batch-8 eager decode
step); at 12 rows none gains, so larger calls keep the size rule above. The errors against a float64
truth were SGEMM's own (at 8 rows, 3072 × 576: 3.5e-5 swapped, 4.1e-5 not). Eager decode at batch 8
went from 93.3 to 70.9 ms a step on SmolLM2-135M, from 41.1 to 39.0 on the llama3 bench config (the
same tokens; medians of 5, the two rules taking turns in one process).

The call is static (no branch on values; the row count is part of a graph's static shape), so graph
capture for the CPU takes it too. A captured one-row call is not oneDNN's, though: it is a product and a
sum, ``(x.unsqueeze(-2) * weight).sum(-1)``, which Inductor fuses into one vectorised reduction over each
weight row, parallel over the rows, streaming the weight once with nothing materialised. It reads the
weight faster than oneDNN's inner product (median GB/s of FP32 weight read, 2 threads, oneDNN →
Inductor: 32000 × 768, 29.7 → 34.0; 4096 × 768, 23.6 → 30.4; 768 × 2048, 23.1 → 31.1; 1536 × 768,
30.0 → 33.5), and its error against a float64 truth was at or below oneDNN's at each of those shapes
and SmolLM2's (max 2.0e-5 against 2.5e-5 on the LM head; SGEMM's 3.6e-5). On the llama3 bench config
(FP32), the compiled batch-1 decode went from 87.0 to 109.3 tok/s, A/B in one process. Under
vLLM's compile the row count is symbolic, so there the choice is made when the call runs (the custom op
``trnmodels::linear``, see ``ops.dispatch``).

That one row is realised in a buffer of its own first (``inductor_force_stride_order``): fused into the
reduction, its producer (the RMSNorm before a QKV projection or the LM head) was recomputed for every
weight row, 4 loads and 5 vector operations per 16 weights where the reduction needs 2 loads and a
multiply-add. That compute hides behind the memory while the machine streams slowly and shows when it
streams fast. Compiled batch-1 decode, ms a step (one process, the two sets of graphs taking turns,
medians of 9–15, the same tokens): the llama3 bench config 7.81 → 7.20 and 8.10 → 7.69 with the copy
stream at 49–55 GB/s, 11.40 → 10.92 and 10.15 → 9.96 at 32–50, 11.05 → 11.39 at about 34; SmolLM2-135M
17.56 → 16.42 at 48–52, 22.23 → 20.05 and 17.35 → 18.23 at 34–59, 22.06 → 22.22 at 32–34.

A captured call of ``SWAP_FEW_ROWS + 1`` to ``REDUCTION_MAX_ROWS`` FP32 rows (a batch-8 decode step) is
a reduction too, ``(weight.unsqueeze(1) * x).sum(-1)``: Inductor reads each weight row once, from memory,
and sums it against every row of ``x`` from the caches. MKL's SGEMM of so few rows read a weight from
memory at 5–10 GB/s, whichever operand it packed. First ``x`` is realised in a row-major buffer of its
own (``inductor_force_stride_order``): without that Inductor fused the producer (a norm) into the
reduction and laid the residual stream out transposed, and each layer's kernel took about 14.5 ms where
it had taken 1.5. Median GB/s of FP32 weight read in a compiled norm-then-projection (2 threads, cold
weights; SGEMM, swapped SGEMM → reduction):

| weight (N × K) | 5 rows | 6 rows | 8 rows |
|---|---|---|---|
| 4096 × 768 | 7.4, 10.3 → 12.7 | 8.2, 13.2 → 17.2 | 6.3, 6.2 → 11.2 |
| 768 × 2048 | 6.4, 10.0 → 14.9 | 9.5, 8.5 → 13.3 | 9.2, 7.8 → 10.8 |
| 32000 × 768 | 4.8, 17.7 → 19.0 | 5.6, 13.5 → 17.8 | 6.5, 10.1 → 12.3 |
| 1024 × 768 | 9.5, 13.7 → 15.5 | 9.4, 10.8 → 13.1 | 8.3, 6.3 → 8.9 |

The result comes back row-major through ``inductor_force_stride_order`` too, not ``.contiguous()``:
in a prefill graph (its LM head runs on the 8 sampled rows) Inductor reused the [N, M] reduction's
buffer for the row-major copy and copied it onto itself, so the logits came back transposed
(``models/llama3/tests/test_generate.py`` compiles 8-row graphs against the eager steps).

Its largest error against a float64 truth was about half SGEMM's at each of them (each output is one
sequential sum over K in 16 lanes). It stays short of the copy bandwidth because that sum is one chain
of dependent adds per output, eight per weight row at 8 rows. Compiled batch-8 decode, ms a step
(medians of 3, old and new code taking turns in fresh processes, the same tokens): the llama3 bench
config 43.7, 36.5, 42.4 → 27.7, 29.0, 30.2; SmolLM2-135M 73.6, 67.7, 72.8 → 48.1, 59.7, 56.7. At 2 and 4
rows the swapped SGEMM was as fast in the model (llama3 bench, batch 2: 12.8, 12.6 → 9.9, 12.6 ms; batch
4: 18.9, 20.7 → 21.8, 21.1), so those calls keep it.

Inductor keeps one vector accumulator per output, so an output's sum over a whole row of 768 is one chain
of 48 dependent vector adds, and the reduction waited on those chains rather than on memory. So each
output is summed in ``reduction_chunks(K)`` runs of at least ``REDUCTION_CHUNK`` elements (whole 16-lane
vectors), then the runs' sums are added: short chains of independent outputs overlap in the CPU. Median
GB/s of FP32 weight read on the Xeon (2 threads, cold weights, a norm before it; one run → the chosen
runs): at 8 rows, 4096 × 768 (4 runs) 9.0 → 12.1, 32000 × 768 (4) 9.4 → 13.0, 1280 × 768 (4) 8.7 →
11.5, 3072 × 576 (3) 8.4 → 10.6, 768 × 2048 (8) 9.0 → 10.1, 576 × 1536 (8) 9.4 → 10.1; at 6 rows, 4096 ×
768 10.4 → 12.7. Shorter runs lost again (4096 × 768: 8 runs 11.1, 16 runs 9.8), each run ending in a
sum across the vector's lanes. The error fell too: its root mean square against a float64 truth at 8
rows of 768 went from 1.44e-7 to 1.05e-7 (SGEMM's 1.42e-7). Compiled batch-8 decode, ms a step (one
process, the two sets of graphs taking turns, medians of 5, the same tokens): the llama3 bench config
32.29 → 24.98 (HF eager 37.88), SmolLM2-135M 57.15 → 47.19 (HF 80.11). One-row reductions stay whole:
runs gained nothing there (4096 × 768: 18.4 GB/s whole, 17.6 in 4 runs).

oneDNN has no backward here and no BF16 inner product on a CPU without BF16 arithmetic, so calls needing
either keep the reference or the path below.

On an Intel CPU (a 2-vCPU Xeon with AMX) MKL runs its own tuned kernels, and the choices above, measured
on an AMD EPYC where it takes generic code paths, mostly lose. ms a call (2 threads, a new weight every
call, 300 MB of them; ``F.linear``, oneDNN, swapped):

| weight (N × K) | 1 row | 2 rows | 4 rows | 8 rows |
|---|---|---|---|---|
| 4096 × 768 | 0.47, 0.50, 0.48 | 0.49, 0.64, 1.11 | 0.85, 0.72, 1.13 | 1.11, 0.76, 1.12 |
| 768 × 2048 | 0.22, 0.34, 0.21 | 0.22, 0.31, 0.40 | 0.38, 0.33, 0.40 | 0.49, 0.36, 0.43 |
| 768 × 768 | 0.084, 0.130, 0.088 | 0.086, 0.140, 0.190 | 0.121, 0.151, 0.194 | 0.146, 0.160, 0.197 |
| 32000 × 768 | 3.57, 3.52, 3.40 | 3.51, 4.57, 8.05 | 6.90, 5.03, 8.63 | 10.9, 5.56, 8.56 |

From 5 rows against a weight of ``SWAP_MIN_WEIGHT`` or more the swap gains again (``F.linear`` →
swapped at 5, 8, 16, 32 rows: 32000 × 768 8.6 → 8.1, 12.4 → 8.1, 10.0 → 8.2, 12.5 → 10.9; 5760 × 2880
7.4 → 5.4, 7.4 → 4.9, 7.7 → 4.6, 8.8 → 6.4; 4096 × 768 1.05 → 1.35, 1.29 → 1.21, 1.17 → 1.28, 1.52 →
1.46). oneDNN's wins at 4 and 8 rows sum in its coarser order (above), so they are not taken. There
(``sgemm_tuned``) eager FP32 calls of one to four rows keep ``F.linear``, and so do narrower weights;
only 5 to ``SWAP_MAX_ROWS`` rows against a large weight swap. On the llama3 bench config the eager
batch-1 decode step went from 21.7 to 16.8 ms (HF: 16.3), A/B in one process. Captured graphs keep
their reductions, Inductor's own code on every CPU.

BF16:

Without AVX512-BF16 or AMX (an AVX2 CPU, or the AMD EPYC the FP32 figures above were measured on), a
BF16 matmul converts its operands in software inside the GEMM's inner loop, at a cost per multiply-add; converting both operands
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

import torch
import torch.nn.functional as F

from ..ops.dispatch import register_cpu
from .packed import PackedGemm, packed_gemm, traceable_gemm

# From this many rows converting first is no slower for a weight outside the caches (the table above).
MIN_ROWS = 32
# FP32 calls of 2..SWAP_MAX_ROWS rows against a weight this large run the swapped SGEMM (the tables above);
# calls of up to SWAP_FEW_ROWS rows swap from SWAP_FEW_ROWS_MIN_WEIGHT elements.
SWAP_MAX_ROWS = 32
SWAP_MIN_WEIGHT = 2**21
SWAP_FEW_ROWS = 4
SWAP_FEW_ROWS_MIN_WEIGHT = 2**18
# ...and calls of up to SWAP_NARROW_MAX_ROWS rows from the same size when at most SWAP_NARROW_MAX_K wide.
SWAP_NARROW_MAX_ROWS = 8
SWAP_NARROW_MAX_K = 1024
# FP32 calls of SWAP_FEW_ROWS + 1..REDUCTION_MAX_ROWS rows in a captured graph are a reduction (the notes).
REDUCTION_MAX_ROWS = 8
# ...each output summed in runs of at least REDUCTION_CHUNK elements, in whole AVX-512 vectors (the notes).
REDUCTION_CHUNK = 192
VECTOR_LANES = 16


def _cpu_vendor() -> str:
    """The CPU's vendor as the kernel reports it (``GenuineIntel``, ``AuthenticAMD``), or ``""`` if unknown."""
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("vendor_id"):
                    return line.partition(":")[2].strip()
    except OSError:
        pass
    return ""


# Read once at import: graph capture cannot trace torch's own queries, and the answers never change.
_BF16_IN_HARDWARE = torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()
_ONEDNN = torch.backends.mkldnn.is_available()
# MKL runs its own tuned kernels on Intel CPUs only (elsewhere, generic code paths): there its SGEMM is
# the fastest FP32 call of one to four rows, and oneDNN's inner product and a swap of so few rows lose.
_SGEMM_TUNED = torch.backends.mkl.is_available() and _cpu_vendor() == "GenuineIntel"


def bf16_in_hardware() -> bool:
    """Whether this CPU multiplies BF16 natively (AVX512-BF16 or AMX), as oneDNN's BF16 GEMMs need."""
    return _BF16_IN_HARDWARE


def _rows(x: torch.Tensor) -> int:
    return x.numel() // x.shape[-1] if x.shape[-1] else 0


def upcast_pays(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> bool:
    """Whether ``x @ weight`` runs faster in FP32 here: BF16 operands, enough rows, no BF16 hardware."""
    return (
        x.dtype == torch.bfloat16
        and weight.dtype == torch.bfloat16
        and _rows(x) >= MIN_ROWS
        and not bf16_in_hardware()
    )


def matmul(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``x @ weight`` as ``linear`` computes it (the MoE kernel's expert matmuls)."""
    if _supports(x, weight.mT):
        return linear(x, weight.mT)
    return x @ weight


def _operands(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> tuple[torch.Tensor, ...]:
    return (x, weight) if bias is None else (x, weight, bias)


def _all_fp32(tensors: tuple[torch.Tensor, ...]) -> bool:
    return all(t.dtype == torch.float32 for t in tensors)


def _records_gradient(tensors: tuple[torch.Tensor, ...]) -> bool:
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


def sgemm_tuned() -> bool:
    """Whether MKL's SGEMM runs its own tuned kernels on this CPU (an Intel CPU): then FP32 calls outside
    captured graphs keep it (``F.linear``), but for 5 to ``SWAP_MAX_ROWS`` rows against a large weight."""
    return _SGEMM_TUNED


def _one_fp32_row(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
    tensors = _operands(x, weight, bias)
    return _rows(x) == 1 and _all_fp32(tensors) and not _records_gradient(tensors)


def onednn_runs(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> bool:
    """Whether oneDNN's inner product computes ``F.linear(x, weight, bias)`` here: one FP32 row, no gradient,
    outside a captured graph, on a CPU where MKL's SGEMM is not tuned (``sgemm_tuned``)."""
    return (
        _ONEDNN and not sgemm_tuned() and not torch.compiler.is_compiling() and _one_fp32_row(x, weight, bias)
    )


def one_row_reduction_pays(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> bool:
    """Whether a captured graph computes ``F.linear(x, weight, bias)`` as a one-row reduction: one FP32 row,
    no gradient (on every CPU: Inductor's reduction streams the weight once, see the notes)."""
    return torch.compiler.is_compiling() and _one_fp32_row(x, weight, bias)


def reduction_pays(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> bool:
    """Whether a captured graph computes ``F.linear(x, weight, bias)`` as a reduction: ``SWAP_FEW_ROWS + 1``
    to ``REDUCTION_MAX_ROWS`` FP32 rows, a row-major weight (streamed row by row), no gradient."""
    tensors = _operands(x, weight, bias)
    return (
        torch.compiler.is_compiling()
        and weight.is_contiguous()
        and _all_fp32(tensors)
        and not _records_gradient(tensors)
        and SWAP_FEW_ROWS < _rows(x) <= REDUCTION_MAX_ROWS
    )


def swap_pays(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> bool:
    """Whether ``F.linear(x, weight, bias)`` runs faster as ``(weight @ x.T).T``: a few FP32 rows, a large
    (or, at up to ``SWAP_NARROW_MAX_ROWS`` rows, a narrow) row-major weight. Where MKL's SGEMM is tuned
    (``sgemm_tuned``) only more than ``SWAP_FEW_ROWS`` rows against a large weight swap (the notes)."""
    rows = _rows(x)
    tuned = sgemm_tuned()
    if rows > SWAP_MAX_ROWS or rows <= (SWAP_FEW_ROWS if tuned else 1):
        return False
    narrow = weight.shape[-1] <= SWAP_NARROW_MAX_K
    from_smaller = not tuned and (rows <= SWAP_FEW_ROWS or (rows <= SWAP_NARROW_MAX_ROWS and narrow))
    return (
        (SWAP_FEW_ROWS < rows if tuned else 2 <= rows)
        and rows <= SWAP_MAX_ROWS
        and weight.numel() >= (SWAP_FEW_ROWS_MIN_WEIGHT if from_smaller else SWAP_MIN_WEIGHT)
        and weight.is_contiguous()
        and _all_fp32(_operands(x, weight, bias))
    )


def _packed_for(weight: torch.Tensor) -> PackedGemm | None:
    # A capture (``torch.export``) cannot read a data pointer; a GEMM packed for graphs is on the parameter.
    return traceable_gemm(weight) if torch.compiler.is_compiling() else packed_gemm(weight)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``ops.linear`` through the GEMM packed for ``weight`` (``cpu.packed``), oneDNN (one FP32 row), as
    a swapped SGEMM (a few FP32 rows, a large weight), or in FP32 rounded once to ``x``'s dtype (BF16)."""
    gemm = _packed_for(weight)
    if gemm is not None:
        return _run_packed(gemm, x, weight, bias)
    if x.dtype != torch.float32:
        return linear(x.float(), weight.float(), None if bias is None else bias.float()).to(x.dtype)
    if reduction_pays(x, weight, bias):
        return _few_rows_reduction(x, weight, bias)
    if one_row_reduction_pays(x, weight, bias):
        return _one_row_reduction(x, weight, bias)
    if onednn_runs(x, weight, bias):
        return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")
    if swap_pays(x, weight, bias):
        rows = x.reshape(-1, x.shape[-1]).mT
        out = torch.mm(weight, rows) if bias is None else torch.addmm(bias[:, None], weight, rows)
        return out.mT.contiguous().view(*x.shape[:-1], weight.shape[0])
    return F.linear(x, weight, bias)


def _in_own_buffer(t: torch.Tensor, stride: list[int]) -> torch.Tensor:
    """``t`` realised in a buffer of its own with ``stride``: a fence Inductor's fusion does not cross."""
    from torch._inductor import inductor_prims  # noqa: F401  (defines prims.inductor_force_stride_order)

    return torch.ops.prims.inductor_force_stride_order(t, stride)


def _one_row_reduction(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """One row in a captured graph: a product and a sum, which Inductor fuses into one vectorised
    reduction that streams the weight once (see the module's notes on one-row calls in graphs)."""
    # Fused, the producer (a norm) would be recomputed for every weight row (see the notes).
    x = _in_own_buffer(x, [*x.stride()])
    out = (x.unsqueeze(-2) * weight).sum(-1)
    return out if bias is None else out + bias


def _few_rows_reduction(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """A few rows in a captured graph: the product and sum with the weight's rows outermost, so Inductor's
    reduction reads each weight row once for all the rows of ``x`` (see the module's notes)."""
    # Row-major and unfused: fused, the norm before it laid the residual stream out transposed (the notes).
    rows = x.reshape(-1, x.shape[-1])
    rows = _in_own_buffer(rows, [rows.shape[-1], 1])
    n, k = weight.shape
    chunks = reduction_chunks(k)
    # Each output sums its row in ``chunks`` independent runs, then adds the partial sums (see the notes).
    out = (weight.view(n, 1, chunks, k // chunks) * rows.view(-1, chunks, k // chunks)).sum(-1).sum(-1).mT
    # Not ``.contiguous()``, which Inductor once turned into a copy of a buffer onto itself (the notes).
    out = _in_own_buffer(out, [out.shape[1], 1])
    out = out if bias is None else out + bias
    return out.reshape(*x.shape[:-1], weight.shape[0])


def reduction_chunks(k: int) -> int:
    """How many runs a captured few-rows reduction splits a weight row of ``k`` into: as many as leave each
    at least ``REDUCTION_CHUNK`` elements long, in whole vectors of ``VECTOR_LANES`` (1 when ``k`` has no
    such split)."""
    if k % VECTOR_LANES:
        return 1
    vectors = k // VECTOR_LANES
    most = max(1, k // REDUCTION_CHUNK)
    return max(c for c in range(1, most + 1) if vectors % c == 0)


def _run_packed(
    gemm: PackedGemm, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    out = gemm(x.reshape(-1, x.shape[-1])).view(*x.shape[:-1], weight.shape[0])
    return out if bias is None else out + bias


def _inline(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor | None:
    """Under ``torch.compile``: a traceable packed GEMM, whose choice no call's size changes, traced inline."""
    gemm = traceable_gemm(weight)
    return None if gemm is None else _run_packed(gemm, x, weight, bias)


def _supports(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> bool:
    # Asked before every eager call: the predicates that cannot hold are skipped (all but the upcast need
    # FP32 operands; the reductions, a capture; oneDNN, eager calls), not evaluated.
    if _packed_for(weight) is not None:
        return True
    if x.dtype != torch.float32:
        return upcast_pays(x, weight, bias)
    if torch.compiler.is_compiling():
        return (
            one_row_reduction_pays(x, weight, bias)
            or reduction_pays(x, weight, bias)
            or swap_pays(x, weight, bias)
        )
    return onednn_runs(x, weight, bias) or swap_pays(x, weight, bias)


def _fake(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


register_cpu("linear", linear, supports=_supports, in_graphs=True, fake=_fake, inline=_inline)
