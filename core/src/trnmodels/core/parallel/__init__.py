"""Tensor parallelism: process groups, parallel layers, and a local multi-rank launcher."""

from .layers import (
    ColumnParallelLinear,
    MergedColumnParallelLinear,
    ParallelLMHead,
    QKVParallelLinear,
    RowParallelLinear,
    VocabParallelEmbedding,
    check_divisible,
    kv_heads_per_rank,
    padded_vocab,
)
from .state import ProcessGroupHandle, destroy_parallel_state, get_tp_group, init_parallel_state

__all__ = [
    "ColumnParallelLinear",
    "MergedColumnParallelLinear",
    "ParallelLMHead",
    "ProcessGroupHandle",
    "QKVParallelLinear",
    "RowParallelLinear",
    "VocabParallelEmbedding",
    "check_divisible",
    "destroy_parallel_state",
    "get_tp_group",
    "init_parallel_state",
    "kv_heads_per_rank",
    "padded_vocab",
]
