"""The vLLM-Omni engine adapter's pure parts: reading an ``OmniDiffusionConfig`` and mapping a request.

vLLM-Omni is not installed in the dev environment, so its config and sampling-params objects are stood
in for by namespaces with the same field names and defaults (vLLM-Omni 0.30's ``DiffusionParallelConfig``,
``OmniDiffusionSamplingParams`` after ``OmniDiffusionRequest.__post_init__``). ``nox -s integration-omni``
runs the adapter with vLLM-Omni's real types, model runner and loader
(``models/wan22/tests/omni_engine_check.py``).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from trnmodels.core.errors import ConfigError, InputError, ShardingError
from trnmodels.core.omni.engine import (
    EngineOptions,
    call_kwargs,
    engine_options,
    get_post_process_func,
    get_pre_process_func,
)

WAN_CALL = frozenset(
    "prompt negative_prompt height width num_frames num_inference_steps guidance_scale guidance_scale_2 "
    "num_videos_per_prompt generator latents prompt_embeds negative_prompt_embeds output_type return_dict "
    "max_sequence_length".split()
)


def parallel(**overrides) -> SimpleNamespace:
    fields = dict(
        pipeline_parallel_size=1,
        data_parallel_size=1,
        tensor_parallel_size=1,
        sequence_parallel_size=1,
        ulysses_degree=1,
        ring_degree=1,
        allgather_degree=1,
        cfg_parallel_size=1,
        vae_patch_parallel_size=1,
        use_hsdp=False,
    )
    return SimpleNamespace(**(fields | overrides))


def od_config(**overrides) -> SimpleNamespace:
    fields = dict(
        model="/ckpt/wan",
        dtype=torch.bfloat16,
        parallel_config=parallel(),
        vae_use_tiling=False,
        flow_shift=None,
        boundary_ratio=None,
        model_config={},
    )
    return SimpleNamespace(**(fields | overrides))


def sampling(**overrides) -> SimpleNamespace:
    """``OmniDiffusionSamplingParams`` defaults, as a request leaves them when it sets nothing."""
    fields = dict(
        height=None,
        width=None,
        num_frames=1,
        num_inference_steps=None,
        max_sequence_length=None,
        latents=None,
        guidance_scale=1.0,
        guidance_scale_provided=False,
        guidance_scale_2=1.0,
        guidance_scale_2_provided=False,
        num_outputs_per_prompt=1,
        generator=None,
        seed=None,
        output_type=None,
        boundary_ratio=None,
        sigmas=None,
        timesteps=None,
        extra_args={},
    )
    return SimpleNamespace(**(fields | overrides))


def test_engine_options_from_the_release_stage():
    config = od_config(
        dtype=torch.float32,
        parallel_config=parallel(
            tensor_parallel_size=4,
            ring_degree=8,
            sequence_parallel_size=8,
            cfg_parallel_size=2,
            vae_patch_parallel_size=16,
        ),
        vae_use_tiling=True,
        model_config={"boundary_ratio": 0.875, "flow_shift": 5.0, "enable_ring_attention": False},
    )
    options = engine_options(config)
    assert options == EngineOptions(
        checkpoint="/ckpt/wan",
        dtype=torch.float32,
        tp=4,
        cp=8,
        cfg_parallel=2,
        vae_patch_parallel_size=16,
        vae_use_tiling=True,
        flow_shift=5.0,
        boundary_ratio=0.875,
        enable_ring_attention=False,
    )
    assert (options.layout.tp, options.layout.cp, options.layout.cfg, options.layout.world_size) == (
        4,
        8,
        2,
        64,
    )
    assert options.pipeline_kwargs() == dict(
        tp=4, cfg_parallel=2, cp=8, dtype=torch.float32, vae_use_tiling=True, vae_patch_parallel_size=16,
        flow_shift=5.0, boundary_ratio=0.875, enable_ring_attention=False,
    )  # fmt: skip


def test_engine_arguments_override_model_config_and_unset_options_are_not_passed():
    options = engine_options(od_config(flow_shift=12.0, model_config={"flow_shift": 5.0}, dtype="bfloat16"))
    assert options.flow_shift == 12.0 and options.dtype is torch.bfloat16
    kwargs = engine_options(od_config()).pipeline_kwargs()
    assert (
        "flow_shift" not in kwargs
        and "boundary_ratio" not in kwargs
        and "enable_ring_attention" not in kwargs
    )


@pytest.mark.parametrize(
    "field, value",
    [
        ("ulysses_degree", 2),
        ("pipeline_parallel_size", 2),
        ("data_parallel_size", 2),
        ("allgather_degree", 2),
    ],
)
def test_unsupported_parallelism_is_refused(field, value):
    with pytest.raises(ShardingError, match=f"parallel_config.{field}={value}"):
        engine_options(od_config(parallel_config=parallel(**{field: value})))


def test_bad_config_is_refused():
    with pytest.raises(ShardingError, match="use_hsdp"):
        engine_options(od_config(parallel_config=parallel(use_hsdp=True)))
    with pytest.raises(ConfigError, match=r"od_config\.dtype"):
        engine_options(od_config(dtype=torch.float16))
    with pytest.raises(ConfigError, match=r"od_config\.model"):
        engine_options(od_config(model=None))


def test_a_full_request_maps_to_call_arguments():
    latents = torch.zeros(1, 16, 2, 4, 4)
    prompt = {"prompt": "a fox", "negative_prompt": "blurry", "multi_modal_data": {"image": "IMG"}}
    params = sampling(
        height=32, width=48, num_frames=5, num_inference_steps=4, max_sequence_length=16, latents=latents,
        guidance_scale=5.0, guidance_scale_provided=True, guidance_scale_2=3.0, guidance_scale_2_provided=True,
        num_outputs_per_prompt=2, seed=7, output_type="latent",
    )  # fmt: skip
    kwargs = call_kwargs(prompt, params, accepted=WAN_CALL | {"image"})
    generator = kwargs.pop("generator")
    assert kwargs == dict(
        prompt="a fox", negative_prompt="blurry", image="IMG", height=32, width=48, num_frames=5,
        num_inference_steps=4, max_sequence_length=16, latents=latents, guidance_scale=5.0,
        guidance_scale_2=3.0, num_videos_per_prompt=2, output_type="latent",
    )  # fmt: skip
    # No generator from the runner: one seeded like the runner's (torch.Generator().manual_seed(seed)).
    assert torch.equal(
        torch.randn(3, generator=generator), torch.randn(3, generator=torch.Generator().manual_seed(7))
    )


def test_engine_defaults_are_not_requests():
    generator = torch.Generator()
    kwargs = call_kwargs("a fox", sampling(generator=generator), accepted=WAN_CALL)
    # num_frames=1 and guidance 1.0 are vLLM-Omni's fill-ins, not the caller's: the pipeline keeps its own.
    assert kwargs == dict(prompt="a fox", generator=generator, output_type="np")


def test_the_warm_up_keeps_its_frame_and_the_pipeline_guidance():
    params = sampling(
        height=512, width=512, num_inference_steps=2, guidance_scale=0.0, guidance_scale_provided=True
    )
    kwargs = call_kwargs({"prompt": "dummy run"}, params, accepted=WAN_CALL, warmup=True)
    assert kwargs["num_frames"] == 1 and "guidance_scale" not in kwargs


def test_requests_the_pipeline_cannot_serve_are_refused():
    with pytest.raises(InputError, match="conditions on no image"):
        call_kwargs({"prompt": "a", "multi_modal_data": {"image": "IMG"}}, sampling(), accepted=WAN_CALL)
    with pytest.raises(InputError, match="takes no num_frames"):
        call_kwargs("a", sampling(num_frames=5), accepted=WAN_CALL - {"num_frames"})
    with pytest.raises(InputError, match="boundary_ratio"):
        call_kwargs("a", sampling(boundary_ratio=0.5), accepted=WAN_CALL)
    with pytest.raises(InputError, match=r"extra_args\.flow_shift"):
        call_kwargs("a", sampling(extra_args={"flow_shift": 3.0}), accepted=WAN_CALL)


def test_pre_process_opens_an_image_path(tmp_path):
    from PIL import Image

    path = tmp_path / "in.png"
    Image.new("L", (8, 6), color=200).save(path)
    req = SimpleNamespace(prompt={"prompt": "a", "multi_modal_data": {"image": [str(path)]}})
    out = get_pre_process_func(None)(req)
    image = out.prompt["multi_modal_data"]["image"]
    assert image.mode == "RGB" and image.size == (8, 6) and image.getpixel((0, 0)) == (200, 200, 200)
    text_only = SimpleNamespace(prompt="a")
    assert get_pre_process_func(None)(text_only) is text_only
    with pytest.raises(InputError, match="cannot open"):
        get_pre_process_func(None)(
            SimpleNamespace(prompt={"multi_modal_data": {"image": str(tmp_path / "x")}})
        )
    with pytest.raises(InputError, match="expected one image, got 2"):
        get_pre_process_func(None)(SimpleNamespace(prompt={"multi_modal_data": {"image": ["a", "b"]}}))


def test_post_process_names_the_video():
    post = get_post_process_func(None)
    frames, latents = object(), object()
    assert post(frames, sampling_params=sampling()) == {"video": frames}
    assert post(latents, sampling_params=sampling(output_type="latent")) is latents
