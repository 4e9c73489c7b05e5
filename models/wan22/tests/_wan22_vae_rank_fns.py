"""Rank functions of the VAE patch-parallel test (importable by spawned ranks)."""

from __future__ import annotations

import torch

from trnmodels.core.parallel.state import get_world_group
from trnmodels.wan22.vae import Wan22VAE

TILES = dict(
    tile_sample_min_height=32,
    tile_sample_min_width=32,
    tile_sample_stride_height=24,
    tile_sample_stride_width=24,
)


def patch_parallel_decode(rank: int, world_size: int, vae_dir: str, z: torch.Tensor) -> list[torch.Tensor]:
    """Every VAE rank's decode of ``z`` with the tiles spread over the world (gathered for rank 0)."""
    vae = Wan22VAE.from_pretrained(vae_dir).eval()
    vae.enable_tiling(**TILES)
    vae.enable_patch_parallel(world_size)
    with torch.no_grad():
        sample = vae.decode(z).sample
    return list(get_world_group().all_gather(sample.unsqueeze(0), dim=0).unbind(0))
