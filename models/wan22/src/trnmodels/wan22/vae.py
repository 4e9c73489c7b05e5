"""The Wan VAE (3D causal-conv autoencoder): diffusers' math, run chunk by chunk through fixed-shape graphs.

diffusers' ``AutoencoderKLWan`` decodes one latent frame at a time (and encodes one chunk of four frames
at a time), carrying each causal convolution's last frames forward in a Python list that starts as
``None`` (and ``"Rep"`` at the temporal upsamplers). Here that feature cache is an explicit tuple of
tensors, so a pass is two graphs of fixed shape each, replayed over the frames:

- ``first``: the first chunk, with no cache; returns its output and the cache;
- ``step``: any later chunk, cache in, output and cache out.

The cache the ``first`` graph returns is put in its steady-state shape: a causal convolution zero-pads
the frames it has no cache for, so a short cache is the same as one with zero frames in front, and the
upsampler's ``"Rep"`` marker is the same as an all-zero cache. Same numbers, one ``step`` shape for every
later chunk. An uncompiled pass needs no fixed shapes: it carries diffusers' own cache list from chunk to
chunk (:class:`DiffusersCache`), as diffusers does. The convolution blocks themselves are diffusers'
(imported, not rewritten), two of their modules' classes swapped for faster forwards of the same math:
each causal convolution copies its input once where diffusers copies it twice
(:class:`CopyOnceCausalConv3d`), and each RMS norm sums squares where diffusers calls ``F.normalize``
(:class:`SquareSumRMSNorm`).

On top of that the VAE adds spatial tiling (:class:`~trnmodels.core.diffusion.vae_tiling.SpatialTilingMixin`),
patch parallelism (:class:`~trnmodels.core.diffusion.vae_patch_parallel.VaePatchParallelMixin`) and
per-component compile. It keeps diffusers' interface (``decode(z).sample``, ``encode(x).latent_dist``,
``config.z_dim`` / ``latents_mean`` / ``latents_std`` / ``scale_factor_*``, ``enable_tiling``), so it drops
into a diffusers pipeline as ``vae``. It is not TP-sharded: only the VAE rank(s) build it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from diffusers.models.autoencoders.autoencoder_kl import AutoencoderKLOutput
from diffusers.models.autoencoders.autoencoder_kl_wan import (
    AutoencoderKLWan,
    WanCausalConv3d,
    WanRMS_norm,
)
from diffusers.models.autoencoders.vae import DecoderOutput, DiagonalGaussianDistribution
from torch._subclasses.fake_tensor import FakeTensorMode

from trnmodels.core.compile.diffusion import (
    ComponentGraph,
    ComponentResult,
    compile_components,
    load_component_graph,
    signature,
)
from trnmodels.core.diffusion.vae_patch_parallel import VaePatchParallelMixin
from trnmodels.core.diffusion.vae_tiling import SpatialTilingMixin
from trnmodels.core.errors import ConfigError, InputError
from trnmodels.core.finite import check_finite_input, check_finite_output

DECODER = "wan22_vae_decoder"
ENCODER = "wan22_vae_encoder"
# Frames per encoder chunk after the first (diffusers' encode loop, fixed by the temporal downsampling).
ENCODER_CHUNK = 4

Shape = tuple[int, ...]


class CopyOnceCausalConv3d(WanCausalConv3d):
    """diffusers' ``WanCausalConv3d`` with one copy of its input where diffusers makes two.

    diffusers concatenates the cached frames in front of the input, then ``F.pad``s that into a second
    copy (the spatial border, and zero frames where the cache is short). Here the cached frames and the
    input are copied once, straight into the padded buffer, whose border alone is zeroed. The
    convolution then gets the very tensor diffusers' gets (same shape, same values), so torch picks the
    same kernel for it and the sums are diffusers' own, bit for bit. (Padding inside the convolution
    instead would save the border too, but torch runs batch-1 inputs of few frames through its native
    convolution, which is slower with padding than on a padded copy: 75 → 97 ms on 32 × 3 × 128 × 128
    here.) Same weights, same state dict.
    """

    def forward(self, x: torch.Tensor, cache_x: torch.Tensor | None = None) -> torch.Tensor:
        if torch.compiler.is_compiling():
            # A captured graph keeps diffusers' ops: Inductor fuses the concatenation and the padding
            # into one copy itself, and the slice writes below would only lengthen its compile.
            return super().forward(x, cache_x)
        pad_w, _, pad_h, _, front, _ = self._padding
        parts = [x]
        if cache_x is not None and front > 0:
            parts.insert(0, cache_x.to(x.device))
            front -= cache_x.shape[2]
        height, width = x.shape[3:]
        frames = front + sum(part.shape[2] for part in parts)
        padded = x.new_empty((*x.shape[:2], frames, height + 2 * pad_h, width + 2 * pad_w))
        padded[:, :, :front].zero_()
        if pad_h:
            padded[:, :, front:, :pad_h].zero_()
            padded[:, :, front:, pad_h + height :].zero_()
        if pad_w:
            padded[:, :, front:, pad_h : pad_h + height, :pad_w].zero_()
            padded[:, :, front:, pad_h : pad_h + height, pad_w + width :].zero_()
        start = front
        for part in parts:
            padded[:, :, start : start + part.shape[2], pad_h : pad_h + height, pad_w : pad_w + width] = part
            start += part.shape[2]
        return torch.nn.Conv3d.forward(self, padded)


class SquareSumRMSNorm(WanRMS_norm):
    """diffusers' ``WanRMS_norm`` with its norm taken as a sum of squares, and its scales applied in place.

    diffusers normalises through ``F.normalize``, whose ``linalg.vector_norm`` over the channel dimension
    took 7.6 ms on a 32 x 4 x 128 x 128 feature map here where squaring and summing takes 0.3 ms: 13-25% of
    a whole decode. The result differs from diffusers' by FP32 rounding only (the sums run in another
    order). The three scalings then reuse one output buffer, so the norm holds one full-size temporary
    where diffusers' holds two. Same parameters, same state dict.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.compiler.is_compiling() or torch.is_grad_enabled():
            # Inductor fuses diffusers' ops itself; the in-place scaling would break a backward.
            return super().forward(x)
        dim = 1 if self.channel_first else -1
        work = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
        # F.normalize's floor on the norm (eps 1e-12).
        denominator = work.square().sum(dim, keepdim=True).sqrt_().clamp_min_(1e-12)
        out = work / denominator
        out = out.to(x.dtype).mul_(self.scale).mul_(self.gamma)
        if isinstance(self.bias, torch.Tensor):
            out.add_(self.bias)
        return out


def _swap_blocks(net: torch.nn.Module) -> None:
    """Make each of ``net``'s causal convolutions a :class:`CopyOnceCausalConv3d` and each RMS norm a
    :class:`SquareSumRMSNorm` (the same modules, their classes swapped: parameters, names and hooks
    stay)."""
    for module in net.modules():
        if type(module) is WanCausalConv3d:
            module.__class__ = CopyOnceCausalConv3d
        elif type(module) is WanRMS_norm:
            module.__class__ = SquareSumRMSNorm


class CausalChunk(torch.nn.Module):
    """One chunk of a causal VAE pass (diffusers' encoder or decoder), feature cache as explicit tensors.

    ``slots`` are the cache entries the network uses and ``cache_shapes`` their steady-state shapes;
    the ``first`` chunk takes no cache.
    """

    def __init__(
        self,
        pre: torch.nn.Module,
        net: torch.nn.Module,
        post: torch.nn.Module,
        *,
        num_convs: int,
        slots: Sequence[int],
        cache_shapes: Sequence[Shape],
        first: bool,
        decoder: bool,
    ):
        super().__init__()
        self.pre, self.net, self.post = pre, net, post
        self.num_convs = num_convs
        self.slots = tuple(slots)
        self.cache_shapes = tuple(tuple(s) for s in cache_shapes)
        self.first = first
        self.decoder = decoder

    def forward(self, x: torch.Tensor, *cache: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return self.run(x, list(cache))

    def run(self, x: torch.Tensor, cache: list[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        """``forward`` that empties ``cache``: each entry is then held only by the network's cache list,
        which replaces it conv by conv (as diffusers does), so the old and the new cache are never both
        whole in memory."""
        if self.first:
            feat_cache: list[Any] = [None] * self.num_convs
        else:
            feat_cache = _entries_from_steady(self.num_convs, self.slots, cache)
        cache.clear()
        extra = {"first_chunk": self.first} if self.decoder else {}
        out = self.post(self.net(self.pre(x), feat_cache=feat_cache, feat_idx=[0], **extra))
        return (
            out,
            *(
                _steady(feat_cache[s], shape, x)
                for s, shape in zip(self.slots, self.cache_shapes, strict=True)
            ),
        )


def _entries_from_steady(num_convs: int, slots: Sequence[int], tensors: Sequence[torch.Tensor]) -> list[Any]:
    """diffusers' per-convolution cache list holding steady-state ``tensors`` in their ``slots``."""
    entries: list[Any] = [None] * num_convs
    for slot, tensor in zip(slots, tensors, strict=True):
        entries[slot] = tensor
    return entries


def _steady(entry: Any, shape: Shape, like: torch.Tensor) -> torch.Tensor:
    """A cache entry in its steady-state shape: missing frames (and ``"Rep"``) are zero frames in front."""
    if not isinstance(entry, torch.Tensor):
        return like.new_zeros(shape)
    missing = shape[2] - entry.shape[2]
    if missing == 0:
        return entry
    return torch.cat([entry.new_zeros((*entry.shape[:2], missing, *entry.shape[3:])), entry], dim=2)


@dataclass
class DiffusersCache:
    """diffusers' own feature cache, as an eager pass carries it from chunk to chunk: one entry per causal
    convolution (``None``, ``"Rep"`` or its last frames), replaced conv by conv by the network."""

    entries: list[Any]


# Between chunks: the steady-state cache tensors of a compiled graph, or diffusers' list (eager).
Cache = list[torch.Tensor] | DiffusersCache


class Wan22VAE(VaePatchParallelMixin, SpatialTilingMixin, AutoencoderKLWan):
    """diffusers' ``AutoencoderKLWan`` with chunked fixed-shape graphs, tiling, patch parallelism, compile."""

    # diffusers builds the model from ``__init__``'s signature (ConfigMixin), so this class adds no
    # ``__init__``; its own state lives in plain dicts created on first use.
    def _state(self, name: str) -> dict[Any, Any]:
        return self.__dict__.setdefault(name, {})

    def _check_supported(self) -> None:
        if self.config.patch_size is not None:
            raise ConfigError(
                f"vae/config.json: patch_size={self.config.patch_size} (the Wan2.2 TI2V-5B VAE) is not "
                "supported; the A14B pipelines use the Wan2.1 VAE (patch_size null)"
            )

    # ---- the chunk graphs -------------------------------------------------------------------------

    def _parts(self, kind: str) -> tuple[torch.nn.Module, torch.nn.Module, torch.nn.Module]:
        net = self.decoder if kind == DECODER else self.encoder
        if kind not in self._state("swapped"):  # a walk over every module: once per network
            _swap_blocks(net)
            self._state("swapped")[kind] = True
        if kind == DECODER:
            return self.post_quant_conv, net, torch.nn.Identity()
        return torch.nn.Identity(), net, self.quant_conv

    def _num_convs(self, kind: str) -> int:
        if kind not in self._state("num_convs"):
            net = self.decoder if kind == DECODER else self.encoder
            # CopyOnceCausalConv3d counts too
            self._state("num_convs")[kind] = sum(isinstance(m, WanCausalConv3d) for m in net.modules())
        return self._state("num_convs")[kind]

    def _steady_shape(self, kind: str, first_shape: Shape) -> Shape:
        if kind == DECODER:
            return first_shape
        return (*first_shape[:2], ENCODER_CHUNK, *first_shape[3:])

    def cache_spec(
        self, kind: str, first_shape: Shape, dtype: torch.dtype
    ) -> tuple[tuple[int, ...], tuple[Shape, ...]]:
        """The cache slots a pass uses and their steady-state shapes, found by running the first two
        chunks on fake tensors (no compute, no memory)."""
        key = (kind, first_shape, dtype)
        if key not in self._state("cache_specs"):
            pre, net, post = self._parts(kind)
            feat_cache: list[Any] = [None] * self._num_convs(kind)
            with FakeTensorMode(allow_non_fake_inputs=True), torch.no_grad():
                for first, shape in ((True, first_shape), (False, self._steady_shape(kind, first_shape))):
                    extra = {"first_chunk": first} if kind == DECODER else {}
                    x = torch.empty(shape, dtype=dtype)
                    post(net(pre(x), feat_cache=feat_cache, feat_idx=[0], **extra))
            slots = tuple(i for i, c in enumerate(feat_cache) if isinstance(c, torch.Tensor))
            self._state("cache_specs")[key] = slots, tuple(tuple(feat_cache[i].shape) for i in slots)
        return self._state("cache_specs")[key]

    def chunk_module(self, kind: str, first: bool, first_shape: Shape, dtype: torch.dtype) -> CausalChunk:
        key = (kind, first, first_shape, dtype)
        if key not in self._state("chunks"):
            slots, shapes = self.cache_spec(kind, first_shape, dtype)
            self._state("chunks")[key] = CausalChunk(
                *self._parts(kind),
                num_convs=self._num_convs(kind),
                slots=slots,
                cache_shapes=shapes,
                first=first,
                decoder=kind == DECODER,
            ).eval()
        return self._state("chunks")[key]

    def _run(
        self,
        kind: str,
        first: bool,
        x: torch.Tensor,
        cache: Cache,
        first_shape: Shape,
        *,
        pre_done: bool = False,
    ) -> tuple[torch.Tensor, Cache]:
        """One chunk; ``cache`` is consumed (emptied) so its entries are freed as the chunk replaces them.

        A compiled graph takes and returns the steady-state cache tensors. An eager chunk runs the
        network as diffusers does, on diffusers' own cache list: no fixed shapes to find first, so an
        eager pass never traces the network on fake tensors (which costs its first call memory)."""
        fn = self._state("compiled").get((kind, first, first_shape, x.dtype))
        if fn is None:
            return self._run_eager(kind, first, x, cache, first_shape, pre_done=pre_done)
        steady = [] if first else self._steady_cache(kind, cache, x, first_shape)
        # A compiled graph assumes the dense layout it was traced with; slices and caches may not be.
        args = [t.contiguous() for t in (x, *steady)]
        steady.clear()
        out = fn(*args)
        return out[0], list(out[1:])

    def _run_eager(
        self,
        kind: str,
        first: bool,
        x: torch.Tensor,
        cache: Cache,
        first_shape: Shape,
        *,
        pre_done: bool = False,
    ) -> tuple[torch.Tensor, Cache]:
        pre, net, post = self._parts(kind)
        if pre_done:
            pre = torch.nn.Identity()
        if first:
            entries: list[Any] = [None] * self._num_convs(kind)
        elif isinstance(cache, DiffusersCache):
            entries = cache.entries
        else:  # the steady tensors of a compiled chunk
            slots, _ = self.cache_spec(kind, first_shape, x.dtype)
            entries = _entries_from_steady(self._num_convs(kind), slots, cache)
            cache.clear()
        extra = {"first_chunk": first} if kind == DECODER else {}
        out = post(net(pre(x), feat_cache=entries, feat_idx=[0], **extra))
        return out, DiffusersCache(entries)

    def _steady_cache(
        self, kind: str, cache: Cache, x: torch.Tensor, first_shape: Shape
    ) -> list[torch.Tensor]:
        if not isinstance(cache, DiffusersCache):
            return cache
        slots, shapes = self.cache_spec(kind, first_shape, x.dtype)
        steady = [_steady(cache.entries[s], shape, x) for s, shape in zip(slots, shapes, strict=True)]
        cache.entries.clear()
        return steady

    def _decode_frames(self, z: torch.Tensor) -> torch.Tensor:
        """Decode ``[B, z_dim, T, h, w]`` latents one frame at a time (no tiling, no clamp)."""
        first_shape = (*z.shape[:2], 1, *z.shape[3:])
        compiled = self._state("compiled")
        pre_done = not any((DECODER, first, first_shape, z.dtype) in compiled for first in (True, False))
        if pre_done:
            # Uncompiled, the 1x1x1 post-quant convolution runs once over every frame, as diffusers' does:
            # run per chunk it cost each chunk's shape its own first-call buffers (0.5 MB of the bench
            # decode's peak).
            z = self.post_quant_conv(z)
        out, cache = self._run(DECODER, True, z[:, :, :1], [], first_shape, pre_done=pre_done)
        frames = [out]
        for t in range(1, z.shape[2]):
            out, cache = self._run(DECODER, False, z[:, :, t : t + 1], cache, first_shape, pre_done=pre_done)
            frames.append(out)
        return torch.cat(frames, dim=2)

    def _encode_frames(self, x: torch.Tensor) -> torch.Tensor:
        """Encode ``[B, C, 1 + 4k, H, W]`` video in chunks of 1, 4, 4, ... frames (no tiling)."""
        first_shape = (*x.shape[:2], 1, *x.shape[3:])
        out, cache = self._run(ENCODER, True, x[:, :, :1], [], first_shape)
        chunks = [out]
        for t in range(1, x.shape[2], ENCODER_CHUNK):
            out, cache = self._run(ENCODER, False, x[:, :, t : t + ENCODER_CHUNK], cache, first_shape)
            chunks.append(out)
        return torch.cat(chunks, dim=2)

    # ---- diffusers' entry points ------------------------------------------------------------------

    def _check_latents(self, z: torch.Tensor) -> None:
        if z.dim() != 5 or z.shape[1] != self.config.z_dim:
            raise InputError(
                f"VAE decode: expected latents [B, {self.config.z_dim}, T, h, w], got {list(z.shape)}"
            )
        check_finite_input(z, "VAE decode: latents")

    def _decode(self, z: torch.Tensor, return_dict: bool = True) -> DecoderOutput | tuple[torch.Tensor]:
        self._check_supported()
        self._check_latents(z)
        hw = (z.shape[-2], z.shape[-1])
        if self.vae_patch_parallel_size > 1:
            out = self.patch_parallel_decode_latents(z, self._decode_frames)
        elif self.wants_tiled_decode(hw):
            out = self.tiled_decode_latents(z, self._decode_frames)
        else:
            out = self._decode_frames(z)
        check_finite_output(out, "VAE decode: frames", self)  # before the clamp, which keeps NaN anyway
        out = torch.clamp(out, min=-1.0, max=1.0)
        return DecoderOutput(sample=out) if return_dict else (out,)

    def _encode(self, x: torch.Tensor) -> torch.Tensor:
        self._check_supported()
        if x.dim() != 5 or (x.shape[2] - 1) % ENCODER_CHUNK:
            raise InputError(
                f"VAE encode: expected video [B, C, 1 + 4k, H, W] (a frame count of the form 4k+1), "
                f"got {list(x.shape)}"
            )
        height, width = x.shape[-2:]
        ratio = self.spatial_compression_ratio
        if height % ratio or width % ratio:
            raise InputError(
                f"VAE encode: height {height} and width {width} must be divisible by the spatial "
                f"compression ratio {ratio}"
            )
        check_finite_input(x, "VAE encode: video")
        if self.wants_tiled_encode((height, width)):
            h = self.tiled_encode_sample(x, self._encode_frames)
        else:
            h = self._encode_frames(x)
        check_finite_output(h, "VAE encode: latent moments", self)
        return h

    def encode(self, x: torch.Tensor, return_dict: bool = True) -> AutoencoderKLOutput | tuple[Any]:
        if self.use_slicing and x.shape[0] > 1:
            h = torch.cat([self._encode(s) for s in x.split(1)])
        else:
            h = self._encode(x)
        posterior = DiagonalGaussianDistribution(h)
        return AutoencoderKLOutput(latent_dist=posterior) if return_dict else (posterior,)

    # ---- compile ----------------------------------------------------------------------------------

    def latent_size(self, num_frames: int, height: int, width: int) -> tuple[int, int, int]:
        """Latent (frames, height, width) of a ``num_frames x height x width`` video."""
        ratio_t, ratio_s = self.config.scale_factor_temporal, self.spatial_compression_ratio
        return (num_frames - 1) // ratio_t + 1, height // ratio_s, width // ratio_s

    def _pass_shapes(self, kind: str, full_hw: tuple[int, int]) -> list[tuple[int, int]]:
        """The spatial shapes the chunk graphs of one pass run on: the tiles' shapes when tiling."""
        if kind == DECODER:
            if self.vae_patch_parallel_size > 1 or self.wants_tiled_decode(full_hw):
                return self.decode_tile_grid(full_hw).distinct_tile_shapes()
        elif self.wants_tiled_encode(full_hw):
            return self.encode_tile_grid(full_hw).distinct_tile_shapes()
        return [full_hw]

    def component_graphs(
        self, *, num_frames: int, height: int, width: int, batch_size: int = 1, compile_encoder: bool = False
    ) -> list[ComponentGraph]:
        """The graphs a ``num_frames x height x width`` generation runs: decoder first/step per tile shape,
        and the encoder's when ``compile_encoder`` (image conditioning)."""
        dtype = self.dtype
        frames, lat_h, lat_w = self.latent_size(num_frames, height, width)
        passes = [(DECODER, self.config.z_dim, frames > 1, self._pass_shapes(DECODER, (lat_h, lat_w)))]
        if compile_encoder:
            in_channels = self.config.in_channels
            passes.append((ENCODER, in_channels, num_frames > 1, self._pass_shapes(ENCODER, (height, width))))
        config = {k: v for k, v in self.config.items() if not k.startswith("_")}
        graphs = []
        for kind, channels, has_step, shapes in passes:
            for h, w in shapes:
                first_shape = (batch_size, channels, 1, h, w)
                for first in (True, False) if has_step else (True,):
                    graphs.append(self._component_graph(kind, first, first_shape, dtype, config))
        return graphs

    def _component_graph(
        self, kind: str, first: bool, first_shape: Shape, dtype: torch.dtype, config: dict[str, Any]
    ) -> ComponentGraph:
        _, cache_shapes = self.cache_spec(kind, first_shape, dtype)
        x_shape = first_shape if first else self._steady_shape(kind, first_shape)
        shapes = [x_shape] if first else [x_shape, *cache_shapes]

        def build() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
            module = self.chunk_module(kind, first, first_shape, dtype)
            return module, tuple(torch.zeros(s, dtype=dtype) for s in shapes)

        return ComponentGraph(
            model_name=kind,
            graph="first" if first else "step",
            package="trnmodels.wan22",
            model_config=config,
            inputs=signature([torch.empty(s, dtype=dtype, device="meta") for s in shapes]),
            dtype=str(dtype).removeprefix("torch."),
            build=build,
            runtime_config={
                "tiling": self.use_tiling,
                "vae_patch_parallel_size": self.vae_patch_parallel_size,
            },
        )

    def compile(  # type: ignore[override]
        self,
        *,
        num_frames: int,
        height: int,
        width: int,
        batch_size: int = 1,
        compile_encoder: bool = False,
        cache_dir: str | Path | None = None,
        on_result: Callable[[ComponentResult], None] | None = None,
    ) -> list[ComponentResult]:
        """Compile (or find in the cache) and load the graphs of a ``num_frames x height x width``
        generation. The encoder compiles only with ``compile_encoder=True`` (the image-to-video
        pipeline asks for it); without it an encode runs the same chunk modules eagerly."""
        graphs = self.component_graphs(
            num_frames=num_frames,
            height=height,
            width=width,
            batch_size=batch_size,
            compile_encoder=compile_encoder,
        )
        results = compile_components(graphs, cache_dir, on_result)
        for graph in graphs:
            first = graph.graph == "first"
            shape = graph.inputs[0][0]
            first_shape = shape if first else (*shape[:2], 1, *shape[3:])
            module = self.chunk_module(graph.model_name, first, first_shape, self.dtype)
            loaded = load_component_graph(graph, module, cache_dir)
            if loaded is not None:
                self._state("compiled")[(graph.model_name, first, first_shape, self.dtype)] = loaded
        return results

    @property
    def compiled_graphs(self) -> int:
        return len(self._state("compiled"))
