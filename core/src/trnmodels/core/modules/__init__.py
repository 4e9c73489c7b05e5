"""Reusable model modules built on the functional ops and the parallel layers."""

from .mlp import GatedMLP
from .moe import ExpertsCheckpointFormat, MoEExperts, experts_per_rank
from .norm import LayerNorm, RMSNorm
from .rotary import RotaryEmbedding

__all__ = [
    "ExpertsCheckpointFormat",
    "GatedMLP",
    "LayerNorm",
    "MoEExperts",
    "RMSNorm",
    "RotaryEmbedding",
    "experts_per_rank",
]
