"""SSIM per frame against hand-computed values."""

from __future__ import annotations

import pytest
import torch

from trnmodels.core.accuracy.ssim import ssim_per_frame


def test_identical_frames_score_one():
    x = torch.rand(3, 16, 16, 3, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(ssim_per_frame(x, x), torch.ones(3, dtype=torch.float64))


def test_flat_frames_reduce_to_the_luminance_term():
    # No variance anywhere: SSIM = (2 mu_a mu_b + C1) / (mu_a^2 + mu_b^2 + C1), C1 = 0.01^2.
    a, b = torch.full((2, 12, 12, 3), 0.2), torch.full((2, 12, 12, 3), 0.6)
    c1 = 0.01**2
    expected = (2 * 0.2 * 0.6 + c1) / (0.2**2 + 0.6**2 + c1)
    torch.testing.assert_close(ssim_per_frame(a, b), torch.full((2,), expected, dtype=torch.float64))


def test_noise_lowers_the_score_per_frame():
    g = torch.Generator().manual_seed(1)
    x = torch.rand(2, 32, 32, 3, generator=g)
    noisy = x.clone()
    noisy[1] = (noisy[1] + 0.3 * torch.randn(32, 32, 3, generator=g)).clamp(0, 1)
    scores = ssim_per_frame(x, noisy)
    assert scores[0] == pytest.approx(1.0) and scores[1] < 0.9
