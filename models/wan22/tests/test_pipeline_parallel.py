"""Tier 2 on 2 gloo ranks: one denoising step of T2V at TP=2, CP=2 (ring and all-gather attention) and
CFG=2, and of I2V at CFG=2, against diffusers' single-process latents. One spawn runs every mesh in turn."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
import torch

from trnmodels.core.parallel.launch import run_on_ranks

from .conftest import make_image
from .test_pipeline import FP32_TOL, call_args, latents

HERE = Path(__file__).parent

pytestmark = pytest.mark.slow  # every test reads the 2-rank spawn; test_pipeline.py is the single-rank tier


@pytest.fixture(scope="module")
def ranks(tiny_t2v, tiny_i2v):
    mp = pytest.MonkeyPatch()
    mp.syspath_prepend(str(HERE))
    try:
        fns = importlib.import_module("_wan22_rank_fns")
        return run_on_ranks(
            fns.single_steps, 2, str(tiny_t2v.path), str(tiny_i2v.path), call_args(1), make_image()
        )
    finally:
        mp.undo()


@pytest.mark.parametrize("mesh", ["tp2", "cp2_ring", "cp2_allgather", "cfg2"])
def test_t2v_single_step_matches_diffusers(tiny_t2v, ranks, mesh):
    expected = latents(tiny_t2v.reference, **call_args(1))
    for r in ranks:
        torch.testing.assert_close(r[mesh], expected, **FP32_TOL)


def test_i2v_single_step_matches_diffusers(tiny_i2v, ranks):
    """Rank 1 has no VAE: its image condition arrives from rank 0."""
    expected = latents(tiny_i2v.reference, **call_args(1, image=make_image()))
    for r in ranks:
        torch.testing.assert_close(r["i2v_cfg2"], expected, **FP32_TOL)


def test_only_the_vae_rank_builds_and_decodes(ranks):
    assert [r["has_vae"] for r in ranks] == [True, False]
    assert ranks[0]["video_shape"] == (1, 5, 3, 32, 32)
    assert ranks[1]["video_shape"] is None


def test_mesh_errors(ranks):
    for r in ranks:
        assert "cfg_parallel_size=2 needs classifier-free guidance" in r["cfg2_no_guidance"]
        assert "1 latent tokens are not divisible by cp_degree=2" in r["cp2_indivisible"]
