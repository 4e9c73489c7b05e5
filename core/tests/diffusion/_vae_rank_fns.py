"""Rank functions of the VAE patch-parallel tests (importable by spawned ranks)."""

from __future__ import annotations

import torch

from trnmodels.core.diffusion.vae_patch_parallel import init_vae_patch_group, patch_parallel_map
from trnmodels.core.diffusion.vae_tiling import decode_grid
from trnmodels.core.parallel.state import get_world_group


def upsample_tile(tile: torch.Tensor) -> torch.Tensor:
    """A stand-in decoder: spatially local (nearest x8) plus a per-tile term, so a misplaced or missing
    tile changes the result."""
    out = tile.repeat_interleave(8, dim=-2).repeat_interleave(8, dim=-1)
    return out + tile.mean()


def patch_parallel_upsample(rank: int, world_size: int, z: torch.Tensor) -> list[torch.Tensor]:
    """Every rank's result of a patch-parallel pass over the whole world (gathered for rank 0)."""
    group = init_vae_patch_group(world_size)
    grid = decode_grid((z.shape[-2], z.shape[-1]), 8, (32, 32), (24, 24))
    out = patch_parallel_map(z, upsample_tile, grid, group)
    return list(get_world_group().all_gather(out.unsqueeze(0), dim=0).unbind(0))
