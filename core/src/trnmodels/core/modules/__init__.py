"""Reusable model modules built on the functional ops and the parallel layers."""

from .decoder_layer import PreNormDecoderLayer
from .mlp import GatedMLP
from .moe import ExpertsCheckpointFormat, MoEExperts, experts_per_rank, per_expert_keys
from .norm import LayerNorm, RMSNorm
from .rotary import RotaryEmbedding
from .self_attention import SelfAttention

__all__ = [
    "ExpertsCheckpointFormat",
    "GatedMLP",
    "LayerNorm",
    "MoEExperts",
    "PreNormDecoderLayer",
    "RMSNorm",
    "RotaryEmbedding",
    "SelfAttention",
    "experts_per_rank",
    "per_expert_keys",
]
