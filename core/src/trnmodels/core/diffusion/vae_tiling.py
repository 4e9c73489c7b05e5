"""Spatial tiling for video VAEs: run a VAE pass on overlapping tiles and blend the seams.

A decode (or encode) of a large frame needs activation memory in proportion to its area; on a NeuronCore
that is what runs out first. Tiling runs the same pass on fixed-size overlapping windows and blends each
tile into its upper and left neighbours with linear ramps, so memory is bounded by one tile.

The grid and the blend follow diffusers' ``AutoencoderKLWan.tiled_decode`` / ``tiled_encode`` exactly
(tiles start every ``stride`` input pixels, each is blended in place with the already-blended tile above
and to its left, then cropped to ``stride`` output pixels), so a tiled decode here equals diffusers' tiled
decode, and tiling is a choice with a known reference rather than a new approximation. Note that tiling
is not exact against an untiled pass: a tile does not see past its window (the Wan decoder even has a
frame-global attention in its middle block); the overlap only hides the seams.

``SpatialTilingMixin`` reads diffusers' tiling attributes (``use_tiling``, ``tile_sample_min_height``,
``tile_sample_min_width``, ``tile_sample_stride_height``, ``tile_sample_stride_width``,
``spatial_compression_ratio``), so ``enable_tiling(...)`` keeps working on a VAE that mixes it in.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from ..errors import ConfigError

TileFn = Callable[[torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class TileGrid:
    """Where the tiles of one pass start, in input pixels, and how their outputs are blended and cropped.

    Input and output are ``[B, C, T, H, W]``; a tile's output is its input window scaled by ``scale``
    (the VAE's spatial compression ratio for a decode, its inverse for an encode).
    """

    in_size: tuple[int, int]  # input (H, W)
    tile_in: tuple[int, int]  # input window (H, W)
    stride_in: tuple[int, int]
    blend_out: tuple[int, int]  # blend extent of neighbouring outputs
    stride_out: tuple[int, int]  # each blended tile output is cropped to this
    out_size: tuple[int, int]  # final output (H, W)

    @property
    def rows(self) -> list[int]:
        return list(range(0, self.in_size[0], self.stride_in[0]))

    @property
    def cols(self) -> list[int]:
        return list(range(0, self.in_size[1], self.stride_in[1]))

    def tiles(self) -> list[tuple[int, int]]:
        """Every tile's (row, col) start in input pixels, row-major."""
        return [(i, j) for i in self.rows for j in self.cols]

    def window(self, x: torch.Tensor, start: tuple[int, int]) -> torch.Tensor:
        i, j = start
        return x[:, :, :, i : i + self.tile_in[0], j : j + self.tile_in[1]]

    def tile_in_shape(self, start: tuple[int, int]) -> tuple[int, int]:
        """A tile's input (H, W): edge tiles are cut off by the frame border."""
        i, j = start
        return min(self.tile_in[0], self.in_size[0] - i), min(self.tile_in[1], self.in_size[1] - j)

    def distinct_tile_shapes(self) -> list[tuple[int, int]]:
        """The input shapes a tiled pass runs on (at most four: interior, right, bottom, corner)."""
        return sorted({self.tile_in_shape(t) for t in self.tiles()})


def decode_grid(
    latent_hw: tuple[int, int],
    spatial_ratio: int,
    tile_sample_min: tuple[int, int],
    tile_sample_stride: tuple[int, int],
) -> TileGrid:
    """The grid of a tiled decode of a ``latent_hw`` latent (tile sizes in sample pixels, as diffusers)."""
    _check_tiles(tile_sample_min, tile_sample_stride, spatial_ratio)
    return TileGrid(
        in_size=latent_hw,
        tile_in=(tile_sample_min[0] // spatial_ratio, tile_sample_min[1] // spatial_ratio),
        stride_in=(tile_sample_stride[0] // spatial_ratio, tile_sample_stride[1] // spatial_ratio),
        blend_out=(tile_sample_min[0] - tile_sample_stride[0], tile_sample_min[1] - tile_sample_stride[1]),
        stride_out=tile_sample_stride,
        out_size=(latent_hw[0] * spatial_ratio, latent_hw[1] * spatial_ratio),
    )


def encode_grid(
    sample_hw: tuple[int, int],
    spatial_ratio: int,
    tile_sample_min: tuple[int, int],
    tile_sample_stride: tuple[int, int],
) -> TileGrid:
    """The grid of a tiled encode of a ``sample_hw`` video (blending happens in latent pixels)."""
    _check_tiles(tile_sample_min, tile_sample_stride, spatial_ratio)
    tile_lat = (tile_sample_min[0] // spatial_ratio, tile_sample_min[1] // spatial_ratio)
    stride_lat = (tile_sample_stride[0] // spatial_ratio, tile_sample_stride[1] // spatial_ratio)
    return TileGrid(
        in_size=sample_hw,
        tile_in=tile_sample_min,
        stride_in=tile_sample_stride,
        blend_out=(tile_lat[0] - stride_lat[0], tile_lat[1] - stride_lat[1]),
        stride_out=stride_lat,
        out_size=(sample_hw[0] // spatial_ratio, sample_hw[1] // spatial_ratio),
    )


def _check_tiles(tile_min: tuple[int, int], stride: tuple[int, int], ratio: int) -> None:
    for axis, m, s in zip(("height", "width"), tile_min, stride, strict=True):
        if s <= 0 or m < s:
            raise ConfigError(
                f"VAE tiling: tile_sample_min_{axis}={m} must be at least tile_sample_stride_{axis}={s} > 0"
            )
        if m % ratio or s % ratio:
            raise ConfigError(
                f"VAE tiling: tile_sample_min_{axis}={m} and tile_sample_stride_{axis}={s} must be "
                f"multiples of the spatial compression ratio {ratio}"
            )


def blend_into(above_or_left: torch.Tensor, tile: torch.Tensor, extent: int, dim: int) -> None:
    """Ramp the first ``extent`` rows (``dim=-2``) or columns (``dim=-1``) of ``tile`` from its neighbour's
    last ones, in place: ``tile[k] = prev[-extent + k] * (1 - k / extent) + tile[k] * k / extent``.

    The weights are computed in float64 and each product is rounded to the tile's dtype, which is the
    arithmetic of diffusers' per-row Python-scalar loop, so the results agree bit for bit."""
    extent = min(above_or_left.shape[dim], tile.shape[dim], extent)
    if extent <= 0:
        return
    shape = [1] * tile.dim()
    shape[dim] = extent
    k = torch.arange(extent, dtype=torch.float64, device=tile.device) / extent
    w_tile = k.to(torch.float32).view(shape)
    w_prev = (1 - k).to(torch.float32).view(shape)
    head = tile.narrow(dim, 0, extent)
    prev = above_or_left.narrow(dim, above_or_left.shape[dim] - extent, extent)
    head.copy_((prev * w_prev).to(tile.dtype) + (head * w_tile).to(tile.dtype))


def blend_tiles(outputs: Sequence[Sequence[torch.Tensor]], grid: TileGrid) -> torch.Tensor:
    """Assemble per-tile outputs (``outputs[row][col]``) into one tensor. Tiles are blended in place."""
    rows = []
    for i, row in enumerate(outputs):
        cropped = []
        for j, tile in enumerate(row):
            if i > 0:
                blend_into(outputs[i - 1][j], tile, grid.blend_out[0], dim=-2)
            if j > 0:
                blend_into(row[j - 1], tile, grid.blend_out[1], dim=-1)
            cropped.append(tile[:, :, :, : grid.stride_out[0], : grid.stride_out[1]])
        rows.append(torch.cat(cropped, dim=-1))
    return torch.cat(rows, dim=-2)[:, :, :, : grid.out_size[0], : grid.out_size[1]]


def tiled_map(x: torch.Tensor, fn: TileFn, grid: TileGrid) -> torch.Tensor:
    """Run ``fn`` on every tile of ``x`` and blend the outputs (one tile's activations live at a time)."""
    outputs = [[fn(grid.window(x, (i, j))) for j in grid.cols] for i in grid.rows]
    return blend_tiles(outputs, grid)


class SpatialTilingMixin:
    """Tiled decode/encode for a VAE with diffusers' tiling attributes; the VAE supplies the per-tile pass."""

    use_tiling: bool
    tile_sample_min_height: int
    tile_sample_min_width: int
    tile_sample_stride_height: int
    tile_sample_stride_width: int
    spatial_compression_ratio: int

    def _tile_sizes(self) -> tuple[tuple[int, int], tuple[int, int]]:
        return (
            (self.tile_sample_min_height, self.tile_sample_min_width),
            (self.tile_sample_stride_height, self.tile_sample_stride_width),
        )

    def decode_tile_grid(self, latent_hw: tuple[int, int]) -> TileGrid:
        return decode_grid(latent_hw, self.spatial_compression_ratio, *self._tile_sizes())

    def encode_tile_grid(self, sample_hw: tuple[int, int]) -> TileGrid:
        return encode_grid(sample_hw, self.spatial_compression_ratio, *self._tile_sizes())

    def wants_tiled_decode(self, latent_hw: tuple[int, int]) -> bool:
        """Tiling is used only when on and the latent is larger than one tile (as diffusers decides)."""
        tile = self.decode_tile_grid(latent_hw).tile_in
        return self.use_tiling and (latent_hw[0] > tile[0] or latent_hw[1] > tile[1])

    def wants_tiled_encode(self, sample_hw: tuple[int, int]) -> bool:
        return self.use_tiling and (
            sample_hw[0] > self.tile_sample_min_height or sample_hw[1] > self.tile_sample_min_width
        )

    def tiled_decode_latents(self, z: torch.Tensor, decode_tile: TileFn) -> torch.Tensor:
        return tiled_map(z, decode_tile, self.decode_tile_grid((z.shape[-2], z.shape[-1])))

    def tiled_encode_sample(self, x: torch.Tensor, encode_tile: TileFn) -> torch.Tensor:
        return tiled_map(x, encode_tile, self.encode_tile_grid((x.shape[-2], x.shape[-1])))
