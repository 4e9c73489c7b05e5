"""Wan2.2 image-to-video (A14B): diffusers' ``WanImageToVideoPipeline`` with the T2V pipeline's components.

The image conditions the video through the VAE encoder: diffusers' ``prepare_latents`` encodes the image
(followed by zero frames), normalises the latents and prepends the frame mask, giving the ``condition``
(4 mask + ``z_dim`` image channels) that is concatenated to the noisy latents before every DiT call. The
DiT, text encoder and VAE are the T2V pipeline's, and so is every piece of our work (construction,
input checks, the CFG-parallel denoising loop, decoding): both pipelines inherit it from
``Wan22PipelineBase``.
"""

from __future__ import annotations

from typing import Any

import torch
from diffusers import WanImageToVideoPipeline
from diffusers.utils.torch_utils import randn_tensor

from trnmodels.core.errors import InputError
from trnmodels.core.parallel import get_world_group

from .pipeline import Wan22PipelineBase


class Wan22ImageToVideoPipeline(Wan22PipelineBase, WanImageToVideoPipeline):
    """``Wan22ImageToVideoPipeline.from_pretrained(dir, tp=, cfg_parallel=, cp=)(image=..., prompt=...)``."""

    conditions_on_image = True

    def prepare_latents(  # type: ignore[override]
        self,
        image: torch.Tensor,
        batch_size: int,
        num_channels_latents: int,
        height: int,
        width: int,
        num_frames: int,
        dtype: torch.dtype,
        device: torch.device,
        generator: torch.Generator | list[torch.Generator] | None,
        latents: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """diffusers' noise and image condition on the VAE rank(s). Every other rank draws the same noise
        from its identically seeded generator and receives the condition through an all-reduce to which
        only rank 0 contributes (the others add zeros, so the sum is exact)."""
        if self.vae is not None:
            latents, condition = super().prepare_latents(
                image,
                batch_size,
                num_channels_latents,
                height,
                width,
                num_frames,
                dtype,
                device,
                generator,
                latents,
            )
        else:
            frames = (num_frames - 1) // self.vae_scale_factor_temporal + 1
            shape = (
                batch_size,
                num_channels_latents,
                frames,
                height // self.vae_scale_factor_spatial,
                width // self.vae_scale_factor_spatial,
            )
            if latents is None:
                latents = randn_tensor(shape, generator=generator, device=device, dtype=dtype)
            else:
                latents = latents.to(device=device, dtype=dtype)
            mask_channels = self.vae_scale_factor_temporal
            condition = latents.new_zeros(batch_size, mask_channels + num_channels_latents, *shape[2:])
        world = get_world_group()
        if world.world_size > 1:
            mine = condition if world.rank == 0 else torch.zeros_like(condition)
            condition = world.all_reduce(mine)
        return latents, condition

    @torch.no_grad()
    def __call__(  # type: ignore[override]
        self,
        image: Any = None,
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
        if image is None:
            raise InputError("image-to-video needs an image to condition on (image=None)")
        latent_shape = self.check_video_shape(num_frames, height, width)
        self.check_inputs(
            prompt,
            negative_prompt,
            image,
            height,
            width,
            prompt_embeds,
            negative_prompt_embeds,
            None,
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
        device = self._execution_device
        self.scheduler.set_timesteps(num_inference_steps, device=device)
        pixels = self.video_processor.preprocess(image, height=height, width=width).to(
            device, dtype=torch.float32
        )
        latents, condition = self.prepare_latents(
            pixels,
            batch_size,
            latent_shape[0],
            height,
            width,
            num_frames,
            torch.float32,  # the noise is drawn in float32 whatever the model dtype
            device,
            generator,
            latents,
        )
        latents = self.denoise(
            latents, prompt_embeds, negative_prompt_embeds, guidance_scale, guidance_scale_2, condition
        )
        video = latents if output_type == "latent" else self.decode_latents(latents, output_type)
        return self.output(video, return_dict)
