"""VAE patch parallelism: the tiles of one decode spread over the ranks of a VAE-only group.

At high resolution the decode is the largest single activation footprint of a video pipeline, and it runs
on the VAE rank alone while the other cores idle. With ``vae_patch_parallel_size = P`` the first ``P``
ranks of the world form a VAE group; every rank of it holds the (unsharded) VAE, decodes every ``P``-th
tile of the tiling grid (:mod:`.vae_tiling`), and the tiles are all-gathered and blended on every member,
in lockstep. The result is the single-rank tiled decode, computed ``P`` ways.

The group is created once, collectively, by :func:`init_vae_patch_group` (every rank of the world calls
it, members and non-members alike, at pipeline construction), so compiled collectives can resolve it.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ..errors import ShardingError
from ..parallel.state import ProcessGroupHandle, get_world_group
from .vae_tiling import TileFn, TileGrid, blend_tiles

_groups: dict[int, ProcessGroupHandle | None] = {}


def is_vae_rank(rank: int, vae_patch_parallel_size: int = 1) -> bool:
    """Whether ``rank`` builds and runs the VAE: rank 0, or the first ``P`` ranks with patch parallelism."""
    return rank < max(1, vae_patch_parallel_size)


def init_vae_patch_group(size: int) -> ProcessGroupHandle | None:
    """The VAE group of ranks ``0..size-1``: this rank's handle, or None on a rank outside it.

    Every rank of the world must call this with the same ``size`` (creating a group is collective).
    """
    world = get_world_group()
    if not isinstance(size, int) or isinstance(size, bool) or size < 1:
        raise ShardingError(f"vae_patch_parallel_size: expected a positive integer, got {size!r}")
    if size > world.world_size:
        raise ShardingError(
            f"vae_patch_parallel_size={size} exceeds the world size {world.world_size} "
            "(the VAE group is made of the first ranks of the world)"
        )
    if size in _groups:
        return _groups[size]
    if size == 1:
        handle: ProcessGroupHandle | None = ProcessGroupHandle("vae_patch", 1, 0) if world.rank == 0 else None
    elif size == world.world_size:
        handle = ProcessGroupHandle("vae_patch", size, world.rank, world.group)
    else:
        group = dist.new_group(list(range(size)))
        handle = ProcessGroupHandle("vae_patch", size, world.rank, group) if world.rank < size else None
    _groups[size] = handle
    return handle


def destroy_vae_patch_groups() -> None:
    for handle in _groups.values():
        if handle is not None and handle.group is not None and handle.group is not dist.group.WORLD:
            dist.destroy_process_group(handle.group)
    _groups.clear()


def tile_out_shape(grid: TileGrid, start: tuple[int, int]) -> tuple[int, int]:
    h, w = grid.tile_in_shape(start)
    return h * grid.out_size[0] // grid.in_size[0], w * grid.out_size[1] // grid.in_size[1]


def patch_parallel_map(
    x: torch.Tensor, fn: TileFn, grid: TileGrid, group: ProcessGroupHandle
) -> torch.Tensor:
    """The tiled pass of ``x`` with tile ``k`` computed on group rank ``k % P``; every member gets the result."""
    size, rank = group.world_size, group.rank
    tiles = grid.tiles()
    mine = [fn(grid.window(x, t)) for t in tiles[rank::size]]
    per_rank = -(-len(tiles) // size)
    full_h, full_w = tile_out_shape(grid, (0, 0))
    # A rank with no tile (more ranks than tiles) still joins the collectives; the leading dims of a tile
    # output (batch, channels, frames) are agreed on first.
    lead = torch.tensor(list(mine[0].shape[:3]) if mine else [0, 0, 0], dtype=torch.int64)
    lead = group.all_gather(lead.view(1, 3), dim=0).amax(dim=0).tolist()
    like = mine[0] if mine else x
    stack = like.new_zeros((per_rank, *lead, full_h, full_w))
    for q, out in enumerate(mine):
        stack[q, ..., : out.shape[-2], : out.shape[-1]] = out
    gathered = group.all_gather(stack, dim=0)
    outputs: list[list[torch.Tensor]] = [[] for _ in grid.rows]
    for k, start in enumerate(tiles):
        h, w = tile_out_shape(grid, start)
        tile = gathered[(k % size) * per_rank + k // size, ..., :h, :w].clone()
        outputs[k // len(grid.cols)].append(tile)
    return blend_tiles(outputs, grid)


class VaePatchParallelMixin:
    """Adds ``vae_patch_parallel_size`` to a tiling VAE (``SpatialTilingMixin``)."""

    vae_patch_parallel_size: int = 1

    def enable_patch_parallel(self, size: int) -> None:
        """Spread tiled decodes over the first ``size`` ranks; every one of them must call this."""
        group = init_vae_patch_group(size)
        if group is None:
            raise ShardingError(
                f"rank {get_world_group().rank} is outside the VAE group of size {size}: "
                "only ranks that run the VAE build it (see is_vae_rank)"
            )
        self.vae_patch_parallel_size = size

    @property
    def vae_patch_group(self) -> ProcessGroupHandle:
        group = _groups.get(self.vae_patch_parallel_size)
        if group is None:  # size 1, never initialised: this rank alone
            return ProcessGroupHandle("vae_patch", 1, 0)
        return group

    def patch_parallel_decode_latents(self, z: torch.Tensor, decode_tile: TileFn) -> torch.Tensor:
        grid = self.decode_tile_grid((z.shape[-2], z.shape[-1]))  # type: ignore[attr-defined]
        return patch_parallel_map(z, decode_tile, grid, self.vae_patch_group)
