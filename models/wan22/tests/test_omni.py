"""The classes vLLM-Omni's engine instantiates (``trnmodels.wan22.omni``), built as its loader builds them.

vLLM-Omni is not installed here: ``od_config`` is a namespace with ``OmniDiffusionConfig``'s field names,
and requests are mapped with core's ``call_kwargs`` (``forward`` itself wraps the result in vLLM-Omni's
``DiffusionOutput``). ``nox -s integration-omni`` runs the same classes through vLLM-Omni's model runner
and loader with its real types (``omni_engine_check.py``).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from trnmodels.core.errors import ShardingError
from trnmodels.core.omni.engine import call_kwargs
from trnmodels.wan22.omni import Wan22I2VOmniPipeline, Wan22OmniPipeline
from trnmodels.wan22.pipeline_i2v import Wan22ImageToVideoPipeline
from trnmodels.wan22.pipeline_t2v import Wan22Pipeline

from .conftest import BOUNDARY_RATIO, NEGATIVE, PROMPT, VIDEO


def od_config(path, ring_degree: int = 1, **overrides) -> SimpleNamespace:
    parallel = SimpleNamespace(
        pipeline_parallel_size=1, data_parallel_size=1, tensor_parallel_size=1, ulysses_degree=1,
        ring_degree=ring_degree, allgather_degree=1, cfg_parallel_size=1, vae_patch_parallel_size=1,
        use_hsdp=False,
    )  # fmt: skip
    fields = dict(
        model=str(path), dtype=torch.float32, parallel_config=parallel, vae_use_tiling=False,
        flow_shift=None, boundary_ratio=None, model_config={},
    )  # fmt: skip
    return SimpleNamespace(**(fields | overrides))


@pytest.fixture(scope="module")
def omni_t2v(tiny_t2v) -> Wan22OmniPipeline:
    return Wan22OmniPipeline(od_config=od_config(tiny_t2v.path))


def test_engine_classes_wrap_the_pipelines():
    assert Wan22OmniPipeline.pipeline_class is Wan22Pipeline and not Wan22OmniPipeline.support_image_input
    assert Wan22I2VOmniPipeline.pipeline_class is Wan22ImageToVideoPipeline
    assert Wan22I2VOmniPipeline.support_image_input


def test_components_are_submodules_and_all_weights_are_loaded(omni_t2v):
    pipe = omni_t2v.pipe
    assert dict(omni_t2v.named_children()) == {
        "text_encoder": pipe.text_encoder,
        "transformer": pipe.transformer,
        "transformer_2": pipe.transformer_2,
        "vae": pipe.vae,
    }
    names = {name for name, _ in omni_t2v.named_parameters()}
    assert omni_t2v.weights_sources == () and omni_t2v.load_weights(iter(())) == names
    assert any(n.startswith("transformer_2.") for n in names) and any(n.startswith("vae.") for n in names)


def test_a_mapped_request_gives_diffusers_latents(tiny_t2v, omni_t2v):
    params = SimpleNamespace(
        num_inference_steps=4, guidance_scale=5.0, guidance_scale_provided=True, guidance_scale_2=3.0,
        guidance_scale_2_provided=True, num_outputs_per_prompt=1, generator=None, seed=0, output_type="latent",
        latents=None, extra_args={}, **VIDEO,
    )  # fmt: skip
    prompt = {"prompt": PROMPT, "negative_prompt": NEGATIVE}
    kwargs = call_kwargs(prompt, params, accepted=omni_t2v.call_parameters)
    (got,) = omni_t2v.pipe(**kwargs, return_dict=False)
    expected = tiny_t2v.reference(
        prompt=PROMPT, negative_prompt=NEGATIVE, num_inference_steps=4, guidance_scale=5.0,
        guidance_scale_2=3.0, output_type="latent", generator=torch.Generator().manual_seed(0), **VIDEO,
    ).frames  # fmt: skip
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)


def test_stage_options_reach_the_pipeline(tiny_t2v):
    omni = Wan22OmniPipeline(od_config=od_config(tiny_t2v.path, flow_shift=7.0, boundary_ratio=0.5))
    assert omni.pipe.scheduler.config.flow_shift == 7.0
    assert omni.pipe.config.boundary_ratio == 0.5 != BOUNDARY_RATIO


def test_a_mesh_the_processes_do_not_form_is_refused(tiny_t2v):
    with pytest.raises(ShardingError, match=r"cp_degree=2 needs torch\.distributed"):
        Wan22OmniPipeline(od_config=od_config(tiny_t2v.path, ring_degree=2))
