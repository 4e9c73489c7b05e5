"""VAE spatial tiling and patch parallelism, with a spatially local stand-in for the VAE."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
import torch

from trnmodels.core.diffusion.vae_tiling import blend_into, decode_grid, encode_grid, tiled_map
from trnmodels.core.errors import ConfigError, ShardingError
from trnmodels.core.parallel.launch import run_on_ranks

HERE = Path(__file__).parent


def nearest8(tile: torch.Tensor) -> torch.Tensor:
    return tile.repeat_interleave(8, dim=-2).repeat_interleave(8, dim=-1)


def test_grid_matches_diffusers_layout():
    # 10x13 latent, tiles of 32 sample pixels every 24 (diffusers' defaults scaled down): 4 latent px apart.
    grid = decode_grid((10, 13), 8, (32, 32), (24, 24))
    assert grid.tile_in == (4, 4) and grid.stride_in == (3, 3)
    assert grid.blend_out == (8, 8) and grid.stride_out == (24, 24)
    assert grid.rows == [0, 3, 6, 9] and grid.cols == [0, 3, 6, 9, 12]
    assert grid.out_size == (80, 104)
    assert grid.distinct_tile_shapes() == [(1, 1), (1, 4), (4, 1), (4, 4)]
    enc = encode_grid((80, 104), 8, (32, 32), (24, 24))
    assert enc.tile_in == (32, 32) and enc.blend_out == (1, 1) and enc.stride_out == (3, 3)


def test_tiled_local_op_equals_untiled():
    # A spatially local op has no seams: blending identical overlaps must give back the untiled result.
    z = torch.randn(1, 2, 3, 10, 13, generator=torch.Generator().manual_seed(0))
    grid = decode_grid((10, 13), 8, (32, 32), (24, 24))
    torch.testing.assert_close(tiled_map(z, nearest8, grid), nearest8(z))


def test_blend_is_a_linear_ramp():
    prev = torch.full((1, 1, 1, 4, 2), 10.0)
    tile = torch.zeros(1, 1, 1, 4, 2)
    blend_into(prev, tile, 4, dim=-2)
    # tile[k] = prev * (1 - k/4) + tile[k] * k/4
    torch.testing.assert_close(tile[0, 0, 0, :, 0], torch.tensor([10.0, 7.5, 5.0, 2.5]))


def test_bad_tile_sizes_are_named():
    with pytest.raises(ConfigError, match="tile_sample_min_height=16 must be at least tile_sample_stride"):
        decode_grid((8, 8), 8, (16, 32), (24, 24))
    with pytest.raises(ConfigError, match="multiples of the spatial compression ratio 8"):
        decode_grid((8, 8), 8, (36, 32), (24, 24))


def test_patch_group_size_is_checked():
    from trnmodels.core.diffusion.vae_patch_parallel import init_vae_patch_group

    with pytest.raises(ShardingError, match="vae_patch_parallel_size=2 exceeds the world size 1"):
        init_vae_patch_group(2)


@pytest.fixture(scope="module")
def rank_fns():
    mp = pytest.MonkeyPatch()
    mp.syspath_prepend(str(HERE))
    try:
        yield importlib.import_module("_vae_rank_fns")
    finally:
        mp.undo()


@pytest.mark.slow  # two gloo ranks
def test_patch_parallel_equals_single_rank_tiling(rank_fns):
    z = torch.randn(1, 2, 2, 10, 13, generator=torch.Generator().manual_seed(1))
    grid = decode_grid((10, 13), 8, (32, 32), (24, 24))
    expected = tiled_map(z, rank_fns.upsample_tile, grid)
    per_rank = run_on_ranks(rank_fns.patch_parallel_upsample, 2, z)
    # The ranks are other processes (another thread count), and the stand-in's tile.mean() is a reduction
    # whose summation order may follow the thread count: allow a few FP32 ulps of the output's magnitude,
    # far below what a misplaced or missing tile changes (O(1)).
    atol = 8 * torch.finfo(torch.float32).eps * max(1.0, expected.abs().max().item())
    for out in per_rank:  # both members of the group hold the whole result
        torch.testing.assert_close(out, expected, rtol=0, atol=atol)
