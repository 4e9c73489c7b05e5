"""Tiers 2 and 3 on one rank, and the pipelines' input errors.

Tier 2: the whole T2V pipeline for one denoising step against diffusers' latents (VAE decode excluded):
FP32 tightly, BF16 three-way. Tier 3: a full tiny generation (4 steps, both experts) for T2V and I2V,
same seed, latents within tolerance of diffusers'.
"""

from __future__ import annotations

import copy

import pytest
import torch

from trnmodels.core.accuracy import assert_close_three_way
from trnmodels.core.errors import ConfigError, InputError, NonFiniteOutputError, ShardingError
from trnmodels.wan22.pipeline_i2v import Wan22ImageToVideoPipeline
from trnmodels.wan22.pipeline_t2v import Wan22Pipeline

from .conftest import BOUNDARY_RATIO, NEGATIVE, PROMPT, VIDEO, bf16_like_diffusers, make_image

FP32_TOL = dict(rtol=1e-4, atol=1e-4)


def call_args(steps: int, **extra) -> dict:
    args = dict(
        prompt=PROMPT,
        negative_prompt=NEGATIVE,
        num_inference_steps=steps,
        guidance_scale=5.0,
        guidance_scale_2=3.0,
        output_type="latent",
        **VIDEO,
    )
    return args | extra


def latents(pipe, **kwargs) -> torch.Tensor:
    return pipe(generator=torch.Generator().manual_seed(0), **kwargs).frames


@pytest.fixture(scope="module")
def t2v(tiny_t2v) -> Wan22Pipeline:
    return Wan22Pipeline.from_pretrained(tiny_t2v.path, dtype=torch.float32)


@pytest.fixture(scope="module")
def i2v(tiny_i2v) -> Wan22ImageToVideoPipeline:
    return Wan22ImageToVideoPipeline.from_pretrained(tiny_i2v.path, dtype=torch.float32)


# --- tier 2: one step ----------------------------------------------------------------------------


def test_single_step_fp32_matches_diffusers(tiny_t2v, t2v):
    args = call_args(1)
    expected = latents(tiny_t2v.reference, **args)
    got = latents(t2v, **args)
    assert got.dtype == torch.float32 and got.shape == expected.shape == (1, 16, 2, 4, 4)
    torch.testing.assert_close(got, expected, **FP32_TOL)


def test_single_step_bf16_three_way(tiny_t2v):
    reference = tiny_t2v.reference
    args = call_args(1)
    expected = latents(reference, **args)
    bf16_reference = copy.copy(reference)
    bf16_reference.register_modules(
        transformer=bf16_like_diffusers(reference.transformer),
        transformer_2=bf16_like_diffusers(reference.transformer_2),
        text_encoder=copy.deepcopy(reference.text_encoder).to(torch.bfloat16),
    )
    baseline = latents(bf16_reference, **args)
    ours = latents(Wan22Pipeline.from_pretrained(tiny_t2v.path, dtype=torch.bfloat16), **args)
    assert ours.dtype == torch.float32  # latents stay float32; the DiT runs in BF16
    assert_close_three_way(ours, expected, baseline, name="t2v single step bf16")


# --- tier 3: full tiny generations -----------------------------------------------------------------


def test_t2v_generation_matches_diffusers(tiny_t2v, t2v):
    args = call_args(4)
    expected = latents(tiny_t2v.reference, **args)
    got = latents(t2v, **args)
    # 4 steps straddle the expert boundary, so both experts ran.
    timesteps = t2v.scheduler.timesteps
    boundary = BOUNDARY_RATIO * t2v.scheduler.config.num_train_timesteps
    assert (timesteps >= boundary).any() and (timesteps < boundary).any()
    torch.testing.assert_close(got, expected, **FP32_TOL)


def test_i2v_generation_matches_diffusers(tiny_i2v, i2v):
    args = call_args(4, image=make_image())
    expected = latents(tiny_i2v.reference, **args)
    got = latents(i2v, **args)
    torch.testing.assert_close(got, expected, **FP32_TOL)


def test_guidance_off_and_seed_reproducibility(tiny_t2v, t2v):
    args = call_args(2, guidance_scale=1.0, guidance_scale_2=1.0)
    expected = latents(tiny_t2v.reference, **args)
    torch.testing.assert_close(latents(t2v, **args), expected, **FP32_TOL)
    # Another seed gives diffusers' latents for that seed, far from seed 0's (the generator is used) ...
    expected_1 = tiny_t2v.reference(generator=torch.Generator().manual_seed(1), **args).frames
    assert (expected_1 - expected).abs().max() > 100 * FP32_TOL["atol"]
    got_1 = t2v(generator=torch.Generator().manual_seed(1), **args).frames
    torch.testing.assert_close(got_1, expected_1, **FP32_TOL)
    # ... and seed 0 again after it reproduces diffusers' seed-0 latents (no state kept between calls).
    torch.testing.assert_close(latents(t2v, **args), expected, **FP32_TOL)


# --- bad input -------------------------------------------------------------------------------------


def test_bad_video_sizes_are_refused(t2v):
    with pytest.raises(InputError, match=r"height=40 is not divisible by 16 \(the VAE's spatial factor 8"):
        t2v(**call_args(1) | {"height": 40})
    with pytest.raises(InputError, match="width=24 is not divisible by 16"):
        t2v(**call_args(1) | {"width": 24})
    with pytest.raises(InputError, match=r"num_frames=6 is not of the form 4k\+1.*try 5"):
        t2v(**call_args(1) | {"num_frames": 6})


def test_i2v_without_image_is_refused(i2v):
    with pytest.raises(InputError, match="needs an image"):
        i2v(**call_args(1))


def test_missing_low_noise_expert_is_refused(tiny_t2v, tmp_path):
    with pytest.raises(ConfigError, match=r"boundary_ratio=0\.875 switches to the low-noise expert"):
        Wan22Pipeline(
            tokenizer=None,
            text_encoder=None,
            vae=None,
            scheduler=None,
            transformer=None,
            boundary_ratio=0.875,
        )
    import shutil

    broken = tmp_path / "no-expert-2"
    shutil.copytree(tiny_t2v.path, broken)
    shutil.rmtree(broken / "transformer_2")
    with pytest.raises(
        ConfigError, match=r"boundary_ratio=0\.875 needs the low-noise expert.*no transformer_2"
    ):
        Wan22Pipeline.from_pretrained(broken)


@pytest.mark.parametrize(
    ("file", "field"),
    [
        ("model_index.json", "boundary_ratio"),
        ("transformer/config.json", "eps"),
        ("text_encoder/config.json", "layer_norm_epsilon"),
        ("vae/config.json", "dropout"),
    ],
)
def test_a_non_finite_number_in_a_component_config_is_refused_naming_file_and_field(
    tiny_t2v, tmp_path, file, field
):
    import json
    import shutil

    broken = tmp_path / "nan"
    shutil.copytree(tiny_t2v.path, broken)
    path = broken / file
    config = json.loads(path.read_text())
    config[field] = float("nan")  # json.dumps writes NaN, which json.loads reads back silently
    path.write_text(json.dumps(config))
    with pytest.raises(ConfigError, match=rf"{path}: {field}: expected a finite number, got nan"):
        Wan22Pipeline.from_pretrained(broken)


def test_mesh_mismatch_is_refused(tiny_t2v):
    with pytest.raises(ShardingError, match="asks for cfg_degree=2, but the running mesh is tp_degree=1"):
        Wan22Pipeline.from_pretrained(tiny_t2v.path, cfg_parallel=2)


# --- NaN and inf: refused where they appear, never returned ----------------------------------------


def poison(model: torch.nn.Module, name: str) -> None:
    with torch.no_grad():
        model.get_parameter(name).view(-1)[0] = float("nan")


def test_a_nan_weight_in_the_dit_stops_at_the_first_step_naming_expert_and_weight(t2v):
    pipe = copy.deepcopy(t2v)
    poison(pipe.transformer, "scale_shift_table")
    with pytest.raises(
        NonFiniteOutputError,
        match=r"denoise step 1 of 2 \(timestep 999\): transformer's prediction: NaN or inf in 512 of 512 "
        r"values.*\(checkpoint key scale_shift_table holds NaN or inf\)",
    ):
        pipe(**call_args(2))


def test_a_nan_weight_in_the_low_noise_expert_names_it_at_its_first_step(t2v):
    pipe = copy.deepcopy(t2v)
    name = next(name for name, _ in pipe.transformer_2.named_parameters())
    poison(pipe.transformer_2, name)
    # boundary_ratio 0.875 of 1000 train steps: with 2 steps, the second runs the low-noise expert.
    with pytest.raises(NonFiniteOutputError, match=r"denoise step 2 of 2 .*transformer_2's prediction"):
        pipe(**call_args(2))


def test_non_finite_latents_and_prompt_embeds_are_bad_input(t2v):
    shape = t2v.check_video_shape(VIDEO["num_frames"], VIDEO["height"], VIDEO["width"])
    given = torch.randn(1, *shape)
    given[0, 0, 0, 0, 0] = float("inf")
    with pytest.raises(InputError, match=r"Wan2.2 denoise: latents: NaN or inf in 1 of \d+ values"):
        t2v(**call_args(1), latents=given)
    embeds = torch.full((1, 8, 16), float("nan"))  # refused before its size is looked at
    args = call_args(1) | {"prompt": None, "negative_prompt": None, "prompt_embeds": embeds}
    with pytest.raises(InputError, match=r"Wan2.2 pipeline: prompt_embeds: NaN or inf"):
        t2v(**args)


def test_a_nan_weight_in_the_text_encoder_is_named(t2v):
    pipe = copy.deepcopy(t2v)
    poison(pipe.text_encoder, "final_norm")  # one channel of every token
    with pytest.raises(
        NonFiniteOutputError,
        match=r"Wan2.2 text encoder: prompt_embeds: NaN or inf in 16 of 512 values.*"
        r"checkpoint key encoder\.final_layer_norm\.weight holds NaN",
    ):
        pipe(**call_args(1))
