"""Weight loaders: how a parameter's rank-local value is cut from its checkpoint tensors.

A loader is ``(tensors, rank, world_size) -> Tensor``: it receives the lazy checkpoint tensors mapped to
the parameter (a list, because fused parameters map to several keys) and reads only this rank's slice.
Parallel layers attach their loader to their parameters, so the split is declared where the layer is.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from ..errors import CheckpointError
from .checkpoint import CheckpointTensor

WeightLoader = Callable[[Sequence[CheckpointTensor], int, int], torch.Tensor]


def set_weight_loader(param: torch.nn.Parameter, loader: WeightLoader) -> None:
    param.weight_loader = loader  # type: ignore[attr-defined]


def get_weight_loader(param: torch.nn.Parameter) -> WeightLoader:
    return getattr(param, "weight_loader", replicated)


def _index(dim: int, ndim: int, sl: slice) -> tuple[slice, ...]:
    return tuple(sl if d == dim else slice(None) for d in range(ndim))


def _single(tensors: Sequence[CheckpointTensor]) -> CheckpointTensor:
    if len(tensors) != 1:
        raise CheckpointError(f"expected one checkpoint key, got {[t.key for t in tensors]}")
    return tensors[0]


def read_shard(t: CheckpointTensor, dim: int, rank: int, world_size: int) -> torch.Tensor:
    """Rows (or columns) ``rank`` of ``world_size`` equal parts along ``dim``."""
    size = t.shape[dim]
    if size % world_size:
        raise CheckpointError(
            f"{t.describe()}: dim {dim} of size {size} does not divide by {world_size} ranks"
        )
    part = size // world_size
    return t.read(_index(dim, len(t.shape), slice(rank * part, (rank + 1) * part)))


def replicated(tensors: Sequence[CheckpointTensor], rank: int, world_size: int) -> torch.Tensor:
    return _single(tensors).read()


def sharded(dim: int) -> WeightLoader:
    """Split one tensor evenly along ``dim``."""

    def load(tensors: Sequence[CheckpointTensor], rank: int, world_size: int) -> torch.Tensor:
        return read_shard(_single(tensors), dim, rank, world_size)

    return load


def concat_sharded(dim: int = 0) -> WeightLoader:
    """Several keys, each split along ``dim``, then concatenated (gate and up into one gate_up)."""

    def load(tensors: Sequence[CheckpointTensor], rank: int, world_size: int) -> torch.Tensor:
        return torch.cat([read_shard(t, dim, rank, world_size) for t in tensors], dim=dim)

    return load


def padded_rows(rows_per_rank: int) -> WeightLoader:
    """Vocab sharding: rank r owns rows ``[r*n, (r+1)*n)``; rows past the real vocab are zeros."""

    def load(tensors: Sequence[CheckpointTensor], rank: int, world_size: int) -> torch.Tensor:
        t = _single(tensors)
        start = rank * rows_per_rank
        stop = min(start + rows_per_rank, t.shape[0])
        rows = t.read(slice(start, stop)) if stop > start else t.read(slice(0, 0))
        pad = rows_per_rank - rows.shape[0]
        if pad:
            rows = torch.cat([rows, rows.new_zeros(pad, *rows.shape[1:])])
        return rows

    return load


def kv_head_for_rank(rank: int, world_size: int, num_kv_heads: int) -> int:
    """When TP exceeds the KV heads, groups of ``world_size // num_kv_heads`` ranks share one KV head."""
    return rank // (world_size // num_kv_heads)


def fused_qkv(num_heads: int, num_kv_heads: int, head_dim: int) -> WeightLoader:
    """q, k and v keys fused into one rank-local ``[q; k; v]`` along dim 0 (weights or biases).

    Query heads split evenly; KV heads split evenly when there are at least as many as ranks, and are
    replicated otherwise.
    """

    def load(tensors: Sequence[CheckpointTensor], rank: int, world_size: int) -> torch.Tensor:
        if len(tensors) != 3:
            raise CheckpointError(f"fused QKV expects q, k and v keys, got {[t.key for t in tensors]}")
        q, k, v = tensors
        for t, heads in ((q, num_heads), (k, num_kv_heads), (v, num_kv_heads)):
            if t.shape[0] != heads * head_dim:
                raise CheckpointError(
                    f"{t.describe()}: expected {heads} heads × head_dim {head_dim} = {heads * head_dim} rows"
                )
        parts = [read_shard(q, 0, rank, world_size)]
        for t in (k, v):
            if num_kv_heads >= world_size:
                parts.append(read_shard(t, 0, rank, world_size))
            else:
                head = kv_head_for_rank(rank, world_size, num_kv_heads)
                parts.append(t.read(slice(head * head_dim, (head + 1) * head_dim)))
        return torch.cat(parts, dim=0)

    return load


def with_rank_override(loader: WeightLoader, rank: int, world_size: int) -> WeightLoader:
    """Load as if this were ``rank`` of ``world_size`` (a parameter split over a sub-group, e.g. EP)."""

    def load(tensors: Sequence[CheckpointTensor], _rank: int, _world_size: int) -> torch.Tensor:
        return loader(tensors, rank, world_size)

    return load
