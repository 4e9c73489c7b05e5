"""Structural similarity (SSIM) per video frame: the end-to-end check of a diffusion pipeline.

A per-step error too small for a single-step comparison can compound over the denoising loop into a
washed-out video; SSIM on the decoded frames is what catches it. The standard definition (Wang et al.,
2004): an 11x11 Gaussian window with sigma 1.5, ``C1 = (0.01 L)^2``, ``C2 = (0.03 L)^2`` for data range ``L``,
computed per channel over valid windows and averaged; one value per frame.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _window(size: int, sigma: float) -> torch.Tensor:
    x = torch.arange(size, dtype=torch.float64) - (size - 1) / 2
    g = torch.exp(-(x**2) / (2 * sigma**2))
    g = g / g.sum()
    return (g[:, None] * g[None, :])[None, None]


def ssim_per_frame(
    a: torch.Tensor, b: torch.Tensor, *, data_range: float = 1.0, window: int = 11, sigma: float = 1.5
) -> torch.Tensor:
    """SSIM of two videos ``[F, H, W, C]`` (or ``[F, H, W]``), one value per frame (float64 ``[F]``).

    Frames smaller than the window use a window of their own size."""
    if a.shape != b.shape:
        raise ValueError(f"ssim_per_frame: shape mismatch {list(a.shape)} vs {list(b.shape)}")
    a, b = (torch.as_tensor(x).to(torch.float64) for x in (a, b))
    if a.dim() == 3:
        a, b = a[..., None], b[..., None]
    _, height, width, channels = a.shape
    size = min(window, height, width)
    w = _window(size, sigma).expand(channels, 1, size, size)
    x, y = (t.permute(0, 3, 1, 2) for t in (a, b))  # [F, C, H, W]

    def blur(t: torch.Tensor) -> torch.Tensor:
        return F.conv2d(t, w, groups=channels)

    mu_x, mu_y = blur(x), blur(y)
    var_x = blur(x * x) - mu_x**2
    var_y = blur(y * y) - mu_y**2
    cov = blur(x * y) - mu_x * mu_y
    c1, c2 = (0.01 * data_range) ** 2, (0.03 * data_range) ** 2
    ssim = ((2 * mu_x * mu_y + c1) * (2 * cov + c2)) / ((mu_x**2 + mu_y**2 + c1) * (var_x + var_y + c2))
    return ssim.mean(dim=(1, 2, 3))
