"""Parallel state: the process groups models call collectives on.

A ``ProcessGroupHandle`` is one group of the rank mesh (TP, EP, CP, CFG, or the whole world). With world
size 1 it needs no torch.distributed at all and every collective is the identity. The collectives are
torch's functional collectives, so they trace into compiled graphs.

The rank a graph needs (to mask a vocab shard, say) is passed into the graph as a tensor
(``rank_tensor``), never baked in, so all ranks share one compiled artifact.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
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


# Mesh dimensions, outermost first: rank = ((cfg * CP + cp) * EP + ep) * TP + tp. TP is innermost so a
# TP group is a run of neighbouring ranks (on Trainium, neighbouring NeuronCores).
MESH_DIMS: tuple[str, ...] = ("cfg", "cp", "ep", "tp")


@dataclass(frozen=True)
class ParallelLayout:
    """The degrees of the rank mesh. The world size is their product.

    ``tp`` splits attention heads and MLP width; ``ep`` splits MoE experts (attention is replicated across
    EP groups and each expert is TP-split inside its EP group); ``cp`` splits a sequence (context
    parallelism); ``cfg`` runs the two classifier-free-guidance branches on different ranks.
    """

    tp: int = 1
    ep: int = 1
    cp: int = 1
    cfg: int = 1

    def __post_init__(self) -> None:
        for dim in MESH_DIMS:
            value = getattr(self, dim)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ShardingError(f"{dim}_degree: expected a positive integer, got {value!r}")

    @property
    def world_size(self) -> int:
        return self.tp * self.ep * self.cp * self.cfg

    def describe(self) -> str:
        """The degrees that are not 1 (``tp_degree=2, ep_degree=2``), as the user wrote them."""
        parts = [
            f"{dim}_degree={getattr(self, dim)}" for dim in reversed(MESH_DIMS) if getattr(self, dim) > 1
        ]
        return ", ".join(parts) or "tp_degree=1"

    def coords(self, rank: int) -> dict[str, int]:
        """This rank's index along every mesh dimension."""
        out: dict[str, int] = {}
        for dim in reversed(MESH_DIMS):
            size = getattr(self, dim)
            out[dim] = rank % size
            rank //= size
        return out

    def rank_of(self, coords: dict[str, int]) -> int:
        rank = 0
        for dim in MESH_DIMS:
            rank = rank * getattr(self, dim) + coords.get(dim, 0)
        return rank

    def coord_tensor(self, rank: torch.Tensor, dim: str) -> torch.Tensor:
        """``coords(rank)[dim]`` computed on a rank *tensor*, so one compiled graph serves every rank."""
        stride = 1
        for inner in reversed(MESH_DIMS[MESH_DIMS.index(dim) + 1 :]):
            stride *= getattr(self, inner)
        return torch.remainder(torch.div(rank, stride, rounding_mode="floor"), getattr(self, dim))

    def group_ranks(self, dim: str) -> list[list[int]]:
        """Every group along ``dim``: the ranks that differ only in their ``dim`` coordinate."""
        others = [d for d in MESH_DIMS if d != dim]
        groups: dict[tuple[int, ...], list[int]] = {}
        for rank in range(self.world_size):
            c = self.coords(rank)
            groups.setdefault(tuple(c[d] for d in others), []).append(rank)
        return list(groups.values())


_SINGLE_LAYOUT = ParallelLayout()
_layout: ParallelLayout = _SINGLE_LAYOUT
_groups: dict[str, ProcessGroupHandle] = {}


_SINGLES = {name: ProcessGroupHandle(name, 1, 0, None) for name in (*MESH_DIMS, "world")}


def _single(name: str) -> ProcessGroupHandle:
    return _SINGLES[name]


def init_parallel_state(
    tp_degree: int = 1, *, ep_degree: int = 1, cp_degree: int = 1, cfg_degree: int = 1
) -> ParallelLayout:
    """Build the process groups of the rank mesh; every rank must call this with the same degrees.

    World size 1 needs no process group; more needs torch.distributed initialised with exactly
    ``tp * ep * cp * cfg`` ranks. Groups are created once, here (at model construction time), so
    compiled collectives can resolve them.
    """
    global _layout, _groups
    layout = ParallelLayout(tp=tp_degree, ep=ep_degree, cp=cp_degree, cfg=cfg_degree)
    if layout.world_size == 1:
        _layout, _groups = layout, {}
        return layout
    if not dist.is_initialized():
        raise ShardingError(
            f"{layout.describe()} needs torch.distributed initialised with {layout.world_size} ranks "
            "(see parallel.launch)"
        )
    world = dist.get_world_size()
    if world != layout.world_size:
        raise ShardingError(
            f"{layout.describe()} needs {layout.world_size} ranks, but torch.distributed has world size {world}"
        )
    rank = dist.get_rank()
    coords = layout.coords(rank)
    groups = {"world": ProcessGroupHandle("world", world, rank, dist.group.WORLD)}
    for dim in MESH_DIMS:
        size = getattr(layout, dim)
        if size == 1:
            groups[dim] = _single(dim)
            continue
        for ranks in layout.group_ranks(dim):
            # new_group is collective: every rank creates every group, in the same order.
            group = dist.group.WORLD if size == world else dist.new_group(ranks)
            if rank in ranks:
                groups[dim] = ProcessGroupHandle(dim, size, coords[dim], group)
    _layout, _groups = layout, groups
    return layout


def get_parallel_layout() -> ParallelLayout:
    return _layout


def _group(name: str) -> ProcessGroupHandle:
    return _groups.get(name) or _single(name)


def get_world_group() -> ProcessGroupHandle:
    """All ranks (e.g. to sum MoE partials that are split over both TP and EP)."""
    return _group("world")


def get_tp_group() -> ProcessGroupHandle:
    return _group("tp")


def get_ep_group() -> ProcessGroupHandle:
    return _group("ep")


def get_cp_group() -> ProcessGroupHandle:
    return _group("cp")


def get_cfg_group() -> ProcessGroupHandle:
    return _group("cfg")


@contextlib.contextmanager
def rank0_layout(layout: ParallelLayout) -> Iterator[None]:
    """Within the block the parallel state says "rank 0 of ``layout``" without process groups, so a model
    can be built (on the meta device, never run: its collectives have no group) to read its shapes per
    rank. The state before is restored after."""
    global _layout, _groups
    groups = {dim: ProcessGroupHandle(dim, getattr(layout, dim), 0) for dim in MESH_DIMS}
    groups["world"] = ProcessGroupHandle("world", layout.world_size, 0)
    saved = _layout, _groups
    _layout, _groups = layout, groups
    try:
        yield
    finally:
        _layout, _groups = saved


def destroy_parallel_state() -> None:
    global _layout, _groups
    for handle in _groups.values():
        if handle.group is not None and handle.group is not dist.group.WORLD and handle.name != "world":
            dist.destroy_process_group(handle.group)
    _layout, _groups = _SINGLE_LAYOUT, {}
