"""Parallelism: the rank mesh (TP, EP, CP, CFG groups), parallel layers, and a local multi-rank launcher."""

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
from .state import (
    MESH_DIMS,
    ParallelLayout,
    ProcessGroupHandle,
    destroy_parallel_state,
    get_cfg_group,
    get_cp_group,
    get_ep_group,
    get_parallel_layout,
    get_tp_group,
    get_world_group,
    init_parallel_state,
)

__all__ = [
    "MESH_DIMS",
    "ColumnParallelLinear",
    "MergedColumnParallelLinear",
    "ParallelLMHead",
    "ParallelLayout",
    "ProcessGroupHandle",
    "QKVParallelLinear",
    "RowParallelLinear",
    "VocabParallelEmbedding",
    "check_divisible",
    "destroy_parallel_state",
    "get_cfg_group",
    "get_cp_group",
    "get_ep_group",
    "get_parallel_layout",
    "get_tp_group",
    "get_world_group",
    "init_parallel_state",
    "kv_heads_per_rank",
    "padded_vocab",
]
