"""A model's BF16 linear layers packed for a CPU GEMM (``cpu.packed``), core's BF16 GEMM by default.

A linear layer's BF16 weight as stored is slow to multiply at decode sizes: ``F.linear`` hands oneDNN the
plain weight on every call, and read the llama3 bench config's weights at 9-11 GB/s at one to eight rows,
where core's BF16 GEMM (``cpu.bf16_gemm``) on its packed copy read 22-38 (``docs/benchmarks/bf16-gemm.md``;
the runner's eager BF16 decode of that model ran 1.56x faster at batch 1 and 1.93x at batch 8).
So each BF16 linear weight is packed once, and the linear op runs the packed GEMM for it, in the layers'
own calls and in the fused ops' (``ops.gated_mlp``). Two ways:

- ``pack_for_eager``: for a model that only runs eagerly (the runner's, through ``runner_graphs``, and,
  with vLLM's GEMM as the other choice, the vLLM bridge's). A layer whose GEMM disagrees with ``F.linear``
  on a probe row stays on ``F.linear``.
- ``pack_for_graphs``: for a model compiled graphs read (the capture, and ``compile.load_compiled_graphs``
  when binding). The packed copy is the layer's buffer ``packed_weight``, which the graph binds by name,
  so every layer must be packed, as in the graph. FP32 layers are packed too, for core's FP32 GEMM
  (``cpu.fp32_gemm``): in graphs it streamed the weights faster than Inductor's one-row reductions, where
  eager FP32 calls have torch's GEMMs (``cpu.linear``).

Weights only the linear layers read are released (the GEMM holds the packed copy), so memory does not
grow; the LM head's, which a tied embedding reads too, is kept, and so is a weight holding NaN or inf. A
graph cannot read a weight packed for eager runs, whose own memory is gone: binding refuses it.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import InputError
from ..ops.dispatch import cpu_kernel_enabled
from ..parallel.layers import LINEAR_LAYERS, ParallelLMHead
from . import bf16_gemm, extension, fp32_gemm
from .packed import PackedGemm, pack, packed_gemm, released

logger = logging.getLogger(__name__)

# A weight -> its packed GEMM, or None and why not.
GemmMaker = Callable[[torch.Tensor], tuple[PackedGemm | None, str | None]]


CoreGemm = Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor]  # (x, packed, N) -> x @ weight.T


class GraphGemm(NamedTuple):
    """One of core's GEMMs on packed weights, as compiled graphs call it."""

    name: str
    pack: Callable[[torch.Tensor], torch.Tensor]  # weight [N, K] -> its packed copy
    gemm: CoreGemm


def why_not_packed(weight: torch.Tensor) -> str | None:
    """Why no packed GEMM takes ``weight``; None when one does."""
    if not cpu_kernel_enabled("linear"):
        return "the linear CPU kernel is turned off (TRNMODELS_KERNEL_BACKEND / TRNMODELS_CPU_KERNELS)"
    if weight.device.type != "cpu" or weight.dtype != torch.bfloat16 or weight.dim() != 2:
        return f"weights are {weight.dtype} on {weight.device}, not 2-D bfloat16 on the CPU"
    return None


def core_gemm(weight: torch.Tensor) -> tuple[PackedGemm | None, str | None]:
    """Core's BF16 GEMM for ``weight`` (``x -> x @ weight.T``), holding its own packed copy, or None and why
    not (it cannot run here, or disagrees with ``F.linear`` on a probe row)."""
    reason = extension.why_unavailable()
    if reason is not None:
        return None, f"core's BF16 GEMM cannot run: {reason}"
    packed, n = bf16_gemm.pack(weight), weight.shape[0]
    return checked(lambda x: bf16_gemm.gemm(x, packed, n), weight, "core's BF16 GEMM", "failed on it")


def checked(
    gemm: PackedGemm, weight: torch.Tensor, name: str, failed: str
) -> tuple[PackedGemm | None, str | None]:
    """``gemm`` if it agrees with ``F.linear`` on a probe row (checked once per weight, at load), else
    None and why not (``failed`` says how, when ``gemm`` raises)."""
    probe = torch.randn(1, weight.shape[1], generator=torch.Generator().manual_seed(0)).to(weight.dtype)
    try:
        got = gemm(probe)
    except (TypeError, RuntimeError):
        return None, f"{name} {failed}"
    expected = F.linear(probe.float(), weight.float())
    # BF16 output rounding (2**-8 relative), with room for FP32 sums in another order.
    error = float((got.float() - expected).abs().max())
    bound = 2**-7 * float(expected.abs().max())
    if got.shape != expected.shape or not error <= bound:
        return None, f"{name} is {error:.3g} from F.linear on a probe row (bound {bound:.3g})"
    return gemm, None


def pack_linear_layers(model: nn.Module, gemm_for: GemmMaker = core_gemm) -> tuple[int, list[str]]:
    """Register the GEMM ``gemm_for`` makes for every BF16 linear layer's weight in ``model`` (core's BF16
    GEMM by default) and release the weights only those layers read; returns how many were packed and
    why the others were not. No compiled graph may be bound to ``model`` (see the module's notes)."""
    shared = shared_parameters(model)
    packed, reasons = 0, []
    for path, module in _linear_modules(model):
        weight = module.weight
        if packed_gemm(weight) is not None:
            packed += 1  # already (``pack_for_graphs``)
            continue
        reason = why_not_packed(weight)
        if reason is None:
            gemm, reason = gemm_for(weight.detach())
        if reason is not None:
            reasons.append(f"{path}: {reason}")
            continue
        keep = isinstance(module, ParallelLMHead) or id(weight) in shared
        # vLLM traces its GEMMs in its own compiled classes, and core's is a torch op: so may a compile
        # of the model.
        pack(weight, gemm, release=not keep, traceable=True)
        packed += 1
    return packed, reasons


def shared_parameters(model: nn.Module) -> set[int]:
    """The parameters held under more than one name (a tied LM head and embedding)."""
    seen: set[int] = set()
    shared: set[int] = set()
    for _, p in model.named_parameters(remove_duplicate=False):
        (shared if id(p) in seen else seen).add(id(p))
    return shared


def pack_for_eager(model: nn.Module) -> int:
    """Pack ``model``'s BF16 linear layers for core's BF16 GEMM (``pack_linear_layers``), for a model that
    only runs eagerly; logs how many, or why none was when it has BF16 linear weights. Returns how many."""
    packed, reasons = pack_linear_layers(model)
    if packed:
        logger.info("trnmodels: %d linear layers run core's BF16 GEMM", packed)
    elif any(m.weight.dtype == torch.bfloat16 for _, m in _linear_modules(model)):
        logger.info("trnmodels: the linear layers run F.linear, not core's BF16 GEMM (%s)", reasons[0])
    return packed


# The packed GEMM compiled graphs call for each weight dtype: core's BF16 GEMM, or its FP32 one.
GRAPH_GEMMS: dict[torch.dtype, GraphGemm] = {
    torch.bfloat16: GraphGemm("core's BF16 GEMM", bf16_gemm.pack, bf16_gemm.gemm),
    torch.float32: GraphGemm("core's FP32 GEMM", fp32_gemm.pack, fp32_gemm.gemm),
}
_GRAPH_DTYPES = {str(dtype).removeprefix("torch.") for dtype in GRAPH_GEMMS}  # as a CompileTarget names them


def graphs_run_core_gemm(dtype: torch.dtype | str) -> bool:
    """Whether graphs compiled for ``dtype`` here call core's GEMM on packed weights (``pack_for_graphs``):
    BF16 or FP32, the linear CPU kernel on, and core's library able to run on this CPU. The compile cache
    keys on it, and binding a model to graphs packs it the same way."""
    if str(dtype).removeprefix("torch.") not in _GRAPH_DTYPES or not cpu_kernel_enabled("linear"):
        return False
    return extension.why_unavailable() is None


PACKED_BUFFER = "packed_weight"


def released_for_eager(name: str) -> InputError:
    """The error for binding graphs to the weight ``name`` that an eager-only model gave back."""
    return InputError(
        f"{name}: this model's weight was packed for eager runs and released "
        "(cpu.packed_layers.pack_for_eager); compiled graphs need a model built again"
    )


def pack_for_graphs(model: nn.Module, *, probe: bool = True) -> int:
    """Pack every BF16 or FP32 linear layer of ``model`` for core's GEMM of its dtype (``GRAPH_GEMMS``) as a
    captured graph calls it: the packed weight is the layer's buffer ``packed_weight``, which a capture
    lifts and a compiled graph binds by name like any weight, and the linear op calls the GEMM on it
    (``traceable``). The plain weights are released, but the LM head's and one holding NaN or inf (kept,
    so a non-finite result names it). A model already packed so is left as it is. Returns how many layers
    are packed.

    Every layer must be packed, as the graph was: a GEMM that disagrees with ``F.linear`` on a probe row
    raises rather than leaving one layer out (an eager-only model leaves it to ``F.linear`` instead).
    ``probe=False`` skips that check, for a model built only to be traced (its weights are not set)."""
    shared = shared_parameters(model)
    packed = 0
    for path, module in _linear_modules(model):
        weight = module.weight
        core = GRAPH_GEMMS.get(weight.dtype)
        if core is None or weight.device.type != "cpu" or weight.dim() != 2:
            continue  # no packed GEMM for it (the kernel itself is ``graphs_run_core_gemm``'s question)
        if getattr(module, PACKED_BUFFER, None) is not None:
            packed += 1
            continue
        if released(weight):
            raise released_for_eager(f"{path}.weight")
        data = weight.detach()
        module.register_buffer(PACKED_BUFFER, core.pack(data), persistent=False)
        n = weight.shape[0]

        # The layer by a weak reference: ``cpu.packed`` keeps the GEMM in a registry until the weight dies,
        # and a strong one would keep the layer, so its weight, alive for good (a compile traces a new
        # model per graph, and each stayed in memory).
        layer = weakref.ref(module)

        def gemm(
            x: torch.Tensor, layer: weakref.ref[nn.Module] = layer, n: int = n, run: CoreGemm = core.gemm
        ) -> torch.Tensor:
            return run(x, getattr(layer(), PACKED_BUFFER), n)

        # A traced model's weights are not set: neither checked nor kept.
        finite = bool(torch.isfinite(data).all()) if probe else True
        if probe and finite and checked(gemm, data, core.name, "failed on it")[0] is None:
            raise RuntimeError(
                f"{path}: {core.name} disagrees with F.linear on a probe row; run without it "
                "(TRNMODELS_CPU_KERNELS without 'linear')"
            )
        keep = isinstance(module, ParallelLMHead) or id(weight) in shared or not finite
        pack(weight, gemm, release=not keep, traceable=True)
        packed += 1
    return packed


def _linear_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """``model``'s linear layers and LM head, by path."""
    return [(p, m) for p, m in model.named_modules() if isinstance(m, (*LINEAR_LAYERS, ParallelLMHead))]
