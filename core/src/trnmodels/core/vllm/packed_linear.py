"""A packed CPU GEMM behind the plugin's linear layers, when the bridge serves BF16 weights on a CPU.

vLLM's linear layers choose a CPU GEMM once, after loading (``dispatch_cpu_unquantized_gemm``): sgl-kernel's
packed GEMM on a CPU with AMX, else a oneDNN matmul primitive built for the weight, which reorders it once
into oneDNN's layout, else ``F.linear``. Core's ``linear`` op calls ``F.linear``, which hands oneDNN the
weight as stored on every call: on this machine's AVX512-BF16 CPU, 2-3x slower at decode sizes (one to
eight rows; 1.05-1.35x at 128). So after loading, the bridge packs each BF16 linear weight for a GEMM and
registers it with core (``cpu.packed_layers``, as the runner does for its eager models), where the
linear op runs it, in the layers' own calls and in the fused ops' (``ops.gated_mlp``): core's BF16 GEMM
(``cpu.bf16_gemm``) on a CPU with AVX512-BF16 or AVX2 (on AVX512-BF16 it reads a weight 1.2-1.9x
faster than vLLM's oneDNN GEMM at 1 to 8 rows and as fast from 32 rows up, 0.94-1.07x, where both are
bound by arithmetic), else (or with ``TRNMODELS_BF16_GEMM=vllm``) vLLM's own choice. Weights only the linear layers read are
released, as vLLM releases its own (the GEMM holds the packed copy); the LM head's, which a tied
embedding reads too, is kept, as vLLM keeps its own.
"""

from __future__ import annotations

import os
from types import SimpleNamespace

import torch
from torch import nn

from ..cpu import extension
from ..cpu.packed import PackedGemm
from ..cpu.packed_layers import checked, core_gemm
from ..cpu.packed_layers import pack_linear_layers as pack_with
from ..errors import ConfigError

GEMM_ENV_VAR = "TRNMODELS_BF16_GEMM"
GEMMS = ("core", "vllm")


def chosen_gemm() -> str:
    """Which GEMM the bridge packs BF16 linear weights for: ``core`` where core's kernel runs (unless
    ``TRNMODELS_BF16_GEMM=vllm``), else ``vllm``."""
    return "core" if why_not_core_gemm() is None else "vllm"


def why_not_core_gemm() -> str | None:
    """Why the bridge does not pack for core's BF16 GEMM; None when it does."""
    if gemm_setting() != "core":
        return f"{GEMM_ENV_VAR}={gemm_setting()}"
    return extension.why_unavailable()


def gemm_setting() -> str:
    """``TRNMODELS_BF16_GEMM`` (default ``core``), refused unless one of ``GEMMS``."""
    choice = os.environ.get(GEMM_ENV_VAR, "core")
    if choice not in GEMMS:
        raise ConfigError(f"{GEMM_ENV_VAR}: expected one of {', '.join(GEMMS)}, got {choice!r}")
    return choice


# Why ``vllm_gemm`` gives no GEMM where vLLM's dispatch hands back ``F.linear`` (no packed BF16 GEMM here).
_FALLS_BACK = "fell back to F.linear for it"
VLLM_FALLS_BACK = f"vLLM's GEMM {_FALLS_BACK}"


def vllm_gemm(weight: torch.Tensor) -> tuple[PackedGemm | None, str | None]:
    """vLLM's CPU GEMM for ``weight`` as its own linear layers choose it (``x -> x @ weight.T``), or
    None and why not: vLLM falls back to ``F.linear``, or its GEMM disagrees with ``F.linear`` on a
    probe row (checked once per weight, at load)."""
    from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

    # vLLM's dispatch reads ``weight`` and ``bias`` from the layer and sets ``cpu_linear`` on it. It gets
    # a stand-in: the bias is added by the caller, so vLLM's dispatch never converts ours in place.
    layer = SimpleNamespace(weight=weight, bias=None)
    dispatch_cpu_unquantized_gemm(layer, remove_weight=False)
    run = layer.cpu_linear
    # A packed GEMM holds its own copy and ignores the weight argument; F.linear needs it.
    return checked(lambda x: run(x, None, None), weight, "vLLM's GEMM", _FALLS_BACK)


def pack_linear_layers(model: nn.Module) -> tuple[int, list[str]]:
    """Register a packed GEMM (``chosen_gemm``) for every BF16 linear layer's weight in ``model``
    (``cpu.packed_layers``); returns how many were packed and why the others were not."""
    gemm_setting()  # a bad setting is refused even where no weight is BF16

    def gemm_for(weight: torch.Tensor) -> tuple[PackedGemm | None, str | None]:
        # Asked at a weight that can be packed, so core's kernel is built only for BF16 weights.
        return (core_gemm if chosen_gemm() == "core" else vllm_gemm)(weight)

    return pack_with(model, gemm_for)
