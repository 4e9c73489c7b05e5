"""Weight loaders: how a parameter's rank-local value is cut from its checkpoint tensors.

A loader is ``(tensors, rank, world_size) -> Tensor``: it receives the lazy checkpoint tensors mapped to
the parameter (a list, because fused parameters map to several keys) and reads only this rank's slice.
Parallel layers attach their loader to their parameters, so the split is declared where the layer is.

Most loaders cut whole rows: the value is row ranges of the tensors (or zero rows) stacked along dim 0.
Those are built from a ``RowPlan`` (``rows_loader``) and carry it as ``row_plan``, so loading can read
each range from the file straight into the parameter's memory instead of into a temporary first.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from ..errors import CheckpointError
from .checkpoint import CheckpointTensor

WeightLoader = Callable[[Sequence[CheckpointTensor], int, int], torch.Tensor]
RowRange = tuple[CheckpointTensor | None, int, int]
"""Rows ``[start, stop)`` of a tensor, or (``None``) ``stop - start`` rows of zeros."""
RowPlan = Callable[[Sequence[CheckpointTensor], int, int], list[RowRange] | None]
"""The row ranges a loader's value stacks, or None where the value is not whole rows (a 0-dim tensor)."""


def set_weight_loader(param: torch.nn.Parameter, loader: WeightLoader) -> None:
    param.weight_loader = loader  # type: ignore[attr-defined]


def get_weight_loader(param: torch.nn.Parameter) -> WeightLoader:
    return getattr(param, "weight_loader", replicated)


def rows_loader(plan: RowPlan) -> WeightLoader:
    """The loader whose value stacks the row ranges ``plan`` gives; it carries ``plan`` as ``row_plan``."""

    def load(tensors: Sequence[CheckpointTensor], rank: int, world_size: int) -> torch.Tensor:
        ranges = plan(tensors, rank, world_size)
        if ranges is None:
            return _single(tensors).read()
        parts = [t.read(slice(start, stop)) if t is not None else None for t, start, stop in ranges]
        like = next((p for p in parts if p is not None), None)
        if like is None:
            raise CheckpointError(f"a row plan with no checkpoint rows for {[t.key for t in tensors]}")
        filled = [p if p is not None else like.new_zeros(stop - start, *like.shape[1:])
                  for p, (_, start, stop) in zip(parts, ranges, strict=True)]  # fmt: skip
        return filled[0] if len(filled) == 1 else torch.cat(filled)

    load.row_plan = plan  # type: ignore[attr-defined]
    return load


def _index(dim: int, ndim: int, sl: slice) -> tuple[slice, ...]:
    return tuple(sl if d == dim else slice(None) for d in range(ndim))


def _single(tensors: Sequence[CheckpointTensor]) -> CheckpointTensor:
    if len(tensors) != 1:
        raise CheckpointError(f"expected one checkpoint key, got {[t.key for t in tensors]}")
    return tensors[0]


def shard_rows(t: CheckpointTensor, dim: int, rank: int, world_size: int) -> slice:
    """Part ``rank`` of ``world_size`` equal parts of ``t`` along ``dim``."""
    size = t.shape[dim]
    if size % world_size:
        raise CheckpointError(
            f"{t.describe()}: dim {dim} of size {size} does not divide by {world_size} ranks"
        )
    part = size // world_size
    return slice(rank * part, (rank + 1) * part)


def read_shard(t: CheckpointTensor, dim: int, rank: int, world_size: int) -> torch.Tensor:
    """Rows (or columns) ``rank`` of ``world_size`` equal parts along ``dim``."""
    return t.read(_index(dim, len(t.shape), shard_rows(t, dim, rank, world_size)))


def _row_shard(t: CheckpointTensor, rank: int, world_size: int) -> RowRange:
    part = shard_rows(t, 0, rank, world_size)
    return (t, part.start, part.stop)


@rows_loader
def replicated(tensors: Sequence[CheckpointTensor], rank: int, world_size: int) -> list[RowRange] | None:
    t = _single(tensors)
    return [(t, 0, t.shape[0])] if t.shape else None


def sharded(dim: int) -> WeightLoader:
    """Split one tensor evenly along ``dim``."""
    if dim == 0:
        return rows_loader(lambda tensors, rank, world_size: [_row_shard(_single(tensors), rank, world_size)])

    def load(tensors: Sequence[CheckpointTensor], rank: int, world_size: int) -> torch.Tensor:
        return read_shard(_single(tensors), dim, rank, world_size)

    def whole_rows_on_one_rank(
        tensors: Sequence[CheckpointTensor], rank: int, world_size: int
    ) -> list[RowRange] | None:
        # Alone, a rank's part along a later dim is the whole tensor: every row, read straight into the
        # parameter (a row-parallel layer at TP=1) instead of in column chunks copied in.
        t = _single(tensors)
        return [(t, 0, t.shape[0])] if world_size == 1 and t.shape else None

    load.row_plan = whole_rows_on_one_rank  # type: ignore[attr-defined]
    return load


def concat_sharded(dim: int = 0) -> WeightLoader:
    """Several keys, each split along ``dim``, then concatenated (gate and up into one gate_up)."""
    if dim == 0:
        return rows_loader(
            lambda tensors, rank, world_size: [_row_shard(t, rank, world_size) for t in tensors]
        )

    def load(tensors: Sequence[CheckpointTensor], rank: int, world_size: int) -> torch.Tensor:
        return torch.cat([read_shard(t, dim, rank, world_size) for t in tensors], dim=dim)

    return load


def padded_rows(rows_per_rank: int) -> WeightLoader:
    """Vocab sharding: rank r owns rows ``[r*n, (r+1)*n)``; rows past the real vocab are zeros."""

    def plan(tensors: Sequence[CheckpointTensor], rank: int, world_size: int) -> list[RowRange]:
        t = _single(tensors)
        start = rank * rows_per_rank
        stop = max(start, min(start + rows_per_rank, t.shape[0]))
        ranges: list[RowRange] = [(t, start, stop)] if stop > start else [(t, 0, 0)]
        pad = rows_per_rank - (stop - start)
        return [*ranges, (None, 0, pad)] if pad else ranges

    return rows_loader(plan)


def kv_head_for_rank(rank: int, world_size: int, num_kv_heads: int) -> int:
    """When TP exceeds the KV heads, groups of ``world_size // num_kv_heads`` ranks share one KV head."""
    return rank // (world_size // num_kv_heads)


def fused_qkv(num_heads: int, num_kv_heads: int, head_dim: int, *, with_v: bool = True) -> WeightLoader:
    """q, k and v keys fused into one rank-local ``[q; k; v]`` along dim 0 (weights or biases); without
    ``with_v`` (a layer whose V is its K projection), q and k keys into ``[q; k]``.

    Query heads split evenly; KV heads split evenly when there are at least as many as ranks, and are
    replicated otherwise.
    """
    names = "q, k and v" if with_v else "q and k"

    def plan(tensors: Sequence[CheckpointTensor], rank: int, world_size: int) -> list[RowRange]:
        if len(tensors) != (3 if with_v else 2):
            raise CheckpointError(f"fused QKV expects {names} keys, got {[t.key for t in tensors]}")
        q, *kv = tensors
        for t, heads in ((q, num_heads), *((t, num_kv_heads) for t in kv)):
            if t.shape[0] != heads * head_dim:
                raise CheckpointError(
                    f"{t.describe()}: expected {heads} heads × head_dim {head_dim} = {heads * head_dim} rows"
                )
        ranges = [_row_shard(q, rank, world_size)]
        for t in kv:
            if num_kv_heads >= world_size:
                ranges.append(_row_shard(t, rank, world_size))
            else:
                head = kv_head_for_rank(rank, world_size, num_kv_heads)
                ranges.append((t, head * head_dim, (head + 1) * head_dim))
        return ranges

    return rows_loader(plan)


def with_rank_override(loader: WeightLoader, rank: int, world_size: int) -> WeightLoader:
    """Load as if this were ``rank`` of ``world_size`` (a parameter split over a sub-group, e.g. EP)."""
    plan = getattr(loader, "row_plan", None)

    def load(tensors: Sequence[CheckpointTensor], _rank: int, _world_size: int) -> torch.Tensor:
        return loader(tensors, rank, world_size)

    if plan is not None:
        load.row_plan = lambda tensors, _rank, _world_size: plan(tensors, rank, world_size)  # type: ignore[attr-defined]
    return load
