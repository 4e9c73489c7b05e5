"""vLLM-Omni's diffusion engine contract, met by any diffusers-style trnmodels pipeline.

vLLM-Omni's worker builds the class registered for a stage's ``model_class_name`` as
``cls(od_config=od_config)`` (inside its weight loader), feeds ``load_weights`` from the
``weights_sources`` the instance declares, and runs ``forward(batch)`` on a ``DiffusionRequestBatch``,
expecting one ``DiffusionOutput`` per request. Its engine process runs a pre-process function on each
request before scheduling and a post-process function on each output; it looks both up by name in the
module of the registered class (``get_pre_process_func(od_config)`` / ``get_post_process_func(od_config)``,
the names ``trnmodels.core.omni.registration`` registers). A plugin subclasses ``OmniDiffusionPipeline`` with its
pipeline as ``pipeline_class`` and re-exports the two functions from its module.

- Construction: the pipeline's own ``from_pretrained(checkpoint, tp=, cfg_parallel=, cp=, dtype=, ...)``
  with the options read from ``od_config`` (``EngineOptions``), so the weights are read by the plugin's
  strict key-mapped loaders, each rank reading only its own slices. ``weights_sources`` is empty: the
  engine streams nothing, and ``load_weights`` reports every parameter as loaded.
- Mesh: vLLM-Omni's workers have torch.distributed up and build their groups in the order
  ``tp-sp-pp-cfg-dp`` (TP fastest). With ``pp = dp = 1`` and ``sp = ring_degree`` that is our mesh order
  (rank = (cfg * CP + cp) * TP + tp), so ``init_parallel_state(tp, cp_degree=ring_degree,
  cfg_degree=cfg_parallel_size)`` groups the same ranks as vLLM-Omni's own TP, SP and CFG groups.
  Ulysses, all-gather-KV sequence parallelism, pipeline and data parallelism and HSDP are refused.
- Compile: the pipeline's graphs have static shapes per video size and are compiled by its own
  ``compile(...)`` (``nox -s compile-<model>``); ``setup_compile`` opts out of vLLM-Omni's
  ``torch.compile`` of the DiT modules.

vLLM-Omni is imported only inside the functions it calls, so nothing here makes trnmodels depend on it.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import nn

from ..errors import ConfigError, InputError, ShardingError
from ..parallel.state import ParallelLayout, get_parallel_layout, init_parallel_state

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
# The diffusers component names a pipeline may carry; the engine sees them as submodules.
COMPONENTS = ("text_encoder", "transformer", "transformer_2", "vae")
# Request fields this adapter does not map; a request that sets one is refused rather than ignored.
UNMAPPED_SAMPLING_FIELDS = ("boundary_ratio", "sigmas", "timesteps")
UNMAPPED_EXTRA_ARGS = ("flow_shift", "sample_solver")


@dataclass(frozen=True)
class EngineOptions:
    """What a pipeline is built with, read from vLLM-Omni's ``OmniDiffusionConfig``."""

    checkpoint: str
    dtype: torch.dtype = torch.bfloat16
    tp: int = 1
    cp: int = 1
    cfg_parallel: int = 1
    vae_patch_parallel_size: int = 1
    vae_use_tiling: bool = False
    flow_shift: float | None = None
    boundary_ratio: float | None = None
    enable_ring_attention: bool | None = None

    @property
    def layout(self) -> ParallelLayout:
        return ParallelLayout(tp=self.tp, cp=self.cp, cfg=self.cfg_parallel)

    def pipeline_kwargs(self) -> dict[str, Any]:
        """``from_pretrained`` keyword arguments; options left unset keep the pipeline's defaults."""
        kwargs: dict[str, Any] = dict(
            tp=self.tp,
            cfg_parallel=self.cfg_parallel,
            cp=self.cp,
            dtype=self.dtype,
            vae_use_tiling=self.vae_use_tiling,
            vae_patch_parallel_size=self.vae_patch_parallel_size,
        )
        for name in ("flow_shift", "boundary_ratio", "enable_ring_attention"):
            if getattr(self, name) is not None:
                kwargs[name] = getattr(self, name)
        return kwargs


def engine_options(od_config: Any) -> EngineOptions:
    """Read an ``OmniDiffusionConfig``: the checkpoint, dtype, mesh, VAE options and model options.

    ``flow_shift`` and ``boundary_ratio`` are engine arguments; a stage YAML may also give them (and
    ``enable_ring_attention``) under ``model_config``, which the top-level value overrides.
    """
    if not isinstance(od_config.model, str) or not od_config.model:
        raise ConfigError(f"od_config.model: expected a checkpoint directory, got {od_config.model!r}")
    dtype = od_config.dtype
    if isinstance(dtype, str):
        dtype = DTYPES.get(dtype.removeprefix("torch."), dtype)
    if dtype not in DTYPES.values():
        raise ConfigError(f"od_config.dtype: expected one of {sorted(DTYPES)}, got {od_config.dtype!r}")
    par = od_config.parallel_config
    refused = {
        "pipeline_parallel_size": par.pipeline_parallel_size,
        "data_parallel_size": par.data_parallel_size or 1,
        "ulysses_degree": par.ulysses_degree,
        "allgather_degree": getattr(par, "allgather_degree", 1),
    }
    for name, value in refused.items():
        if value != 1:
            raise ShardingError(
                f"parallel_config.{name}={value}: trnmodels pipelines shard with tensor_parallel_size, "
                "ring_degree (context parallelism) and cfg_parallel_size only"
            )
    if par.use_hsdp:
        raise ShardingError("parallel_config.use_hsdp=True: trnmodels pipelines do not support HSDP")
    model_config: Mapping[str, Any] = od_config.model_config or {}

    def option(name: str) -> Any:
        value = getattr(od_config, name, None)
        return model_config.get(name) if value is None else value

    return EngineOptions(
        checkpoint=od_config.model,
        dtype=dtype,
        tp=par.tensor_parallel_size,
        cp=par.ring_degree,
        cfg_parallel=par.cfg_parallel_size,
        vae_patch_parallel_size=par.vae_patch_parallel_size,
        vae_use_tiling=bool(od_config.vae_use_tiling),
        flow_shift=option("flow_shift"),
        boundary_ratio=option("boundary_ratio"),
        enable_ring_attention=model_config.get("enable_ring_attention"),
    )


def join_parallel_state(layout: ParallelLayout) -> None:
    """Build our groups over vLLM-Omni's ranks, once per process (a rebuilt pipeline reuses them)."""
    if get_parallel_layout() != layout:
        init_parallel_state(layout.tp, cp_degree=layout.cp, cfg_degree=layout.cfg)


def call_kwargs(
    prompt: str | Mapping[str, Any], sampling: Any, *, accepted: Collection[str], warmup: bool = False
) -> dict[str, Any]:
    """A request's prompt and ``OmniDiffusionSamplingParams`` as the pipeline's ``__call__`` arguments.

    Only what the request sets is passed; the rest keeps the pipeline's defaults. vLLM-Omni's own
    defaults are not requests: ``num_frames=1`` is its image-model default (taken as "not set", except
    in its start-up warm-up, which asks for one frame), and a guidance scale the caller did not give
    is not passed. The warm-up asks for guidance 0, which a CFG-parallel mesh refuses, so it runs with
    the pipeline's default guidance instead. A field the pipeline does not take is an error.
    """
    if isinstance(prompt, str):
        prompt = {"prompt": prompt}
    kwargs: dict[str, Any] = {
        name: prompt.get(name)
        for name in ("prompt", "negative_prompt", "prompt_embeds", "negative_prompt_embeds")
        if prompt.get(name) is not None
    }
    image = (prompt.get("multi_modal_data") or {}).get("image")
    if image is not None:
        kwargs["image"] = image
    for name in ("height", "width", "num_inference_steps", "max_sequence_length", "latents"):
        if getattr(sampling, name, None) is not None:
            kwargs[name] = getattr(sampling, name)
    if sampling.num_frames is not None and (sampling.num_frames != 1 or warmup):
        kwargs["num_frames"] = sampling.num_frames
    if sampling.guidance_scale_provided and not warmup:
        kwargs["guidance_scale"] = sampling.guidance_scale
    if sampling.guidance_scale_2_provided and not warmup:
        kwargs["guidance_scale_2"] = sampling.guidance_scale_2
    if sampling.num_outputs_per_prompt not in (None, 1):
        kwargs["num_videos_per_prompt"] = sampling.num_outputs_per_prompt
    generator = sampling.generator
    if generator is None and sampling.seed is not None:
        generator = torch.Generator().manual_seed(sampling.seed)
    kwargs["generator"] = generator
    kwargs["output_type"] = sampling.output_type or "np"

    unmapped = [name for name in UNMAPPED_SAMPLING_FIELDS if getattr(sampling, name, None) is not None]
    unmapped += [f"extra_args.{name}" for name in UNMAPPED_EXTRA_ARGS if name in (sampling.extra_args or {})]
    if unmapped:
        raise InputError(
            f"request sets {', '.join(unmapped)}: not a per-request option of trnmodels pipelines "
            "(flow_shift and boundary_ratio are stage options)"
        )
    refused = sorted(set(kwargs) - set(accepted))
    if refused:
        what = "conditions on no image" if refused == ["image"] else f"takes no {', '.join(refused)}"
        raise InputError(f"the request sets {', '.join(refused)}, but this pipeline {what}")
    return kwargs


class OmniDiffusionPipeline(nn.Module):
    """The class vLLM-Omni instantiates for a trnmodels pipeline; subclasses set ``pipeline_class``.

    The pipeline is ``self.pipe``; its components are also this module's submodules, so the engine's
    module discovery, device moves and parameter checks see them.
    """

    pipeline_class: ClassVar[type[Any]]
    # Read by vLLM-Omni to give its start-up warm-up an image; the rule it applies to diffusers pipelines.
    support_image_input: ClassVar[bool] = False
    # One request per forward: the runner batches requests only for classes that set this.
    supports_request_batch: ClassVar[bool] = False
    # The engine reads weights from these sources; there are none (see load_weights).
    weights_sources: tuple[Any, ...] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "pipeline_class" in cls.__dict__:
            cls.support_image_input = "image" in inspect.signature(cls.pipeline_class.__call__).parameters

    def __init__(self, *, od_config: Any, prefix: str = ""):
        super().__init__()
        self.od_config = od_config
        options = engine_options(od_config)
        join_parallel_state(options.layout)
        self.pipe = self.pipeline_class.from_pretrained(options.checkpoint, **options.pipeline_kwargs())
        for name in COMPONENTS:
            component = getattr(self.pipe, name, None)
            if isinstance(component, nn.Module):
                self.add_module(name, component)
        self.call_parameters = frozenset(inspect.signature(self.pipe.__call__).parameters)

    @property
    def device(self) -> torch.device:
        return self.pipe._execution_device

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """The weights were read at construction by the plugin's strict loaders (which fill every
        parameter or raise naming what is missing); the engine's iterator is empty and left unread."""
        del weights
        return {name for name, _ in self.named_parameters()}

    def setup_compile(self) -> None:
        """Replaces vLLM-Omni's ``torch.compile`` of the DiT modules, which would wrap this module's
        references and not the pipeline's: the pipeline compiles its own fixed-shape graphs per video
        size (``pipe.compile(...)``, ``nox -s compile-<model>``), which the engine does not know at load
        time, so nothing is compiled here."""

    def forward(self, batch: Any) -> list[Any]:
        """One ``DiffusionOutput`` per request: the latents for ``output_type="latent"``, else the
        decoded frames (``None`` on ranks that hold no VAE)."""
        from vllm_omni.diffusion.data import DiffusionOutput

        outputs = []
        for request in batch.requests:
            kwargs = call_kwargs(
                request.prompt,
                request.sampling_params,
                accepted=self.call_parameters,
                warmup=request.is_dummy_run(),
            )
            (result,) = self.pipe(**kwargs, return_dict=False)
            outputs.append(DiffusionOutput(output=result))
        return outputs


def get_pre_process_func(od_config: Any) -> Callable[[Any], Any]:
    """vLLM-Omni's per-request hook (engine process, before scheduling): an image given as a file path
    (vLLM-Omni's convention for ``multi_modal_data["image"]``) is opened as RGB."""
    del od_config

    def pre_process(request: Any) -> Any:
        prompt = request.prompt
        data = None if isinstance(prompt, str) else prompt.get("multi_modal_data")
        image = None if not data else data.get("image")
        if isinstance(image, list):
            if len(image) != 1:
                raise InputError(f"multi_modal_data.image: expected one image, got {len(image)}")
            image = image[0]
        if isinstance(image, str):
            from PIL import Image

            try:
                image = Image.open(image).convert("RGB")
            except OSError as e:
                raise InputError(f"multi_modal_data.image: cannot open {image!r}: {e}") from None
        if image is not None:
            data["image"] = image
        return request

    return pre_process


def get_post_process_func(od_config: Any) -> Callable[..., Any]:
    """vLLM-Omni's per-output hook (engine process): the frames become the response's ``video``;
    latents (``output_type="latent"``) are returned as they are."""
    del od_config

    def post_process(output: Any, sampling_params: Any = None) -> Any:
        output_type = getattr(sampling_params, "output_type", None) or "np"
        return output if output_type == "latent" else {"video": output}

    return post_process
