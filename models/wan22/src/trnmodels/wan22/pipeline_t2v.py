"""Wan2.2 text-to-video (A14B): diffusers' ``WanPipeline`` with our components and CFG parallelism.

The math stays diffusers': prompt encoding, latent preparation (noise drawn in float32, so a seed gives
diffusers' trajectory), the UniPC flow scheduler and the expert switch. Ours are the components (the
TP/CP DiT experts, the TP UMT5 encoder, the tiling/patch-parallel VAE), the construction from a
checkpoint directory, clear errors for bad input, and the guided prediction, which goes through
``CFGParallelMixin`` (one branch per CFG rank, or both in turn on one rank); all of it is in
``Wan22PipelineBase`` (``pipeline.py``), shared with image-to-video.
"""

from __future__ import annotations

from typing import Any

import torch
from diffusers import WanPipeline

from .pipeline import Wan22PipelineBase


class Wan22Pipeline(Wan22PipelineBase, WanPipeline):
    """``Wan22Pipeline.from_pretrained(dir, tp=, cfg_parallel=, cp=, dtype=)(prompt=..., ...)``."""

    conditions_on_image = False

    @torch.no_grad()
    def __call__(  # type: ignore[override]
        self,
        prompt: str | list[str] | None = None,
        negative_prompt: str | list[str] | None = None,
        height: int = 480,
        width: int = 832,
        num_frames: int = 81,
        num_inference_steps: int = 50,
        guidance_scale: float = 5.0,
        guidance_scale_2: float | None = None,
        num_videos_per_prompt: int = 1,
        generator: torch.Generator | list[torch.Generator] | None = None,
        latents: torch.Tensor | None = None,
        prompt_embeds: torch.Tensor | None = None,
        negative_prompt_embeds: torch.Tensor | None = None,
        output_type: str = "np",
        return_dict: bool = True,
        max_sequence_length: int = 512,
    ) -> Any:
        latent_shape = self.check_video_shape(num_frames, height, width)
        self.check_inputs(
            prompt,
            negative_prompt,
            height,
            width,
            prompt_embeds,
            negative_prompt_embeds,
            None,
            guidance_scale_2,
        )
        batch_size = self.batch_size_of(prompt, prompt_embeds) * num_videos_per_prompt
        self.check_sequence(latent_shape, batch_size)
        guidance_scale_2 = self.setup_guidance(guidance_scale, guidance_scale_2)

        prompt_embeds, negative_prompt_embeds = self.encode_prompts(
            prompt,
            negative_prompt,
            prompt_embeds,
            negative_prompt_embeds,
            num_videos_per_prompt,
            max_sequence_length,
        )
        self.scheduler.set_timesteps(num_inference_steps, device=self._execution_device)
        latents = self.prepare_latents(
            batch_size,
            latent_shape[0],
            height,
            width,
            num_frames,
            torch.float32,  # the noise is drawn in float32 whatever the model dtype
            self._execution_device,
            generator,
            latents,
        )
        latents = self.denoise(
            latents, prompt_embeds, negative_prompt_embeds, guidance_scale, guidance_scale_2
        )
        if output_type == "latent":
            video = latents
        else:
            video = None if self.vae is None else self.decode_latents(latents, output_type)
        return self.output(video, return_dict)
