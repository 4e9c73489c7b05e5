"""What each Wan2.2 component holds on one NeuronCore of a TP x CP x CFG mesh (``trnmodels plan``).

Weights are the components' own: each is built at rank 0's coordinate of the mesh on the meta device (the
UMT5 encoder and the DiT experts, TP-sharded) or in a ``FakeTensorMode`` (the VAE, whole, on the VAE
ranks only), and its parameters and buffers counted; the pipeline builds nothing else. Working memory:

- the VAE's is measured: one causal chunk of the decode (and, for image-to-video, of the encode) run on
  fake tensors at the shape it runs at (the whole latent frame, or the largest tile when tiling or patch
  parallelism is on), its peak taken beyond the weights, plus the decoded video every VAE rank holds;
- the encoder's and the DiT's are estimates from their shapes (their forward passes run collectives, so
  they cannot run on fake tensors without process groups): the hidden states in and out and the widest
  projection output of the tokens on the rank, float32 where the math keeps float32 (the DiT's residual and
  modulation), the K/V gathered over the CP group, and the encoder's materialised attention scores (T5's
  position bias is added to them). The DiT's attention scores are left out: the Neuron path runs a flash
  kernel that tiles them.

Components run one after another (encode, denoise, decode), so a rank's working memory is the largest of
its components', not their sum.
"""

from __future__ import annotations

import math
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from trnmodels.core.diffusion.memory import ComponentMemory, fake_peak_bytes, module_bytes
from trnmodels.core.parallel import ParallelLayout
from trnmodels.core.parallel.state import rank0_layout

from .pipeline import (
    _RequestedCFG,
    check_cp_split,
    check_tp_splits,
    read_expert_configs,
    read_model_index,
    read_vae_config,
)
from .text_encoder import UMT5Config, UMT5Encoder
from .transformer import WanDiT, WanDiTConfig
from .vae import DECODER, ENCODER, ENCODER_CHUNK, Wan22VAE

FLOAT32 = 4


def plan_memory(
    checkpoint_dir: str | Path,
    *,
    tp: int,
    cp: int,
    cfg_parallel: int,
    num_frames: int,
    height: int,
    width: int,
    max_sequence_length: int,
    dtype: torch.dtype,
    vae_dtype: torch.dtype,
    vae_tiling: bool,
    vae_patch_parallel: int,
    conditions_on_image: bool,
) -> list[ComponentMemory]:
    """One rank's components for this mesh and video, from the checkpoint's config files alone; raises
    what the pipeline would raise for a mesh or video it refuses."""
    checkpoint_dir = Path(checkpoint_dir)
    index = read_model_index(checkpoint_dir)
    _RequestedCFG(cfg_parallel).check_cfg_parallel(True)  # the plan assumes guidance is on (the default)
    experts = read_expert_configs(checkpoint_dir, index)
    encoder = UMT5Config.from_pretrained(checkpoint_dir / "text_encoder")
    check_tp_splits(checkpoint_dir, experts, encoder, tp)
    vae_config = read_vae_config(checkpoint_dir)
    tokens = check_cp_split(experts["transformer"], vae_config, cp, num_frames, height, width)
    itemsize = dtype.itemsize
    components = [
        ComponentMemory(
            "text_encoder",
            weight_bytes=_encoder_bytes(encoder, tp, dtype),
            working_bytes=_encoder_working(encoder, tp, max_sequence_length, itemsize),
            working="estimate: one prompt of max_sequence_length tokens",
        )
    ]
    components += [
        ComponentMemory(
            name,
            weight_bytes=_dit_bytes(cfg, tp, dtype),
            working_bytes=_dit_working(cfg, tp, cp, tokens, max_sequence_length, itemsize),
            working=f"estimate: one step over this rank's share (1/CP) of the video's {tokens} latent tokens",
        )
        for name, cfg in experts.items()
    ]
    tiled = vae_tiling or vae_patch_parallel > 1
    weights, working, what = _vae_memory(
        tuple(sorted((k, _hashable(v)) for k, v in vae_config.items())),
        vae_dtype,
        (num_frames, height, width),
        tiled,
        conditions_on_image,
    )
    components.append(ComponentMemory("vae", weights, working, what, vae_ranks_only=True))
    return components


# --------------------------------------------------------------------------------- text encoder, DiT


@lru_cache(maxsize=32)
def _encoder_bytes(cfg: UMT5Config, tp: int, dtype: torch.dtype) -> int:
    with rank0_layout(ParallelLayout(tp=tp)), torch.device("meta"):
        return module_bytes(UMT5Encoder(cfg, dtype=dtype))


@lru_cache(maxsize=32)
def _dit_bytes(cfg: WanDiTConfig, tp: int, dtype: torch.dtype) -> int:
    with rank0_layout(ParallelLayout(tp=tp)), torch.device("meta"):
        return module_bytes(WanDiT(cfg, dtype=dtype))


def _encoder_working(cfg: UMT5Config, tp: int, seq_len: int, itemsize: int) -> int:
    heads = cfg.num_heads // tp
    widest = max(2 * cfg.d_ff, 3 * cfg.num_heads * cfg.d_kv) // tp  # the gated FFN's two halves, or QKV
    hidden = seq_len * (2 * cfg.d_model + widest) * itemsize
    scores = heads * seq_len * seq_len * (2 * itemsize + FLOAT32)  # scores + bias, float32 softmax, probs
    return hidden + scores


def _dit_working(cfg: WanDiTConfig, tp: int, cp: int, tokens: int, text_len: int, itemsize: int) -> int:
    dim, local = cfg.inner_dim, cfg.inner_dim // tp
    mine = tokens // cp
    widest = max(cfg.ffn_dim // tp, 3 * local)  # the FFN's up projection, or the fused QKV
    hidden = mine * ((2 * dim + widest) * itemsize + 2 * dim * FLOAT32)  # x, h, widest; float32 residual
    gathered_kv = tokens * 2 * local * itemsize  # every CP rank attends over the whole video
    context = text_len * (dim + 2 * local) * itemsize  # the text embedding and its cross-attention K/V
    rope = mine * cfg.attention_head_dim * 2 * FLOAT32
    latents = math.prod((cfg.in_channels, tokens, *cfg.patch_size)) * FLOAT32 * 2  # noise in, flow out
    return hidden + gathered_kv + context + rope + latents


# ----------------------------------------------------------------------------------------------- VAE


def _hashable(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


@lru_cache(maxsize=32)
def _vae_memory(
    config: tuple[tuple[str, Any], ...],
    dtype: torch.dtype,
    video: tuple[int, int, int],
    tiled: bool,
    encode: bool,
) -> tuple[int, int, str]:
    """``(weight bytes, working bytes, how)`` of the VAE for one video size."""
    num_frames, height, width = video
    saved = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # built in its dtype (moving fake parameters later is not allowed)
    try:
        with FakeTensorMode(allow_non_fake_inputs=True):
            vae = Wan22VAE.from_config({k: list(v) if isinstance(v, tuple) else v for k, v in config})
    finally:
        torch.set_default_dtype(saved)
    with FakeTensorMode(allow_non_fake_inputs=True):
        vae._check_supported()
        if tiled:
            vae.enable_tiling()
        _, lat_h, lat_w = vae.latent_size(num_frames, height, width)
        passes = [(DECODER, vae.config.z_dim, (lat_h, lat_w))]
        if encode:
            passes.append((ENCODER, vae.config.in_channels, (height, width)))
        chunk_peak = 0
        for kind, channels, full_hw in passes:
            for h, w in vae._pass_shapes(kind, full_hw):
                chunk_peak = max(chunk_peak, _chunk_peak(vae, kind, (1, channels, 1, h, w), dtype))
        weights = module_bytes(vae)
    video_bytes = vae.config.in_channels * num_frames * height * width * dtype.itemsize
    shape = "the largest tile" if tiled else "the whole frame"
    how = f"measured on fake tensors: one causal chunk at {shape}, plus the decoded video"
    return weights, chunk_peak + video_bytes, how


def _chunk_peak(vae: Wan22VAE, kind: str, first_shape: tuple[int, ...], dtype: torch.dtype) -> int:
    """Peak of one steady-state chunk (cache in and out: the first chunk holds no cache, so it is smaller)."""
    _, cache_shapes = vae.cache_spec(kind, first_shape, dtype)
    frames = 1 if kind == DECODER else ENCODER_CHUNK
    x = torch.empty((*first_shape[:2], frames, *first_shape[3:]), dtype=dtype)
    cache = [torch.empty(s, dtype=dtype) for s in cache_shapes]
    chunk = vae.chunk_module(kind, False, first_shape, dtype)
    return fake_peak_bytes(vae, lambda: chunk.run(x, list(cache)), x, *cache)
