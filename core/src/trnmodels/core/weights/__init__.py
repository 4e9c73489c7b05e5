"""Weight loading from safetensors: lazy per-rank slices through explicit key mappings."""

from .checkpoint import Checkpoint, CheckpointTensor, SafetensorsCheckpoint, StateDictCheckpoint
from .huge_pages import huge_pages_requested, huge_pages_supported, place_in_huge_pages
from .load import (
    HF_FUSED_SOURCES,
    KeyDict,
    KeyMap,
    check_key_coverage,
    identity_keys,
    load_checkpoint_dir,
    load_parameters,
    prefixed,
)
from .loaders import (
    RowPlan,
    RowRange,
    WeightLoader,
    concat_sharded,
    fused_qkv,
    kv_head_for_rank,
    padded_rows,
    replicated,
    rows_loader,
    set_weight_loader,
    sharded,
    with_rank_override,
)

__all__ = [
    "HF_FUSED_SOURCES",
    "Checkpoint",
    "CheckpointTensor",
    "KeyDict",
    "KeyMap",
    "RowPlan",
    "RowRange",
    "SafetensorsCheckpoint",
    "StateDictCheckpoint",
    "WeightLoader",
    "check_key_coverage",
    "concat_sharded",
    "fused_qkv",
    "huge_pages_requested",
    "huge_pages_supported",
    "identity_keys",
    "kv_head_for_rank",
    "load_checkpoint_dir",
    "load_parameters",
    "padded_rows",
    "place_in_huge_pages",
    "prefixed",
    "replicated",
    "rows_loader",
    "set_weight_loader",
    "sharded",
    "with_rank_override",
]
