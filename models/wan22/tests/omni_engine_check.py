"""Run by ``nox -s integration-omni``: the Wan2.2 pipelines through vLLM-Omni's own worker-side machinery.

In the environment where vLLM-Omni 0.30 was installed by pip (without torchvision), on tiny Wan2.2
checkpoints saved with diffusers (``conftest.make_checkpoint``), after vLLM-Omni's plugin loader ran our
registration:

- vLLM-Omni's ``DiffusionModelRunner`` builds and loads the registered class through its
  ``DiffusersPipelineLoader`` (``initialize_model(od_config)``, ``load_weights`` and its strict
  loaded-parameter check) and runs requests (``OmniDiffusionRequest``, seeded by the runner) through the
  class's ``forward``; the latents (``output_type="latent"``) equal diffusers' ``WanPipeline`` /
  ``WanImageToVideoPipeline`` on the same seed within 1e-4 in FP32: T2V and I2V on one rank, and T2V
  with ``cfg_parallel_size=2`` on two gloo ranks whose groups vLLM-Omni's ``initialize_model_parallel``
  built (ours must hold the same ranks as its CFG group).
- The engine-process hooks vLLM-Omni resolves by name (``get_diffusion_pre_process_func`` /
  ``get_diffusion_post_process_func``) are ours: the pre-process opens an image path; decoded frames
  post-process into a ``video`` payload that ``format_diffusion_outputs`` turns into a video output.
- The start-up warm-up request (vLLM-Omni's dummy-run id, guidance 0, one frame) runs.

Not exercised (vLLM-Omni's ``DiffusionEngine`` and ``DiffusionWorker`` import torchvision): the engine's
scheduler and executor, worker processes started by vLLM-Omni, ``runner.execute_model``'s peak-memory
sampling (vLLM-Omni's CPU platform has no ``reset_peak_memory_stats``; the same request path runs with
it off), and serving over HTTP.
"""

from __future__ import annotations

import os
import socket
import sys
import tempfile
import time
from pathlib import Path

import torch

from conftest import NEGATIVE, PROMPT, VIDEO, make_checkpoint, make_image

FP32_TOL = dict(rtol=1e-4, atol=1e-4)
STEPS = 4
GUIDANCE = dict(guidance_scale=5.0, guidance_scale_2=3.0)


def omni_config(checkpoint: Path, arch: str, **parallel: int):
    from vllm_omni.diffusion.data import DiffusionParallelConfig, OmniDiffusionConfig

    return OmniDiffusionConfig.from_kwargs(
        model=str(checkpoint),
        model_class_name=arch,
        dtype=torch.float32,
        enforce_eager=True,
        parallel_config=DiffusionParallelConfig(**parallel),
    )


def load_runner(od_config):
    from vllm.config import VllmConfig
    from vllm_omni.diffusion.worker.diffusion_model_runner import DiffusionModelRunner

    runner = DiffusionModelRunner(VllmConfig(), od_config, torch.device("cpu"))
    runner.load_model()
    return runner


def request(prompt, request_id: str = "req-0", **sampling):
    from vllm_omni.diffusion.request import OmniDiffusionRequest
    from vllm_omni.inputs.data import OmniDiffusionSamplingParams

    return OmniDiffusionRequest(
        prompt=prompt, sampling_params=OmniDiffusionSamplingParams(**sampling), request_id=request_id
    )


def run(runner, req):
    """The runner's request path (``execute_model`` minus its peak-memory sampling): forward context,
    generator from the seed, the pipeline's ``forward``, output checks."""
    result = runner._execute_request_list(
        [req],
        od_config=runner.od_config,
        allow_single_output=True,
        require_request_batch_support=False,
        record_name="pipeline_forward",
        record_output_peak_memory=False,
    )
    return result.runner_outputs[0].result


def reference_latents(checkpoint, **kwargs) -> torch.Tensor:
    generator = torch.Generator().manual_seed(0)
    return checkpoint.reference(generator=generator, output_type="latent", **kwargs).frames


def check(name: str, got: torch.Tensor, expected: torch.Tensor) -> None:
    torch.testing.assert_close(got, expected, **FP32_TOL)
    print(f"ok   {name:<44} max |diff| {(got - expected).abs().max().item():.2e}")


def check_t2v(t2v) -> None:
    from vllm_omni.diffusion.data import DiffusionOutput
    from vllm_omni.diffusion.output_formatter import (
        format_diffusion_outputs,
        normalize_diffusion_postprocess_output,
    )
    from vllm_omni.diffusion.registry import get_diffusion_post_process_func, get_diffusion_pre_process_func
    from vllm_omni.diffusion.request import DUMMY_DIFFUSION_REQUEST_ID

    from trnmodels.wan22.omni import Wan22OmniPipeline

    od_config = omni_config(t2v.path, "WanPipeline")
    runner = load_runner(od_config)
    assert type(runner.pipeline) is Wan22OmniPipeline, type(runner.pipeline)
    prompt = {"prompt": PROMPT, "negative_prompt": NEGATIVE}
    req = request(prompt, num_inference_steps=STEPS, output_type="latent", seed=0, **GUIDANCE, **VIDEO)
    pre_process = get_diffusion_pre_process_func(od_config)
    out = run(runner, pre_process(req))
    expected = reference_latents(t2v, prompt=PROMPT, negative_prompt=NEGATIVE, num_inference_steps=STEPS,
                                 **GUIDANCE, **VIDEO)  # fmt: skip
    check("T2V latents (runner, loader, forward)", out.output, expected)

    post_process = get_diffusion_post_process_func(od_config)
    req = request(prompt, num_inference_steps=1, seed=0, **GUIDANCE, **VIDEO)
    out = run(runner, req)
    normalized = normalize_diffusion_postprocess_output(
        post_process(out.output, sampling_params=req.sampling_params)
    )
    assert normalized.primary_key == "video", normalized.primary_key
    frames = normalized.outputs["video"]
    assert frames.shape == (1, VIDEO["num_frames"], VIDEO["height"], VIDEO["width"], 3), frames.shape
    (formatted,) = format_diffusion_outputs(
        request=req,
        od_config=od_config,
        diffusion_output=DiffusionOutput(output=out.output),
        output_data=out.output,
        postprocess_output=normalized,
    )
    print(f"ok   T2V frames -> {type(formatted).__name__} ({formatted.final_output_type})")

    warmup = request({"prompt": "dummy run"}, DUMMY_DIFFUSION_REQUEST_ID, height=32, width=32,
                     num_inference_steps=2, num_frames=1, guidance_scale=0.0)  # fmt: skip
    out = run(runner, warmup)
    assert out.output is not None and out.output.shape[1] == 1, out
    print("ok   warm-up request (dummy-run id, guidance 0, one frame)")


def check_i2v(i2v, workdir: Path) -> None:
    from vllm_omni.diffusion.registry import get_diffusion_pre_process_func

    from trnmodels.wan22.omni import Wan22I2VOmniPipeline

    od_config = omni_config(i2v.path, "WanImageToVideoPipeline")
    runner = load_runner(od_config)
    assert type(runner.pipeline) is Wan22I2VOmniPipeline and Wan22I2VOmniPipeline.support_image_input
    image = make_image()
    path = workdir / "image.png"
    image.save(path)
    prompt = {"prompt": PROMPT, "negative_prompt": NEGATIVE, "multi_modal_data": {"image": str(path)}}
    req = request(prompt, num_inference_steps=STEPS, output_type="latent", seed=0, **GUIDANCE, **VIDEO)
    out = run(runner, get_diffusion_pre_process_func(od_config)(req))
    expected = reference_latents(i2v, image=image, prompt=PROMPT, negative_prompt=NEGATIVE,
                                 num_inference_steps=STEPS, **GUIDANCE, **VIDEO)  # fmt: skip
    check("I2V latents (image path via pre-process)", out.output, expected)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_worker(rank: int, world: int, port: int, od_config) -> None:
    """vLLM-Omni's distributed set-up, as its worker does it, on gloo."""
    from vllm_omni.diffusion.distributed import parallel_state as omni_state

    init_method = f"tcp://127.0.0.1:{port}"
    # Started here: vLLM-Omni would also pick a device (rank % device count), which its CPU platform lacks.
    torch.distributed.init_process_group("gloo", init_method=init_method, world_size=world, rank=rank)
    omni_state.init_distributed_environment(
        world_size=world, rank=rank, distributed_init_method=init_method, backend="gloo"
    )
    par = od_config.parallel_config
    omni_state.initialize_model_parallel(
        data_parallel_size=par.data_parallel_size,
        cfg_parallel_size=par.cfg_parallel_size,
        sequence_parallel_size=par.sequence_parallel_size,
        ring_degree=par.ring_degree,
        tensor_parallel_size=par.tensor_parallel_size,
        backend="gloo",
    )


def cfg_rank(rank: int, world: int, port: int, checkpoint: str, expected: torch.Tensor) -> None:
    """One of two workers: our CFG group must hold the ranks of vLLM-Omni's."""
    from vllm_omni.diffusion.distributed import parallel_state as omni_state
    from vllm_omni.plugins import load_omni_general_plugins

    from trnmodels.core.parallel import get_cfg_group

    load_omni_general_plugins()  # as in every process vLLM-Omni starts
    od_config = omni_config(Path(checkpoint), "Wan22Pipeline", cfg_parallel_size=world)
    init_worker(rank, world, port, od_config)
    runner = load_runner(od_config)
    ours = torch.distributed.get_process_group_ranks(get_cfg_group().group)
    assert ours == list(omni_state.get_cfg_group().ranks), (ours, omni_state.get_cfg_group().ranks)
    prompt = {"prompt": PROMPT, "negative_prompt": NEGATIVE}
    req = request(prompt, num_inference_steps=STEPS, output_type="latent", seed=0, **GUIDANCE, **VIDEO)
    got = run(runner, req).output
    torch.testing.assert_close(got, expected, **FP32_TOL)
    if rank == 0:
        print(
            f"ok   T2V latents at cfg_parallel_size=2 (gloo)       max |diff| {(got - expected).abs().max():.2e}"
        )


def check_cfg_parallel(t2v) -> None:
    expected = reference_latents(t2v, prompt=PROMPT, negative_prompt=NEGATIVE, num_inference_steps=STEPS,
                                 **GUIDANCE, **VIDEO)  # fmt: skip
    torch.multiprocessing.spawn(cfg_rank, args=(2, free_port(), str(t2v.path), expected), nprocs=2, join=True)


def main() -> int:
    from vllm_omni.plugins import load_omni_general_plugins

    start = time.perf_counter()
    load_omni_general_plugins()
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        t2v = make_checkpoint(workdir / "t2v", "t2v")
        i2v = make_checkpoint(workdir / "i2v", "i2v", seed=10)
        # The two-rank check runs in processes of its own, before this one joins a (one-rank) world.
        check_cfg_parallel(t2v)
        init_worker(0, 1, free_port(), omni_config(t2v.path, "WanPipeline"))
        check_t2v(t2v)
        check_i2v(i2v, workdir)
    print(f"vLLM-Omni engine contract: all checks passed in {time.perf_counter() - start:.0f} s")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
