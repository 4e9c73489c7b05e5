"""The stages of a Wan2.2 generation, text- or image-to-video, each teacher-forced against diffusers
(``trnmodels validate PIPELINE_DIR``; core's ``accuracy.pipeline_validate`` runs and judges them).

diffusers' pipeline (``WanPipeline``, or ``WanImageToVideoPipeline`` conditioned on ``condition_image``, a
fixed gradient) is loaded from the same folder and run once in FP32 on the request, with its two experts'
calls recorded (latents, with the image condition's channels for image-to-video, timestep and text
embeddings of every conditional and unconditional call) and, for image-to-video, the video its VAE
encodes. The stages, in the order a generation runs them:

- ``text_encoder``: the prompt's tokens through our UMT5 encoder and transformers' (the real tokens'
  hidden states; diffusers zeroes the padding after the encoder);
- ``vae encode`` (image-to-video): the conditioning video (the image, then blank frames) through our VAE's
  encoder and diffusers', compared on the latent distribution's mode (what the pipeline takes);
- ``step i/N (t=...)``: the DiT expert that step uses, on the inputs diffusers recorded there, both CFG
  branches;
- ``vae decode``: the final latents diffusers produced, un-normalised as the pipeline does, through our
  VAE and diffusers'.

Each side's components are loaded on first use, once per dtype: diffusers' with ``torch_dtype`` (its
``_keep_in_fp32_modules`` stay FP32), ours as the pipeline builds them (``from_pretrained``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import transformers
from diffusers import AutoencoderKLWan, WanImageToVideoPipeline, WanPipeline, WanTransformer3DModel
from PIL import Image
from transformers import AutoTokenizer

from trnmodels.core.accuracy.pipeline_validate import ComponentHook, Side, StageCheck, ValidationRequest

from .pipeline import check_components, read_model_index, read_vae_config, video_latent_shape
from .text_encoder import UMT5Encoder
from .transformer import WanDiT, WanDiTConfig
from .vae import Wan22VAE

GUIDANCE_SCALE = 5.0  # diffusers' default: both CFG branches run, as they do in serving
NEGATIVE_PROMPT = ""  # what diffusers encodes when no negative prompt is given
SEED = 0

Recorded = tuple[str, torch.Tensor, torch.Tensor, torch.Tensor]  # expert, latents, timestep, text


class Components:
    """Each side's components, loaded on first use and kept per (side, name, dtype)."""

    def __init__(
        self,
        checkpoint_dir: Path,
        reference: WanPipeline | WanImageToVideoPipeline,
        component_hook: ComponentHook | None,
    ):
        self.dir, self.hook = checkpoint_dir, component_hook
        self._loaded: dict[tuple[Side, str, torch.dtype], torch.nn.Module] = {
            ("reference", name, torch.float32): getattr(reference, name)
            for name in ("text_encoder", "transformer", "transformer_2", "vae")
            if getattr(reference, name) is not None
        }

    def get(self, side: Side, name: str, dtype: torch.dtype) -> torch.nn.Module:
        key = (side, name, dtype)
        if key not in self._loaded:
            self._loaded[key] = self._load(side, name, dtype).eval()
            if side == "ours" and self.hook is not None:
                self.hook(name, self._loaded[key])
        return self._loaded[key]

    def _load(self, side: Side, name: str, dtype: torch.dtype) -> torch.nn.Module:
        folder = self.dir / name
        if side == "reference":
            if name == "text_encoder":
                return transformers.UMT5EncoderModel.from_pretrained(folder, dtype=dtype)
            cls = AutoencoderKLWan if name == "vae" else WanTransformer3DModel
            return cls.from_pretrained(folder, torch_dtype=dtype)
        if name == "text_encoder":
            return UMT5Encoder.from_pretrained(folder, dtype=dtype)
        if name == "vae":
            return Wan22VAE.from_pretrained(folder, torch_dtype=dtype)
        return WanDiT.from_pretrained(folder, dtype=dtype)


def condition_image(height: int, width: int) -> Image.Image:
    """A fixed image to condition image-to-video on: colour ramps across and down, so every pixel differs."""
    rows = torch.linspace(0, 1, height)[:, None].expand(height, width)
    cols = torch.linspace(0, 1, width)[None, :].expand(height, width)
    pixels = torch.stack([cols, rows, (cols + rows) / 2], dim=-1)
    return Image.fromarray((pixels * 255).round().to(torch.uint8).numpy())


def record_reference(
    reference: WanPipeline | WanImageToVideoPipeline, request: dict[str, Any]
) -> tuple[list[Recorded], list[torch.Tensor], torch.Tensor]:
    """Run diffusers' pipeline in FP32, recording every expert call and every video its VAE encodes;
    returns those and the final latents."""
    calls: list[Recorded] = []
    encoded: list[torch.Tensor] = []
    encode = reference.vae.encode

    def recording_encode(x: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        encoded.append(x.detach().clone())
        return encode(x, *args, **kwargs)

    def recorder(name: str) -> Callable[..., None]:
        def hook(module: torch.nn.Module, args: tuple, kwargs: dict[str, Any]) -> None:
            calls.append(
                (
                    name,
                    kwargs["hidden_states"].detach().clone(),
                    kwargs["timestep"].detach().clone(),
                    kwargs["encoder_hidden_states"].detach().clone(),
                )
            )

        return hook

    handles = [
        getattr(reference, name).register_forward_pre_hook(recorder(name), with_kwargs=True)
        for name in ("transformer", "transformer_2")
        if getattr(reference, name) is not None
    ]
    reference.vae.encode = recording_encode
    try:
        latents = reference(
            **request,
            negative_prompt=NEGATIVE_PROMPT,
            guidance_scale=GUIDANCE_SCALE,
            generator=torch.Generator().manual_seed(SEED),
            output_type="latent",
        ).frames
    finally:
        del reference.vae.encode
        for handle in handles:
            handle.remove()
    return calls, encoded, latents


def _text_stage(components: Components, tokenizer: Any, prompt: str, max_sequence_length: int) -> StageCheck:
    tokens = tokenizer(
        [prompt],
        padding="max_length",
        max_length=max_sequence_length,
        truncation=True,
        add_special_tokens=True,
        return_attention_mask=True,
        return_tensors="pt",
    )
    ids, mask = tokens.input_ids, tokens.attention_mask
    real = int(mask.sum())

    # The prompt's tokens only: the pipeline zeroes the padding's states, and every padding position holds
    # the same state (one token, relative positions only), which would weigh one position many times over.
    def run(side: Side, dtype: torch.dtype) -> torch.Tensor:
        encoder = components.get(side, "text_encoder", dtype)
        return encoder(ids, mask).last_hidden_state[:, :real].float()

    return StageCheck("text_encoder", "text_encoder", run)


def _step_stage(components: Components, index: int, steps: int, calls: list[Recorded]) -> StageCheck:
    name = calls[0][0]

    def run(side: Side, dtype: torch.dtype) -> torch.Tensor:
        model = components.get(side, name, dtype)
        outputs = []
        for _, latents, timestep, text in calls:
            x, context = latents.to(dtype), text.to(dtype)
            if side == "reference":
                out = model(
                    hidden_states=x, timestep=timestep, encoder_hidden_states=context, return_dict=False
                )[0]
            else:
                out = model(x, timestep, context)
            outputs.append(out.float())
        return torch.stack(outputs)

    t = calls[0][2].flatten()[0].item()
    return StageCheck(f"step {index + 1}/{steps} (t={t:g})", name, run)


def _encode_stage(components: Components, video: torch.Tensor) -> StageCheck:
    def run(side: Side, dtype: torch.dtype) -> torch.Tensor:
        vae = components.get(side, "vae", dtype)
        return vae.encode(video.to(dtype)).latent_dist.mode().float()

    return StageCheck("vae encode", "vae", run)


def _decode_stage(components: Components, latents: torch.Tensor) -> StageCheck:
    def run(side: Side, dtype: torch.dtype) -> torch.Tensor:
        vae = components.get(side, "vae", dtype)
        config = vae.config
        mean = torch.tensor(config.latents_mean).view(1, config.z_dim, 1, 1, 1)
        std = torch.tensor(config.latents_std).view(1, config.z_dim, 1, 1, 1)
        z = (latents * std + mean).to(dtype)  # the pipeline's un-normalisation
        return vae.decode(z, return_dict=False)[0].float()

    return StageCheck("vae decode", "vae", run)


def validation_stages(
    checkpoint_dir: str | Path,
    request: ValidationRequest,
    *,
    conditions_on_image: bool = False,
    component_hook: ComponentHook | None = None,
) -> list[StageCheck]:
    """The stages of one generation, in order, with the reference's FP32 inputs recorded (module docstring)."""
    checkpoint_dir = Path(checkpoint_dir)
    index = read_model_index(checkpoint_dir)
    check_components(checkpoint_dir, index, index.get("boundary_ratio"))
    dit = WanDiTConfig.from_pretrained(checkpoint_dir / "transformer")
    r = request
    # diffusers would round a size it cannot take; refuse it as our pipeline does.
    video_latent_shape(
        r.num_frames, r.height, r.width, patch_size=dit.patch_size, vae_config=read_vae_config(checkpoint_dir)
    )
    reference_class = WanImageToVideoPipeline if conditions_on_image else WanPipeline
    reference = reference_class.from_pretrained(checkpoint_dir, torch_dtype=torch.float32)
    reference.set_progress_bar_config(disable=True)
    image = {"image": condition_image(r.height, r.width)} if conditions_on_image else {}
    call = {
        **image,
        "prompt": r.prompt,
        "num_frames": r.num_frames,
        "height": r.height,
        "width": r.width,
        "num_inference_steps": r.steps,
        "max_sequence_length": r.max_sequence_length,
    }
    calls, encoded, latents = record_reference(reference, call)
    components = Components(checkpoint_dir, reference, component_hook)
    tokenizer = AutoTokenizer.from_pretrained(checkpoint_dir / "tokenizer")
    per_step = len(calls) // r.steps  # both CFG branches of a step
    stages = [_text_stage(components, tokenizer, r.prompt, r.max_sequence_length)]
    stages += [_encode_stage(components, video) for video in encoded]
    stages += [
        _step_stage(components, i, r.steps, calls[i * per_step : (i + 1) * per_step]) for i in range(r.steps)
    ]
    stages.append(_decode_stage(components, latents))
    return stages
