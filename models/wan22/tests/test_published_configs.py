"""The published Wan2.2-T2V-A14B DiT config, verbatim but shrunk in size only, through our loader.

A field we refuse or ignore in a published config is a model we cannot serve, so the tiny checkpoint here
writes both experts' ``config.json`` as the published file with only size fields changed
(``trnmodels.core.testing.published.shrink``), and diffusers' reference is loaded from the same files.

What is verbatim: the DiT config of Wan-AI/Wan2.2-T2V-A14B-Diffusers (``transformer_2/config.json``, bundled
in core; ``transformer/`` carries the same config, both experts share the architecture, so it is used for
both). What is not: the text encoder (UMT5), the VAE (AutoencoderKLWan), the scheduler, the tokenizer,
``model_index.json`` and the I2V A14B DiT (in_channels 36) have no verbatim copy here; they stay the tiny
configs of ``conftest.py``.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
from pathlib import Path

import pytest
import torch

from trnmodels.core.parallel.launch import run_on_ranks
from trnmodels.core.testing.published import FP32_ATOL, published_config, shrink
from trnmodels.wan22.pipeline_t2v import Wan22Pipeline
from trnmodels.wan22.transformer import WanDiT, WanDiTConfig

from .conftest import BOUNDARY_RATIO, TINY_UMT5, make_checkpoint
from .test_pipeline import FP32_TOL, call_args, latents

HERE = Path(__file__).parent
PUBLISHED = "Wan2.2-T2V-A14B-Diffusers/transformer_2"
# Sizes only; everything else (freq_dim 256, rope_max_seq_len 1024 included) stays as published.
SIZES = dict(
    num_layers=2,
    num_attention_heads=2,  # TP=2 splits the heads
    attention_head_dim=12,
    ffn_dim=32,
    text_dim=TINY_UMT5["d_model"],  # the text encoder is not verbatim: its width sets text_dim
)
DIT_CONFIG = shrink(published_config(PUBLISHED), SIZES)
DIT_TOL = dict(rtol=0, atol=FP32_ATOL)  # max abs difference


@pytest.fixture(scope="module")
def published_t2v(tmp_path_factory):
    return make_checkpoint(
        tmp_path_factory.mktemp("wan22-t2v-published"), "t2v", seed=20, dit_config=DIT_CONFIG
    )


def dit_inputs() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(5)
    latents_ = torch.randn(2, DIT_CONFIG["in_channels"], 2, 4, 4, generator=g)
    timestep = torch.tensor([950, 400])  # one high-noise and one low-noise step, int64 as the scheduler's
    context = torch.randn(2, 16, DIT_CONFIG["text_dim"], generator=g)
    return latents_, timestep, context


def reference_outputs(checkpoint, inputs) -> dict[str, torch.Tensor]:
    with torch.no_grad():
        return {
            name: getattr(checkpoint.reference, name)(*inputs, return_dict=False)[0]
            for name in ("transformer", "transformer_2")
        }


def _plain(value):
    return list(value) if isinstance(value, tuple) else value


def test_checkpoint_carries_the_published_config(published_t2v):
    """The files are the published config (sizes aside), diffusers read them so, and so did we: every
    published field is one our config reads, with the published value."""
    published = published_config(PUBLISHED)
    ours = {f.name for f in dataclasses.fields(WanDiTConfig)}
    assert set(published) - {"_class_name", "_diffusers_version"} <= ours
    for name in ("transformer", "transformer_2"):
        path = published_t2v.path / name
        on_disk = json.loads((path / "config.json").read_text())
        assert on_disk == DIT_CONFIG
        assert {k: v for k, v in on_disk.items() if k not in SIZES} == {
            k: v for k, v in published.items() if k not in SIZES
        }
        loaded = getattr(published_t2v.reference, name).config
        cfg = dataclasses.asdict(WanDiTConfig.from_pretrained(path))
        for field, value in DIT_CONFIG.items():
            if not field.startswith("_"):
                assert _plain(cfg[field]) == _plain(loaded[field]) == value, field


def test_dit_matches_diffusers_tp1(published_t2v):
    inputs = dit_inputs()
    expected = reference_outputs(published_t2v, inputs)
    for name in ("transformer", "transformer_2"):
        with torch.no_grad():
            got = WanDiT.from_pretrained(published_t2v.path / name)(*inputs)
        assert got.shape == expected[name].shape == inputs[0].shape
        torch.testing.assert_close(got, expected[name], **DIT_TOL)


@pytest.mark.slow  # two gloo ranks
def test_dit_matches_diffusers_tp2(published_t2v):
    inputs = dit_inputs()
    expected = reference_outputs(published_t2v, inputs)
    mp = pytest.MonkeyPatch()
    mp.syspath_prepend(str(HERE))
    try:
        fns = importlib.import_module("_wan22_rank_fns")
        ranks = run_on_ranks(fns.dit_outputs, 2, str(published_t2v.path), inputs)
    finally:
        mp.undo()
    for r in ranks:
        for name in ("transformer", "transformer_2"):
            torch.testing.assert_close(r[name], expected[name], **DIT_TOL)


def test_t2v_generation_matches_diffusers(published_t2v):
    """The whole pipeline, 4 steps straddling the expert boundary, against diffusers' WanPipeline."""
    pipe = Wan22Pipeline.from_pretrained(published_t2v.path, dtype=torch.float32)
    args = call_args(4)
    expected = latents(published_t2v.reference, **args)
    got = latents(pipe, **args)
    boundary = BOUNDARY_RATIO * pipe.scheduler.config.num_train_timesteps
    timesteps = pipe.scheduler.timesteps
    assert (timesteps >= boundary).any() and (timesteps < boundary).any()
    torch.testing.assert_close(got, expected, **FP32_TOL)


def test_out_channels_null_means_in_channels(published_t2v, tmp_path):
    """Not a published value: diffusers reads ``out_channels: null`` as ``in_channels``, and so must we
    (it used to fail with a bare TypeError while building the output head)."""
    from diffusers import WanTransformer3DModel

    folder = tmp_path / "transformer"
    folder.mkdir()
    for file in (published_t2v.path / "transformer").iterdir():
        (folder / file.name).write_bytes(file.read_bytes())
    (folder / "config.json").write_text(json.dumps({**DIT_CONFIG, "out_channels": None}, indent=2))
    inputs = dit_inputs()
    with torch.no_grad():
        expected = WanTransformer3DModel.from_pretrained(folder).eval()(*inputs, return_dict=False)[0]
        ours = WanDiT.from_pretrained(folder)
        got = ours(*inputs)
    assert ours.config.out_channels == DIT_CONFIG["in_channels"]
    torch.testing.assert_close(got, expected, **DIT_TOL)
