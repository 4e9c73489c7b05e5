"""Attention on the CPU: decode attention over a paged cache by core's C++ kernel, and unmasked batched
attention through torch's fused kernel; and the reference's BF16 matmuls in FP32 where the CPU has no
BF16 arithmetic (``attention_matmul``).

``ops.decode_attention``'s reference gathers and attends over every block of the bucket's block table,
with a mask hiding the positions past each sequence's length: a static shape for a graph, and a chain of
about twenty small ops (two gathers and transposes, the mask, two batched matmuls, softmax). Captured in a
decode graph, Inductor ran that chain at about 100 us a layer (the llama3 bench config at batch 1, hot in
the caches, in every form it was given: MKL's batched matmuls, reductions, torch's fused attention;
``docs/runner-and-compile.md``). Core's kernel (``csrc/decode_attention.cpp``, ``trnmodels_cpu::
decode_attention``) reads each visible row of the cache in place instead, once per (sequence, KV head), a
group's query heads against it while it is in the caches; it covers sliding windows, softcapping and
sinks, in FP32 and BF16, with the reference's roundings. Static (it branches on no value a graph sees
differently), so the compiled decode graphs call it as they call core's BF16 GEMM, and the cache keys on
it (``graphs_run_core_attention``). One layer of that config, hot, ms a call (eager here, with its ~5 us
of host work; the compiled reference with a compiled call's ~45 us): batch 1 and 70 cached tokens, 0.02-0.03
against 0.23 compiled; batch 8, 0.08-0.13 against 0.64-0.71.

Where the library cannot be built, eager calls gather the blocks the batch has filled
(``ops.gather_paged``) and attend with ``F.scaled_dot_product_attention``: the same softmax terms as the
reference's over the whole bucket (a masked score's weight is exactly 0), each group's query heads as query
rows of their shared K/V head; softcapping and sinks, which the fused kernel has no term for, keep the
reference's arithmetic. Graphs then keep the reference.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from ..kv_cache import cache_rows
from ..ops.attention import decode_attention as reference_op
from ..ops.attention import decode_visible
from ..ops.dispatch import cpu_kernel_enabled, register_cpu
from . import extension, linear


def decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    *,
    scale: float,
    sliding_window: int | None = None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """``ops.decode_attention`` by core's kernel where it runs; else, eagerly, over the first
    ``ceil(max(context_lens) / block_size)`` blocks, and in a graph by the reference."""
    if _core_kernel_fits(q, k_cache, v_cache, sinks):
        return torch.ops.trnmodels_cpu.decode_attention(
            q, k_cache, v_cache, block_tables, context_lens, scale, sliding_window or 0, softcap or 0.0, sinks
        )
    if torch.compiler.is_compiling():
        options = dict(scale=scale, sliding_window=sliding_window, softcap=softcap, sinks=sinks)
        return reference_op.reference(q, k_cache, v_cache, block_tables, context_lens, **options)
    lens = tuple(max(n, 1) for n in context_lens.tolist())
    longest = max(lens)
    _, hkv, block_size, d = k_cache.shape
    live = -(-longest // block_size)
    fused = (
        softcap is None
        and sinks is None
        and q.dtype in (torch.float32, torch.bfloat16)
        and q.dtype == k_cache.dtype == v_cache.dtype
        and v_cache.shape[-1] == d == q.shape[-1]
        and k_cache.is_contiguous()
        and v_cache.is_contiguous()
    )
    if not fused:
        options = dict(scale=scale, sliding_window=sliding_window, softcap=softcap, sinks=sinks)
        return reference_op.reference(q, k_cache, v_cache, block_tables[:, :live], context_lens, **options)
    b, h, _ = q.shape
    tables = tuple(map(tuple, block_tables[:, :live].tolist()))
    rows, visible = _gather_plan(tables, lens, sliding_window, hkv, block_size)
    k = k_cache.view(-1, d).index_select(0, rows).view(b, hkv, longest, d)
    v = v_cache.view(-1, d).index_select(0, rows).view(b, hkv, longest, d)
    out = F.scaled_dot_product_attention(q.reshape(b, hkv, h // hkv, d), k, v, attn_mask=visible, scale=scale)
    return out.reshape(b, h, d)


# A step asks with one key per kind of layer (window, KV heads), and a plan is the size of the gathered
# positions' row ids (64 MB at batch 8, 8 KV heads and 131072 positions): a few are kept, not more.
@functools.lru_cache(maxsize=4)
def _gather_plan(
    tables: tuple[tuple[int, ...], ...],
    lens: tuple[int, ...],
    sliding_window: int | None,
    num_kv_heads: int,
    block_size: int,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(rows, visible)`` for a batch's live block tables and lengths: ``rows`` indexes a cache viewed as
    ``[blocks * Hkv * block_size, D]`` so that one ``index_select`` yields ``[B, Hkv, longest, D]``,
    contiguous as the fused kernel reads fastest; ``visible [B, 1, 1, longest]`` is the mask, or None
    when every row sees every gathered position.

    Every layer of a decode step asks with the same tables and lengths: computed once and looked up by
    value (a few host calls) instead of a chain of tensor calls per layer."""
    with torch.inference_mode(False):  # a plan made inside a step is reused outside one
        longest = max(lens)
        positions = torch.arange(longest)
        slots = torch.tensor(tables, dtype=torch.int64)[:, positions // block_size] * block_size
        slots = slots + positions % block_size
        rows = cache_rows(slots, num_kv_heads, block_size).transpose(1, 2).reshape(-1)
        visible = None
        if min(lens) < longest or (sliding_window is not None and longest > sliding_window):
            context_lens = torch.tensor(lens, dtype=torch.int64)
            visible = decode_visible(context_lens, longest, sliding_window)[:, None, None, :]
    return rows, visible


def _core_kernel_fits(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, sinks: torch.Tensor | None
) -> bool:
    return (
        q.dtype in (torch.float32, torch.bfloat16)
        and q.dtype == k_cache.dtype == v_cache.dtype
        and q.dim() == 3
        and k_cache.dim() == v_cache.dim() == 4
        and k_cache.shape[-1] == q.shape[-1]
        and k_cache.stride(-1) == v_cache.stride(-1) == 1
        and (sinks is None or sinks.numel() == q.shape[1])
        and _core_library_runs()
    )


# A capture calls it once, not traces it: the answer is the process's, and a capture must not build.
@torch.compiler.assume_constant_result
def _core_library_runs() -> bool:
    return extension.why_unavailable() is None


def _attention_shape(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, *_: object
) -> torch.Tensor:
    return q.new_empty((*q.shape[:2], v_cache.shape[-1]))


extension.register_fake("decode_attention", _attention_shape)
register_cpu("decode_attention", decode_attention, in_graphs=True)


def graphs_run_core_attention() -> bool:
    """Whether the decode graphs captured here call core's decode-attention kernel: its CPU kernel on, and
    core's C++ library able to run on this CPU. The compile cache keys on it."""
    return cpu_kernel_enabled("decode_attention") and extension.why_unavailable() is None


def attention_matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``ops.attention_matmul`` of BF16 operands on a CPU without BF16 arithmetic: in FP32, rounded once.

    There a BF16 batched matmul converts its operands at every multiply-add. The compiled BF16 decode graphs
    run the reference's two matmuls over the context bucket, and prefill (eager and compiled) over the
    prompt. On an AMD Zen 3 (AVX2, 2 threads), the scores of a batch-8 decode step of the llama3 bench
    model, ``[32, 3, 64] @ [32, 64, 256]``, took 1.46 ms in BF16 and 0.16 ms converted first. That model's
    BF16 prefill of 256 tokens ran 3.8x as fast with this kernel, its compiled decode 1.10x
    (``docs/benchmarks/bf16-gemm-avx2.md``, before and after). A BF16 matmul sums in FP32 and rounds once
    too, so only the order of the sums differs."""
    return torch.matmul(_to_float_in_memory_order(a), _to_float_in_memory_order(b)).to(a.dtype)


def _to_float_in_memory_order(x: torch.Tensor) -> torch.Tensor:
    """``x.float()``, converted in the order ``x`` lies in memory when it is a transposed view (the scores'
    ``k.transpose(-1, -2)``), so that the matmul reads the result transposed. A graph otherwise converts
    into the transposed shape's own contiguous layout, filling it one strided element at a time from the
    paged cache: the llama3 bench model's compiled BF16 decode step at batch 8 took 17.6 ms that way and
    16.7 ms this way (medians of 9 rounds taking turns, AMD Zen 3, 2 threads)."""
    if x.dim() >= 2 and x.stride(-2) == 1 and x.stride(-1) != 1:
        return x.mT.float().mT
    return x.float()


def _bf16_in_software(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype == torch.bfloat16 and not linear.bf16_in_hardware()


register_cpu("attention_matmul", attention_matmul, supports=_bf16_in_software, in_graphs=True)


def attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, scale: float, **_: object
) -> torch.Tensor:
    """``ops.attention`` without a mask, softcap or sinks, through torch's fused CPU attention
    (``F.scaled_dot_product_attention``: flash attention in blocks, the scores never materialised).
    The reference's two batched matmuls and softmax over a DiT's whole video took 15.5 ms of a step
    here where the fused kernel took 7.9 ms (8 heads, 320 tokens)."""
    hkv, h = k.shape[2], q.shape[2]
    out = F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), scale=scale, enable_gqa=hkv != h
    )
    return out.transpose(1, 2)


def _plain_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    key_padding_mask: torch.Tensor | None = None,
    causal: bool = False,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
    **_: object,
) -> bool:
    return (
        key_padding_mask is None
        and not causal
        and softcap is None
        and sinks is None
        and q.dtype in (torch.float32, torch.bfloat16)
        and q.dtype == k.dtype == v.dtype
        and v.shape[-1] == q.shape[-1]
    )


register_cpu("attention", attention, supports=_plain_attention, in_graphs=True)
