"""Weight loading from safetensors: lazy per-rank slices through explicit key mappings."""

from .checkpoint import Checkpoint, CheckpointTensor, SafetensorsCheckpoint, StateDictCheckpoint
from .load import KeyMap, check_key_coverage, load_parameters, prefixed
from .loaders import (
    WeightLoader,
    concat_sharded,
    fused_qkv,
    kv_head_for_rank,
    padded_rows,
    replicated,
    set_weight_loader,
    sharded,
    with_rank_override,
)

__all__ = [
    "Checkpoint",
    "CheckpointTensor",
    "KeyMap",
    "SafetensorsCheckpoint",
    "StateDictCheckpoint",
    "WeightLoader",
    "check_key_coverage",
    "concat_sharded",
    "fused_qkv",
    "kv_head_for_rank",
    "load_parameters",
    "padded_rows",
    "prefixed",
    "replicated",
    "set_weight_loader",
    "sharded",
    "with_rank_override",
]
