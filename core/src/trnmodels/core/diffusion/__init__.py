"""Diffusion building blocks shared by every diffusion plugin: CFG and context parallelism (and the
VAE tiling / patch-parallel mixins, in their own modules). Their per-component compile is
``trnmodels.core.compile.diffusion``; their vLLM-Omni serving is ``trnmodels.core.omni``."""

from .cfg_parallel import CFGParallelMixin, SequentialCFG, combine_cfg
from .context_parallel import (
    allgather_self_attention,
    check_sequence_divisible,
    cp_self_attention,
    gather_sequence,
    ring_available,
    ring_self_attention,
    split_sequence,
    use_ring,
)

__all__ = [
    "CFGParallelMixin",
    "SequentialCFG",
    "allgather_self_attention",
    "check_sequence_divisible",
    "combine_cfg",
    "cp_self_attention",
    "gather_sequence",
    "ring_available",
    "ring_self_attention",
    "split_sequence",
    "use_ring",
]
