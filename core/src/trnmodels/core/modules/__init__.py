"""Reusable model modules built on the functional ops and the parallel layers."""

from .mlp import GatedMLP
from .norm import LayerNorm, RMSNorm
from .rotary import RotaryEmbedding

__all__ = ["GatedMLP", "LayerNorm", "RMSNorm", "RotaryEmbedding"]
