"""Parallel state: the process groups models call collectives on.

A ``ProcessGroupHandle`` is one group (TP now; EP, CP and CFG groups are built the same way). With world
size 1 it needs no torch.distributed at all and every collective is the identity. The collectives are
torch's functional collectives, so they trace into compiled graphs.

The rank a graph needs (to mask a vocab shard, say) is passed into the graph as a tensor
(``rank_tensor``), never baked in, so all ranks share one compiled artifact.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

from ..errors import ShardingError


@dataclass(frozen=True)
class ProcessGroupHandle:
    """One group of ranks. ``group`` is None exactly when ``world_size == 1``."""

    name: str
    world_size: int
    rank: int
    group: dist.ProcessGroup | None = None

    def rank_tensor(self) -> torch.Tensor:
        return torch.tensor(self.rank, dtype=torch.int64)

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        if self.world_size == 1:
            return x
        return funcol.wait_tensor(funcol.all_reduce(x, "sum", self.group))

    def all_gather(self, x: torch.Tensor, dim: int = 0) -> torch.Tensor:
        """Concatenate every rank's ``x`` along ``dim``, in rank order."""
        if self.world_size == 1:
            return x
        return funcol.wait_tensor(funcol.all_gather_single(x.contiguous(), dim % x.dim(), self.group))

    def reduce_scatter(self, x: torch.Tensor, dim: int = 0) -> torch.Tensor:
        """Sum over ranks, then keep this rank's 1/world_size slice along ``dim``."""
        if self.world_size == 1:
            return x
        dim = dim % x.dim()
        if x.shape[dim] % self.world_size:
            raise ShardingError(
                f"reduce_scatter on group {self.name}: dim {dim} of size {x.shape[dim]} "
                f"does not divide by world size {self.world_size}"
            )
        return funcol.wait_tensor(funcol.reduce_scatter_single(x.contiguous(), "sum", dim, self.group))


_SINGLE = ProcessGroupHandle("tp", 1, 0, None)
_tp: ProcessGroupHandle = _SINGLE


def init_parallel_state(tp_degree: int = 1) -> ProcessGroupHandle:
    """Set up the TP group. Degree 1 needs no process group; more needs torch.distributed initialised."""
    global _tp
    if tp_degree == 1:
        _tp = _SINGLE
        return _tp
    if not dist.is_initialized():
        raise ShardingError(
            f"tp_degree={tp_degree} needs torch.distributed initialised (see parallel.launch)"
        )
    world = dist.get_world_size()
    if world != tp_degree:
        raise ShardingError(f"tp_degree={tp_degree} does not match the torch.distributed world size {world}")
    _tp = ProcessGroupHandle("tp", world, dist.get_rank(), dist.group.WORLD)
    return _tp


def get_tp_group() -> ProcessGroupHandle:
    return _tp


def destroy_parallel_state() -> None:
    global _tp
    _tp = _SINGLE
