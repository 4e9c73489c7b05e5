"""Weights packed for another library's GEMM: the linear op runs that GEMM for them instead of choosing.

A GEMM library (oneDNN, vLLM's CPU kernels) is fastest on a weight it has reordered once into its own
layout, and then holds that copy. ``pack`` registers such a GEMM for one weight parameter and, unless the
weight is read elsewhere (a tied LM head is also the embedding table), gives the parameter's memory back:
its data becomes a single NaN, broadcast to the weight's shape, so its shape and dtype still trace and a
computation that reads it by mistake gives NaN rather than plausible numbers. The linear op's CPU kernel
(``cpu.linear``) looks the weight up by its data pointer, in eager calls and when ``trnmodels::linear``
runs under ``torch.compile``. An entry is dropped with its parameter, before the address can be reused.

A GEMM packed as ``traceable`` (built from ops ``torch.compile`` can trace, as vLLM's are: vLLM traces
them in its own model classes) is also found on the parameter object itself, which a trace can read where
it cannot read a data pointer: ``torch.compile`` then traces the GEMM inline, as vLLM's graphs call it,
instead of the op ``trnmodels::linear`` choosing it at every call (about 8 µs a call here: 0.2 ms of a
3.6 ms batch-1 gpt-oss decode step under vLLM).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable

import torch

PackedGemm = Callable[[torch.Tensor], torch.Tensor]  # x [T, K] -> x @ weight.T, [T, N]

_packed: dict[int, tuple[torch.Size, PackedGemm]] = {}
_TRACEABLE_ATTR = "_trnmodels_traceable_gemm"


def pack(weight: torch.nn.Parameter, gemm: PackedGemm, *, release: bool, traceable: bool = False) -> None:
    """Run ``gemm`` for every linear call on ``weight``; with ``release`` free the weight's own memory
    (``gemm`` must hold its own copy); with ``traceable`` let ``torch.compile`` trace ``gemm`` inline."""
    if release:
        weight.data = torch.full((1,), float("nan"), dtype=weight.dtype).expand(weight.shape)
    key = weight.data_ptr()
    _packed[key] = (weight.shape, gemm)
    weakref.finalize(weight, _packed.pop, key, None)
    if traceable:
        setattr(weight, _TRACEABLE_ATTR, gemm)


def traceable_gemm(weight: torch.Tensor) -> PackedGemm | None:
    """The GEMM packed as ``traceable`` for the parameter ``weight`` (a trace reads it from the object)."""
    return getattr(weight, _TRACEABLE_ATTR, None)


def packed_gemm(weight: torch.Tensor) -> PackedGemm | None:
    """The GEMM packed for ``weight``, if any (a view of a packed weight at the same address is not it)."""
    entry = _packed.get(weight.data_ptr()) if _packed else None
    return entry[1] if entry is not None and entry[0] == weight.shape else None


def released(weight: torch.Tensor) -> bool:
    """Whether ``weight``'s own memory was given back when it was packed (its data is one broadcast NaN)."""
    return packed_gemm(weight) is not None and weight.numel() > 1 and not any(weight.stride())
