"""What the Wan2.2 text- and image-to-video pipelines share: the base class and the checks it makes.

``Wan22PipelineBase`` is placed ahead of diffusers' pipeline in the MRO (``class P(Wan22PipelineBase,
WanPipeline)``), like ``CFGParallelMixin`` which it extends, so its methods replace diffusers' where both
have one. It holds every piece of our work both pipelines run: construction from a checkpoint directory
(each rank loading its own slices), the request checks a launcher makes before starting ranks, the
per-component compile, the input checks, the CFG-parallel denoising loop with the expert switch, and the
decode. A subclass adds its ``__call__``.

The denoising loop, reading top to bottom: at each timestep ``t`` the high-noise expert ``transformer``
runs while ``t >= boundary_ratio * num_train_timesteps`` with ``guidance_scale``, then the low-noise
expert ``transformer_2`` with ``guidance_scale_2``; the guided flow prediction steps the scheduler.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import torch
from diffusers import UniPCMultistepScheduler
from diffusers.pipelines.wan.pipeline_output import WanPipelineOutput
from diffusers.video_processor import VideoProcessor
from transformers import AutoTokenizer

from trnmodels.core.compile.diffusion import ComponentGraph, ComponentResult
from trnmodels.core.diffusion import CFGParallelMixin
from trnmodels.core.diffusion.memory import ComponentMemory
from trnmodels.core.diffusion.vae_patch_parallel import init_vae_patch_group, is_vae_rank
from trnmodels.core.errors import ConfigError, InputError, ShardingError
from trnmodels.core.finite import check_finite_input, check_finite_output
from trnmodels.core.hf_config import read_json_object
from trnmodels.core.parallel import ParallelLayout, check_divisible, get_parallel_layout, get_world_group

from .text_encoder import UMT5Config, UMT5Encoder
from .transformer import WanDiT, WanDiTConfig, compile_dit, dit_component_graph
from .vae import Wan22VAE


def check_layout(tp: int, cfg_parallel: int, cp: int) -> None:
    """The pipeline runs in the mesh the launcher built; refuse a request that does not match it."""
    wanted = ParallelLayout(tp=tp, cp=cp, cfg=cfg_parallel)
    have = get_parallel_layout()
    if (have.tp, have.cp, have.cfg, have.ep) != (wanted.tp, wanted.cp, wanted.cfg, 1):
        raise ShardingError(
            f"the pipeline asks for {wanted.describe()}, but the running mesh is {have.describe()}; "
            "launch one rank per mesh position with init_parallel_state(tp, cp_degree=, cfg_degree=)"
        )


def read_model_index(checkpoint_dir: Path) -> dict[str, Any]:
    index = checkpoint_dir / "model_index.json"
    if not index.is_file():
        raise ConfigError(f"{checkpoint_dir}: no model_index.json (expected a diffusers Wan2.2 checkpoint)")
    raw = read_json_object(index)
    if raw.get("expand_timesteps"):
        raise ConfigError(
            f"{index}: expand_timesteps=true is the Wan2.2 TI2V-5B layout; only the A14B pipelines are supported"
        )
    return raw


def has_component(index: dict[str, Any], checkpoint_dir: Path, name: str) -> bool:
    entry = index.get(name)
    return bool(entry) and entry[0] is not None and (checkpoint_dir / name).is_dir()


def check_components(checkpoint_dir: Path, index: dict[str, Any], boundary_ratio: float | None) -> None:
    for name in ("tokenizer", "text_encoder", "vae", "scheduler", "transformer"):
        if not has_component(index, checkpoint_dir, name):
            raise ConfigError(f"{checkpoint_dir}: the checkpoint has no {name} (model_index.json or folder)")
    if boundary_ratio is not None and not has_component(index, checkpoint_dir, "transformer_2"):
        raise ConfigError(
            f"{checkpoint_dir / 'model_index.json'}: boundary_ratio={boundary_ratio} needs the low-noise "
            "expert, but the checkpoint has no transformer_2"
        )


def read_vae_config(checkpoint_dir: Path) -> dict[str, Any]:
    path = checkpoint_dir / "vae" / "config.json"
    if not path.is_file():
        raise ConfigError(f"{checkpoint_dir / 'vae'}: no config.json (expected a diffusers VAE folder)")
    return read_json_object(path)


def vae_scale_factors(config: dict[str, Any]) -> tuple[int, int]:
    """``(spatial, temporal)`` compression of the VAE (Wan's 8 and 4 when the config does not say)."""
    return config.get("scale_factor_spatial", 8), config.get("scale_factor_temporal", 4)


def video_latent_shape(
    num_frames: int,
    height: int,
    width: int,
    *,
    patch_size: tuple[int, int, int],
    vae_config: dict[str, Any],
) -> tuple[int, int, int, int]:
    """Refuse a video size the VAE and the DiT cannot take (diffusers would round it silently);
    returns the latent shape ``(channels, frames, height, width)`` of the noise."""
    spatial, temporal = vae_scale_factors(vae_config)
    for name, size, p in (("height", height, patch_size[1]), ("width", width, patch_size[2])):
        if size <= 0 or size % (spatial * p):
            raise InputError(
                f"{name}={size} is not divisible by {spatial * p} "
                f"(the VAE's spatial factor {spatial} x the DiT's patch size {p})"
            )
    if num_frames < 1 or (num_frames - 1) % temporal:
        raise InputError(
            f"num_frames={num_frames} is not of the form {temporal}k+1 (the VAE compresses {temporal} frames "
            f"into one after the first); try {max(1, (num_frames - 1) // temporal * temporal + 1)}"
        )
    return (vae_config["z_dim"], (num_frames - 1) // temporal + 1, height // spatial, width // spatial)


class _RequestedCFG(CFGParallelMixin):
    """The CFG-group check of a pipeline not built yet: the requested group size, not the live group's."""

    def __init__(self, size: int):
        self.size = size

    @property
    def cfg_parallel_size(self) -> int:  # type: ignore[override]
        return self.size


def check_request(
    checkpoint_dir: str | Path,
    *,
    tp: int = 1,
    cfg_parallel: int = 1,
    cp: int = 1,
    num_frames: int | None = None,
    height: int | None = None,
    width: int | None = None,
    guidance_scale: float | None = None,
    guidance_scale_2: float | None = None,
    **_: Any,
) -> None:
    """What ``from_pretrained`` and ``__call__`` would refuse for this mesh and video, found from the
    checkpoint's config files alone (no weights read, no model built, no process group), so a launcher
    refuses the request before it starts any rank: the components, the CFG group, every dimension TP
    splits (the DiT experts' heads and FFN, the text encoder's heads and FFN), the video size and the CP
    split of its tokens. Options the pipeline does not take are ignored."""
    checkpoint_dir = Path(checkpoint_dir)
    index = read_model_index(checkpoint_dir)
    boundary_ratio = index.get("boundary_ratio")
    check_components(checkpoint_dir, index, boundary_ratio)
    if guidance_scale_2 is not None and boundary_ratio is None:
        raise InputError(
            f"guidance_scale_2={guidance_scale_2} applies to the low-noise expert, but "
            f"{checkpoint_dir / 'model_index.json'} has no boundary_ratio (one expert); drop it"
        )
    # diffusers' switch: guidance runs when guidance_scale > 1.
    _RequestedCFG(cfg_parallel).check_cfg_parallel(guidance_scale is None or guidance_scale > 1.0)
    experts = read_expert_configs(checkpoint_dir, index)
    encoder = UMT5Config.from_pretrained(checkpoint_dir / "text_encoder")
    check_tp_splits(checkpoint_dir, experts, encoder, tp)
    if num_frames is None or height is None or width is None:
        return
    check_cp_split(experts["transformer"], read_vae_config(checkpoint_dir), cp, num_frames, height, width)


def read_expert_configs(checkpoint_dir: Path, index: dict[str, Any]) -> dict[str, WanDiTConfig]:
    """The DiT experts the checkpoint has, by component name (``transformer``, and ``transformer_2``)."""
    return {
        name: WanDiTConfig.from_pretrained(checkpoint_dir / name)
        for name in ("transformer", "transformer_2")
        if has_component(index, checkpoint_dir, name)
    }


def check_tp_splits(
    checkpoint_dir: Path, experts: dict[str, WanDiTConfig], encoder: UMT5Config, tp: int
) -> None:
    """Every dimension TP splits: the DiT experts' heads and FFN, the text encoder's heads and FFN."""
    splits = [
        (name, field, getattr(cfg, field))
        for name, cfg in experts.items()
        for field in ("num_attention_heads", "ffn_dim")
    ]
    splits += [("text_encoder", field, getattr(encoder, field)) for field in ("num_heads", "d_ff")]
    for name, field, size in splits:
        try:
            check_divisible(field, size, tp)
        except ShardingError as e:
            raise ShardingError(f"{checkpoint_dir / name / 'config.json'}: {e}") from None


def check_cp_split(
    dit: WanDiTConfig, vae_config: dict[str, Any], cp: int, num_frames: int, height: int, width: int
) -> int:
    """Refuse a video size the VAE and the DiT cannot take, or whose latent tokens CP cannot split
    evenly; returns the video's latent token count."""
    latent = video_latent_shape(num_frames, height, width, patch_size=dit.patch_size, vae_config=vae_config)
    tokens = math.prod(size // p for size, p in zip(latent[1:], dit.patch_size, strict=True))
    if tokens % cp:
        raise InputError(
            f"context parallelism: the video's {tokens} latent tokens are not divisible by "
            f"cp_degree={cp}; pick a size whose token count the CP degree divides"
        )
    return tokens


class Wan22PipelineBase(CFGParallelMixin):
    """The pipeline methods shared by ``Wan22Pipeline`` and ``Wan22ImageToVideoPipeline``."""

    # Read by ``trnmodels video`` (``trnmodels.core.omni.registry.frame_rate``): Wan2.x generates video at
    # 16 frames per second, the rate its training clips were sampled at.
    fps: ClassVar[int] = 16
    # Image-to-video compiles the VAE encoder too; a launcher requires --image for it.
    conditions_on_image: ClassVar[bool]

    # --- construction ----------------------------------------------------------------------------

    def __init__(
        self,
        tokenizer: Any,
        text_encoder: UMT5Encoder,
        vae: Wan22VAE | None,
        scheduler: UniPCMultistepScheduler,
        transformer: WanDiT,
        transformer_2: WanDiT | None = None,
        boundary_ratio: float | None = None,
        expand_timesteps: bool = False,
        *,
        image_processor: None = None,
        image_encoder: None = None,
    ):
        """Both pipelines take the same components; diffusers' ``__init__`` (next in the MRO) registers
        them. ``image_processor``/``image_encoder`` are in the signature because diffusers' image-to-video
        pipeline registers them (``components`` reads the signature); anything but None is refused."""
        if expand_timesteps:
            raise ConfigError(
                "expand_timesteps=True is the Wan2.2 TI2V-5B layout; only the A14B pipelines are supported"
            )
        if boundary_ratio is not None and transformer_2 is None:
            raise ConfigError(
                f"boundary_ratio={boundary_ratio} switches to the low-noise expert, but there is no transformer_2"
            )
        if image_encoder is not None or image_processor is not None:
            raise ConfigError(
                "image_encoder/image_processor are set (Wan2.1-style CLIP image conditioning); Wan2.2 A14B "
                "conditions on the image through the VAE latents only, and only that is supported"
            )
        super().__init__(
            tokenizer=tokenizer,
            text_encoder=text_encoder,
            vae=vae,
            scheduler=scheduler,
            transformer=transformer,
            transformer_2=transformer_2,
            boundary_ratio=boundary_ratio,
        )
        self.set_progress_bar_config(disable=True)
        if vae is not None:
            self.use_vae_config(dict(vae.config))

    @classmethod
    def from_pretrained(  # type: ignore[override]
        cls,
        checkpoint_dir: str | Path,
        *,
        tp: int = 1,
        cfg_parallel: int = 1,
        cp: int = 1,
        dtype: torch.dtype = torch.bfloat16,
        vae_dtype: torch.dtype = torch.float32,
        flow_shift: float | None = None,
        enable_ring_attention: bool | None = None,
        vae_use_tiling: bool = False,
        vae_patch_parallel_size: int = 1,
        boundary_ratio: float | None = None,
    ):
        """Build every component from a diffusers checkpoint directory and load this rank's weights.

        The process groups must already exist (``init_parallel_state`` on every rank); ``tp``, ``cp`` and
        ``cfg_parallel`` state the mesh this pipeline expects, and a mismatch is an error. Only the VAE
        rank(s) (rank 0, or the first ``vae_patch_parallel_size`` ranks) build the VAE; the others return
        ``frames=None`` unless ``output_type="latent"``. ``boundary_ratio`` overrides ``model_index.json``'s
        (a stage option of vLLM-Omni).
        """
        checkpoint_dir = Path(checkpoint_dir)
        check_layout(tp, cfg_parallel, cp)
        index = read_model_index(checkpoint_dir)
        if boundary_ratio is None:
            boundary_ratio = index.get("boundary_ratio")
        check_components(checkpoint_dir, index, boundary_ratio)
        overrides = {} if enable_ring_attention is None else {"enable_ring_attention": enable_ring_attention}
        experts = [
            WanDiT.from_pretrained(checkpoint_dir / name, dtype=dtype, **overrides)
            if has_component(index, checkpoint_dir, name)
            else None
            for name in ("transformer", "transformer_2")
        ]
        scheduler_kwargs = {} if flow_shift is None else {"flow_shift": flow_shift}
        # The VAE is not TP-sharded: only the VAE rank(s) build it (every rank joins the group call).
        init_vae_patch_group(vae_patch_parallel_size)
        vae = None
        if is_vae_rank(get_world_group().rank, vae_patch_parallel_size):
            vae = Wan22VAE.from_pretrained(checkpoint_dir / "vae", torch_dtype=vae_dtype).eval()
            if vae_use_tiling:
                vae.enable_tiling()
            if vae_patch_parallel_size > 1:
                vae.enable_patch_parallel(vae_patch_parallel_size)
        pipe = cls(
            tokenizer=AutoTokenizer.from_pretrained(checkpoint_dir / "tokenizer"),
            text_encoder=UMT5Encoder.from_pretrained(checkpoint_dir / "text_encoder", dtype=dtype),
            vae=vae,
            scheduler=UniPCMultistepScheduler.from_pretrained(
                checkpoint_dir / "scheduler", **scheduler_kwargs
            ),
            transformer=experts[0],
            transformer_2=experts[1],
            boundary_ratio=boundary_ratio,
        )
        pipe.use_vae_config(read_vae_config(checkpoint_dir))
        return pipe

    @classmethod
    def check_request(cls, checkpoint_dir: str | Path, **request: Any) -> None:
        """The launcher's hook (``trnmodels.core.omni.registry.check_request``): see ``check_request``."""
        check_request(checkpoint_dir, **request)

    @classmethod
    def validation_stages(cls, checkpoint_dir: str | Path, request: Any, **options: Any) -> list[Any]:
        """``trnmodels validate``'s hook (``trnmodels.core.accuracy.pipeline_validate``): the stages of one
        generation, teacher-forced against diffusers; see ``validation.validation_stages``."""
        from .validation import validation_stages

        return validation_stages(
            checkpoint_dir, request, conditions_on_image=cls.conditions_on_image, **options
        )

    # The seeds' release mesh for Wan2.2 A14B (vLLM-Omni Neuron's stage YAML): TP 4 x CP 8 x CFG 2, 64 cores.
    release_mesh: ClassVar[tuple[int, int, int]] = (4, 8, 2)

    @classmethod
    def plan_memory(cls, checkpoint_dir: str | Path, **request: Any) -> list[ComponentMemory]:
        """``trnmodels plan``'s hook (``trnmodels.core.onboarding.plan_diffusion``): one rank's components
        for a mesh and video, from the config files alone; see ``memory.plan_memory``."""
        from .memory import plan_memory

        return plan_memory(checkpoint_dir, conditions_on_image=cls.conditions_on_image, **request)

    def use_vae_config(self, config: dict[str, Any]) -> None:
        """The VAE's shape facts, known on every rank (ranks without the VAE still shape the latents)."""
        self.vae_config = dict(config)
        self.vae_scale_factor_spatial, self.vae_scale_factor_temporal = vae_scale_factors(config)
        self.video_processor = VideoProcessor(vae_scale_factor=self.vae_scale_factor_spatial)

    def load_weights(self, checkpoint_dir: str | Path) -> None:
        """Reload every TP-sharded component's weights from ``checkpoint_dir``; the pipeline owns none."""
        checkpoint_dir = Path(checkpoint_dir)
        self.text_encoder.load_weights(checkpoint_dir / "text_encoder")
        for name in ("transformer", "transformer_2"):
            model = getattr(self, name)
            if model is not None:
                model.load_weights(checkpoint_dir / name)

    # --- compile ------------------------------------------------------------------------------------

    def component_graphs(
        self, *, num_frames: int, height: int, width: int, batch_size: int = 1, max_sequence_length: int = 512
    ) -> list[ComponentGraph]:
        """Every graph a ``num_frames x height x width`` generation runs, each under its own model name:
        the text encoder, each DiT expert, and the VAE decoder (plus its encoder for image-to-video)."""
        _, *latent_shape = self.check_video_shape(num_frames, height, width)
        graphs = [self.text_encoder.component_graph(batch_size=batch_size, seq_len=max_sequence_length)]
        for name in ("transformer", "transformer_2"):
            expert = getattr(self, name)
            if expert is not None:
                graphs.append(
                    dit_component_graph(
                        expert.config,
                        model_name=f"wan22_{name}",
                        batch_size=batch_size,
                        latent_shape=tuple(latent_shape),
                        text_len=max_sequence_length,
                        dtype=expert.dtype,
                    )
                )
        if self.vae is None:  # only the VAE rank(s) compile it
            return graphs
        graphs += self.vae.component_graphs(
            num_frames=num_frames,
            height=height,
            width=width,
            batch_size=batch_size,
            compile_encoder=self.conditions_on_image,
        )
        return graphs

    def compile(
        self,
        *,
        num_frames: int,
        height: int,
        width: int,
        batch_size: int = 1,
        max_sequence_length: int = 512,
        cache_dir: str | Path | None = None,
        on_result: Callable[[ComponentResult], None] | None = None,
    ) -> list[ComponentResult]:
        """Compile (or find in the cache) and load every component's graphs for one video size."""
        _, *latent_shape = self.check_video_shape(num_frames, height, width)
        results = self.text_encoder.compile(
            batch_size=batch_size, seq_len=max_sequence_length, cache_dir=cache_dir, on_result=on_result
        )
        for name in ("transformer", "transformer_2"):
            expert = getattr(self, name)
            if expert is not None:
                results += compile_dit(
                    expert,
                    model_name=f"wan22_{name}",
                    batch_size=batch_size,
                    latent_shape=tuple(latent_shape),
                    text_len=max_sequence_length,
                    cache_dir=cache_dir,
                    on_result=on_result,
                )
        if self.vae is None:  # only the VAE rank(s) compile it
            return results
        results += self.vae.compile(
            num_frames=num_frames,
            height=height,
            width=width,
            batch_size=batch_size,
            compile_encoder=self.conditions_on_image,
            cache_dir=cache_dir,
            on_result=on_result,
        )
        return results

    # --- input checks ---------------------------------------------------------------------------------

    def check_video_shape(self, num_frames: int, height: int, width: int) -> tuple[int, int, int, int]:
        """Refuse a video size the VAE and the DiT cannot take; the latent shape of the noise."""
        return video_latent_shape(
            num_frames,
            height,
            width,
            patch_size=self.transformer.config.patch_size,
            vae_config=self.vae_config,
        )

    def check_sequence(self, latent_shape: tuple[int, ...], batch_size: int) -> None:
        in_channels = self.transformer.config.in_channels
        self.transformer.check_input_shape((batch_size, in_channels, *latent_shape[1:]))

    def setup_guidance(self, guidance_scale: float, guidance_scale_2: float | None) -> float | None:
        """diffusers' defaults (the low-noise expert reuses ``guidance_scale``), then the CFG-group check."""
        if self.config.boundary_ratio is not None and guidance_scale_2 is None:
            guidance_scale_2 = guidance_scale
        self._guidance_scale = guidance_scale
        self._guidance_scale_2 = guidance_scale_2
        self._attention_kwargs = None
        self._current_timestep = None
        self._interrupt = False
        self.check_cfg_parallel(self.do_classifier_free_guidance)
        return guidance_scale_2

    # --- the loop ---------------------------------------------------------------------------------------

    def denoise(
        self,
        latents: torch.Tensor,
        prompt_embeds: torch.Tensor,
        negative_prompt_embeds: torch.Tensor | None,
        guidance_scale: float,
        guidance_scale_2: float | None,
        condition: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Run every scheduler step; ``condition`` (I2V: mask and image latents) is concatenated to the
        noisy latents along channels before each DiT call."""
        timesteps = self.scheduler.timesteps
        self._num_timesteps = len(timesteps)
        self.scheduler.set_begin_index(0)
        boundary = None
        if self.config.boundary_ratio is not None:
            boundary = self.config.boundary_ratio * self.scheduler.config.num_train_timesteps
        uncond = negative_prompt_embeds if self.do_classifier_free_guidance else None
        check_finite_input(latents, "Wan2.2 denoise: latents")
        for step, t in enumerate(self.progress_bar(timesteps)):
            self._current_timestep = t
            if boundary is None or t >= boundary:
                name, model, scale = "transformer", self.transformer, guidance_scale
            else:
                name, model, scale = "transformer_2", self.transformer_2, guidance_scale_2
            x = latents if condition is None else torch.cat([latents, condition], dim=1)
            x = x.to(model.dtype)
            timestep = t.expand(latents.shape[0])

            def predict(embeds: torch.Tensor, model: WanDiT = model, x: torch.Tensor = x, t=timestep):
                return model(x, t, embeds)

            noise = self.predict_noise_with_cfg(predict, prompt_embeds, uncond, scale)
            # Checked every step: a NaN would otherwise flow through the scheduler and the VAE into a
            # video of garbage, and the step and expert that made it would be lost.
            stage = (
                f"Wan2.2 denoise step {step + 1} of {len(timesteps)} (timestep {int(t)}): {name}'s prediction"
            )
            check_finite_output(noise, stage, model)
            latents = self.scheduler.step(noise, t, latents, return_dict=False)[0]
        self._current_timestep = None
        return latents

    def decode_latents(self, latents: torch.Tensor, output_type: str) -> Any:
        """Un-normalise with the VAE's latent statistics, decode, post-process (as diffusers does)."""
        vae = self.vae
        latents = latents.to(dtype=vae.dtype)
        mean = torch.tensor(vae.config.latents_mean).view(1, vae.config.z_dim, 1, 1, 1).to(latents)
        inv_std = 1.0 / torch.tensor(vae.config.latents_std).view(1, vae.config.z_dim, 1, 1, 1).to(latents)
        video = vae.decode(latents / inv_std + mean, return_dict=False)[0]
        return self.video_processor.postprocess_video(video, output_type=output_type)

    def encode_prompts(
        self,
        prompt: str | list[str] | None,
        negative_prompt: str | list[str] | None,
        prompt_embeds: torch.Tensor | None,
        negative_prompt_embeds: torch.Tensor | None,
        num_videos_per_prompt: int,
        max_sequence_length: int,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        given = {"prompt_embeds": prompt_embeds, "negative_prompt_embeds": negative_prompt_embeds}
        for name, embeds in given.items():
            if embeds is not None:
                check_finite_input(embeds, f"Wan2.2 pipeline: {name}")
        prompt_embeds, negative_prompt_embeds = self.encode_prompt(
            prompt=prompt,
            negative_prompt=negative_prompt,
            do_classifier_free_guidance=self.do_classifier_free_guidance,
            num_videos_per_prompt=num_videos_per_prompt,
            prompt_embeds=prompt_embeds,
            negative_prompt_embeds=negative_prompt_embeds,
            max_sequence_length=max_sequence_length,
            device=self._execution_device,
        )
        encoded = {"prompt_embeds": prompt_embeds, "negative_prompt_embeds": negative_prompt_embeds}
        for name, embeds in encoded.items():
            if embeds is not None and given[name] is None:
                check_finite_output(embeds, f"Wan2.2 text encoder: {name}", self.text_encoder)
        dtype = self.transformer.dtype
        prompt_embeds = prompt_embeds.to(dtype)
        if negative_prompt_embeds is not None:
            negative_prompt_embeds = negative_prompt_embeds.to(dtype)
        return prompt_embeds, negative_prompt_embeds

    @staticmethod
    def batch_size_of(prompt: str | list[str] | None, prompt_embeds: torch.Tensor | None) -> int:
        if isinstance(prompt, str):
            return 1
        if isinstance(prompt, list):
            return len(prompt)
        return prompt_embeds.shape[0]

    @staticmethod
    def output(video: Any, return_dict: bool) -> Any:
        return WanPipelineOutput(frames=video) if return_dict else (video,)
