"""The Wan2.2 DiT (diffusers' ``WanTransformer3DModel``, A14B configs) on core's parallel layers, TP and CP.

Every matmul is one of core's parallel layers, which carry their TP weight loaders; ``checkpoint_keys``
names the diffusers key(s) of every parameter, a fused QKV (or cross-attention KV) mapping to a list. Attention heads, the FFN width and the text/time projections are split over TP; the patch
embedding, the output head and the modulation tables are replicated. With context parallelism the token
sequence is split over the CP group after the patch embedding and gathered before the output head.

Pure math comes from diffusers: the 3D RoPE tables (``WanRotaryPosEmbed``, buffers only) and the
sinusoidal timestep embedding. Norms and modulation run in float32 where diffusers keeps them in float32,
so BF16 rounds where the reference rounds. Shapes are static: one graph per video size.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from diffusers.models.embeddings import get_timestep_embedding
from diffusers.models.transformers.transformer_wan import WanRotaryPosEmbed
from torch import nn

from trnmodels.core.compile.diffusion import (
    ComponentGraph,
    ComponentResult,
    compile_components,
    load_component_graph,
    signature,
)
from trnmodels.core.diffusion import cp_self_attention, gather_sequence, split_sequence
from trnmodels.core.errors import ConfigError, InputError
from trnmodels.core.hf_config import read_json_object
from trnmodels.core.modules import LayerNorm
from trnmodels.core.ops import attention, gelu_tanh
from trnmodels.core.parallel import (
    ColumnParallelLinear,
    MergedColumnParallelLinear,
    ParallelLayout,
    ProcessGroupHandle,
    ReplicatedLinear,
    RowParallelLinear,
    check_divisible,
    get_cp_group,
    get_parallel_layout,
    get_tp_group,
)
from trnmodels.core.weights import (
    KeyDict,
    load_checkpoint_dir,
    prefixed,
    set_weight_loader,
    sharded,
)


@dataclass(frozen=True)
class WanDiTConfig:
    """The fields of a diffusers ``transformer/config.json`` this model reads (A14B defaults)."""

    patch_size: tuple[int, int, int] = (1, 2, 2)
    num_attention_heads: int = 40
    attention_head_dim: int = 128
    in_channels: int = 16
    out_channels: int = 16
    text_dim: int = 4096
    freq_dim: int = 256
    ffn_dim: int = 13824
    num_layers: int = 40
    cross_attn_norm: bool = True
    qk_norm: str | None = "rms_norm_across_heads"
    eps: float = 1e-6
    image_dim: int | None = None
    added_kv_proj_dim: int | None = None
    rope_max_seq_len: int = 1024
    pos_embed_seq_len: int | None = None
    # Stage-config field (not in diffusers' config): the CP self-attention path, see core.diffusion.
    enable_ring_attention: bool | None = None

    @property
    def inner_dim(self) -> int:
        return self.num_attention_heads * self.attention_head_dim

    @classmethod
    def from_dict(cls, raw: dict[str, Any], source: str = "transformer config") -> WanDiTConfig:
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in raw.items() if k in known}
        if "patch_size" in values:
            values["patch_size"] = tuple(values["patch_size"])
        if "out_channels" in values and values["out_channels"] is None:
            # diffusers: ``out_channels = out_channels or in_channels``.
            values["out_channels"] = values.get("in_channels", cls.in_channels)
        cfg = cls(**values)
        if cfg.image_dim is not None or cfg.added_kv_proj_dim is not None:
            raise ConfigError(
                f"{source}: image_dim/added_kv_proj_dim are set (a Wan2.1 I2V CLIP-conditioned DiT); "
                "Wan2.2 A14B conditions on the image through latent channels only, and only that is supported"
            )
        if cfg.qk_norm != "rms_norm_across_heads":
            raise ConfigError(f"{source}: qk_norm: expected 'rms_norm_across_heads', got {cfg.qk_norm!r}")
        if len(cfg.patch_size) != 3:
            raise ConfigError(
                f"{source}: patch_size: expected 3 values (t, h, w), got {list(cfg.patch_size)}"
            )
        return cfg

    @classmethod
    def from_pretrained(cls, path: str | Path, **overrides: Any) -> WanDiTConfig:
        file = Path(path) / "config.json"
        if not file.is_file():
            raise ConfigError(f"{path}: no config.json (expected a diffusers transformer folder)")
        return cls.from_dict({**read_json_object(file), **overrides}, str(file))


class RMSNormAcrossHeads(nn.Module):
    """RMSNorm over all heads' features (``qk_norm="rms_norm_across_heads"``) when TP holds only some
    heads: the sum of squares is all-reduced, so each rank normalises by the statistic of the whole
    vector. The weight is split over TP like the heads it scales."""

    def __init__(self, cfg: WanDiTConfig, local_dim: int, dtype: torch.dtype, tp: ProcessGroupHandle):
        super().__init__()
        self.tp, self.eps, self.full_dim = tp, cfg.eps, cfg.inner_dim
        self.weight = nn.Parameter(torch.empty(local_dim, dtype=dtype), requires_grad=False)
        set_weight_loader(self.weight, sharded(0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        sumsq = self.tp.all_reduce(xf.pow(2).sum(-1, keepdim=True))
        return (xf * torch.rsqrt(sumsq / self.full_dim + self.eps) * self.weight.float()).to(x.dtype)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Wan's interleaved-pair rotation of ``x [B, T, H, D]`` by the tables ``[1, T, 1, D]``."""
    x1, x2 = x.float().unflatten(-1, (-1, 2)).unbind(-1)
    c, s = cos[..., 0::2], sin[..., 1::2]
    return torch.stack([x1 * c - x2 * s, x1 * s + x2 * c], dim=-1).flatten(-2).to(x.dtype)


class WanAttention(nn.Module):
    """What self- and cross-attention share (diffusers' ``WanAttention``): heads split over TP, QK RMSNorm
    across heads, and the row-parallel output projection. Subclasses add their Q/K/V projections and
    what they attend over."""

    def __init__(self, cfg: WanDiTConfig, dtype: torch.dtype, tp: ProcessGroupHandle):
        super().__init__()
        self.cfg = cfg
        self.heads = check_divisible("num_attention_heads", cfg.num_attention_heads, tp.world_size)
        local = self.heads * cfg.attention_head_dim
        self.norm_q = RMSNormAcrossHeads(cfg, local, dtype, tp)
        self.norm_k = RMSNormAcrossHeads(cfg, local, dtype, tp)
        self.to_out = RowParallelLinear(cfg.inner_dim, cfg.inner_dim, bias=True, dtype=dtype, tp=tp)

    @staticmethod
    def checkpoint_keys(prefix: str) -> KeyDict:
        return {
            "norm_q.weight": f"{prefix}norm_q.weight",
            "norm_k.weight": f"{prefix}norm_k.weight",
            "to_out.weight": f"{prefix}to_out.0.weight",
            "to_out.bias": f"{prefix}to_out.0.bias",
        }

    def split_heads(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Normalise the projected ``q`` and ``k`` across heads, then view all three as ``[B, T, H, D]``."""
        q, k = self.norm_q(q), self.norm_k(k)
        shape = (self.heads, self.cfg.attention_head_dim)
        return q.unflatten(-1, shape), k.unflatten(-1, shape), v.unflatten(-1, shape)


class WanSelfAttention(WanAttention):
    """Fused QKV, 3D RoPE on Q and K, and attention over the whole video (CP-aware: ring or gathered K/V)."""

    def __init__(self, cfg: WanDiTConfig, dtype: torch.dtype, tp: ProcessGroupHandle, cp: ProcessGroupHandle):
        super().__init__(cfg, dtype, tp)
        self.cp = cp
        dim = cfg.inner_dim
        self.to_qkv = MergedColumnParallelLinear(dim, [dim, dim, dim], bias=True, dtype=dtype, tp=tp)

    @staticmethod
    def checkpoint_keys(prefix: str) -> KeyDict:
        return {
            "to_qkv.weight": [f"{prefix}to_{p}.weight" for p in "qkv"],
            "to_qkv.bias": [f"{prefix}to_{p}.bias" for p in "qkv"],
            **WanAttention.checkpoint_keys(prefix),
        }

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        q, k, v = self.split_heads(*self.to_qkv(x).chunk(3, dim=-1))
        q, k = apply_rotary(q, *rope), apply_rotary(k, *rope)
        out = cp_self_attention(
            q,
            k,
            v,
            self.cp,
            scale=self.cfg.attention_head_dim**-0.5,
            enable_ring_attention=self.cfg.enable_ring_attention,
        )
        return self.to_out(out.flatten(2))


class WanCrossAttention(WanAttention):
    """Queries from the video tokens, fused K/V from the text; the text is never CP-split."""

    def __init__(self, cfg: WanDiTConfig, dtype: torch.dtype, tp: ProcessGroupHandle):
        super().__init__(cfg, dtype, tp)
        dim = cfg.inner_dim
        self.to_q = ColumnParallelLinear(dim, dim, bias=True, dtype=dtype, tp=tp)
        self.to_kv = MergedColumnParallelLinear(dim, [dim, dim], bias=True, dtype=dtype, tp=tp)

    @staticmethod
    def checkpoint_keys(prefix: str) -> KeyDict:
        return {
            "to_q.weight": f"{prefix}to_q.weight",
            "to_q.bias": f"{prefix}to_q.bias",
            "to_kv.weight": [f"{prefix}to_{p}.weight" for p in "kv"],
            "to_kv.bias": [f"{prefix}to_{p}.bias" for p in "kv"],
            **WanAttention.checkpoint_keys(prefix),
        }

    def forward(self, x: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        q, k, v = self.split_heads(self.to_q(x), *self.to_kv(context).chunk(2, dim=-1))
        out = attention(q, k, v, scale=self.cfg.attention_head_dim**-0.5)
        return self.to_out(out.flatten(2))


class WanBlock(nn.Module):
    """Modulated self-attention, cross-attention, modulated GELU-tanh FFN (``WanTransformerBlock``)."""

    def __init__(self, cfg: WanDiTConfig, dtype: torch.dtype, tp: ProcessGroupHandle, cp: ProcessGroupHandle):
        super().__init__()
        self.cfg = cfg
        dim = cfg.inner_dim
        # diffusers keeps norm1..3 in float32 whatever the model dtype; norm1 and norm3 have no weights.
        self.norm1 = LayerNorm(dim, cfg.eps, affine=False)
        self.attn1 = WanSelfAttention(cfg, dtype, tp, cp)
        self.norm2 = LayerNorm(dim, cfg.eps) if cfg.cross_attn_norm else None
        self.attn2 = WanCrossAttention(cfg, dtype, tp)
        self.norm3 = LayerNorm(dim, cfg.eps, affine=False)
        check_divisible("ffn_dim", cfg.ffn_dim, tp.world_size)  # names the config field in the error
        self.ffn_up = ColumnParallelLinear(dim, cfg.ffn_dim, bias=True, dtype=dtype, tp=tp)
        self.ffn_down = RowParallelLinear(cfg.ffn_dim, dim, bias=True, dtype=dtype, tp=tp)
        self.scale_shift_table = nn.Parameter(
            torch.empty(1, 6, dim, dtype=torch.float32), requires_grad=False
        )

    def checkpoint_keys(self, prefix: str) -> KeyDict:
        keys: KeyDict = {
            **prefixed("attn1.", WanSelfAttention.checkpoint_keys(f"{prefix}attn1.")),
            **prefixed("attn2.", WanCrossAttention.checkpoint_keys(f"{prefix}attn2.")),
            "ffn_up.weight": f"{prefix}ffn.net.0.proj.weight",
            "ffn_up.bias": f"{prefix}ffn.net.0.proj.bias",
            "ffn_down.weight": f"{prefix}ffn.net.2.weight",
            "ffn_down.bias": f"{prefix}ffn.net.2.bias",
            "scale_shift_table": f"{prefix}scale_shift_table",
        }
        if self.norm2 is not None:
            keys["norm2.weight"] = f"{prefix}norm2.weight"
            keys["norm2.bias"] = f"{prefix}norm2.bias"
        return keys

    def ffn(self, x: torch.Tensor) -> torch.Tensor:
        return self.ffn_down(gelu_tanh(self.ffn_up(x)))

    def forward(
        self,
        x: torch.Tensor,
        context: torch.Tensor,
        temb: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
    ) -> torch.Tensor:
        shift, scale, gate, c_shift, c_scale, c_gate = (self.scale_shift_table + temb.float()).chunk(6, dim=1)
        h = (self.norm1(x.float()) * (1 + scale) + shift).to(x.dtype)
        x = (x.float() + self.attn1(h, rope) * gate).to(x.dtype)
        h = x if self.norm2 is None else self.norm2(x.float()).to(x.dtype)
        x = x + self.attn2(h, context)
        h = (self.norm3(x.float()) * (1 + c_scale) + c_shift).to(x.dtype)
        return (x.float() + self.ffn(h).float() * c_gate).to(x.dtype)


class WanDiT(nn.Module):
    """``WanTransformer3DModel``: ``forward(hidden_states [B, C, F, H, W], timestep [B], context [B, L, text_dim])``
    returns the flow prediction ``[B, C_out, F, H, W]`` in the model dtype."""

    def __init__(self, cfg: WanDiTConfig, *, dtype: torch.dtype = torch.float32):
        super().__init__()
        # The process groups are resolved here, at construction, so compiled collectives can find them.
        self.tp, self.cp = get_tp_group(), get_cp_group()
        self.config = cfg
        self.dtype = dtype
        dim, tp = cfg.inner_dim, self.tp
        self.rope = WanRotaryPosEmbed(cfg.attention_head_dim, cfg.patch_size, cfg.rope_max_seq_len)
        self.patch_embedding = nn.Conv3d(
            cfg.in_channels, dim, cfg.patch_size, stride=cfg.patch_size, dtype=dtype
        ).requires_grad_(False)
        # diffusers keeps the time embedder in float32.
        self.time_in = ReplicatedLinear(cfg.freq_dim, dim, bias=True, dtype=torch.float32)
        self.time_out = ReplicatedLinear(dim, dim, bias=True, dtype=torch.float32)
        # Every block's modulation, split over TP and gathered (``time_embedding``).
        self.time_proj = ColumnParallelLinear(dim, 6 * dim, bias=True, dtype=dtype, tp=tp)
        self.text_in = ColumnParallelLinear(cfg.text_dim, dim, bias=True, dtype=dtype, tp=tp)
        self.text_out = RowParallelLinear(dim, dim, bias=True, dtype=dtype, tp=tp)
        self.blocks = nn.ModuleList([WanBlock(cfg, dtype, tp, self.cp) for _ in range(cfg.num_layers)])
        self.norm_out = LayerNorm(dim, cfg.eps, affine=False)
        self.scale_shift_table = nn.Parameter(
            torch.empty(1, 2, dim, dtype=torch.float32), requires_grad=False
        )
        self.proj_out = ReplicatedLinear(
            dim, cfg.out_channels * math.prod(cfg.patch_size), bias=True, dtype=dtype
        )
        self._graphs: dict[Any, Callable[..., Any]] = {}

    def checkpoint_keys(self) -> KeyDict:
        keys: KeyDict = {
            "patch_embedding.weight": "patch_embedding.weight",
            "patch_embedding.bias": "patch_embedding.bias",
            "time_in.weight": "condition_embedder.time_embedder.linear_1.weight",
            "time_in.bias": "condition_embedder.time_embedder.linear_1.bias",
            "time_out.weight": "condition_embedder.time_embedder.linear_2.weight",
            "time_out.bias": "condition_embedder.time_embedder.linear_2.bias",
            "time_proj.weight": "condition_embedder.time_proj.weight",
            "time_proj.bias": "condition_embedder.time_proj.bias",
            "text_in.weight": "condition_embedder.text_embedder.linear_1.weight",
            "text_in.bias": "condition_embedder.text_embedder.linear_1.bias",
            "text_out.weight": "condition_embedder.text_embedder.linear_2.weight",
            "text_out.bias": "condition_embedder.text_embedder.linear_2.bias",
            "scale_shift_table": "scale_shift_table",
            "proj_out.weight": "proj_out.weight",
            "proj_out.bias": "proj_out.bias",
        }
        for i, block in enumerate(self.blocks):
            keys.update(prefixed(f"blocks.{i}.", block.checkpoint_keys(f"blocks.{i}.")))
        return keys

    @classmethod
    def from_pretrained(
        cls, path: str | Path, *, dtype: torch.dtype = torch.float32, **overrides: Any
    ) -> WanDiT:
        """Build from a diffusers ``transformer`` folder and load this rank's weights."""
        model = cls(WanDiTConfig.from_pretrained(path, **overrides), dtype=dtype)
        model.load_weights(path)
        return model

    def load_weights(self, path: str | Path) -> None:
        keys, stem = self.checkpoint_keys(), "diffusion_pytorch_model"  # diffusers' weights file
        ignore = ("*norm_added_q*",)  # a key some exports carry and diffusers ignores on load
        load_checkpoint_dir(self, path, keys, self.tp, stem=stem, ignore=ignore, progress=False)

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    def check_input_shape(self, shape: tuple[int, ...]) -> None:
        """Refuse latents the patch grid or the CP split cannot take, naming the dimension."""
        cfg = self.config
        if len(shape) != 5 or shape[1] != cfg.in_channels:
            raise InputError(
                f"hidden_states: expected [batch, {cfg.in_channels}, frames, height, width], got {list(shape)}"
            )
        tokens = 1
        for name, size, patch in zip(("frames", "height", "width"), shape[2:], cfg.patch_size, strict=True):
            if size % patch:
                raise InputError(f"latent {name}={size} is not divisible by the DiT patch size {patch}")
            tokens *= size // patch
        if tokens % self.cp.world_size:
            raise InputError(
                f"context parallelism: the video's {tokens} latent tokens are not divisible by "
                f"cp_degree={self.cp.world_size}; pick a size whose token count the CP degree divides"
            )

    def time_embedding(self, timestep: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """``temb [B, dim]`` (the output modulation) and ``[B, 6, dim]`` (every block's modulation)."""
        sinusoid = get_timestep_embedding(
            timestep, self.config.freq_dim, flip_sin_to_cos=True, downscale_freq_shift=0
        )
        temb = self.time_out(F.silu(self.time_in(sinusoid.float()))).to(dtype)
        proj = self.time_proj(F.silu(temb))
        return temb, self.tp.all_gather(proj, dim=-1).unflatten(1, (6, -1))

    def text_embedding(self, context: torch.Tensor) -> torch.Tensor:
        return self.text_out(gelu_tanh(self.text_in(context)))

    def forward(
        self,
        hidden_states: torch.Tensor,
        timestep: torch.Tensor,
        encoder_hidden_states: torch.Tensor,
        cp_rank: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The compiled graph for these input shapes if there is one, else the eager math (``run``)."""
        rank = self.cp.rank_tensor() if cp_rank is None else cp_rank
        args = (hidden_states, timestep, encoder_hidden_states)
        graph = self._graphs.get(signature(args))
        if graph is None:
            return self.run(*args, rank)
        out = graph(*args, rank)
        return out[0] if isinstance(out, list | tuple) else out

    def run(
        self,
        hidden_states: torch.Tensor,
        timestep: torch.Tensor,
        encoder_hidden_states: torch.Tensor,
        cp_rank: torch.Tensor,
    ) -> torch.Tensor:
        """The DiT's math. ``cp_rank`` (0-d int64) picks this rank's token chunk: an input, not a
        constant, so every CP rank runs the same graph."""
        self.check_input_shape(tuple(hidden_states.shape))
        cfg = self.config
        b, _, f, h, w = hidden_states.shape
        pt, ph, pw = cfg.patch_size
        grid = (f // pt, h // ph, w // pw)
        cos, sin = (t.float() for t in self.rope(hidden_states))
        x = self.patch_embedding(hidden_states)
        x = x.flatten(2).transpose(1, 2).contiguous()
        temb, block_temb = self.time_embedding(timestep, encoder_hidden_states.dtype)
        context = self.text_embedding(encoder_hidden_states)

        if self.cp.world_size > 1:
            x, cos, sin = (split_sequence(t, self.cp, cp_rank) for t in (x, cos, sin))
        for block in self.blocks:
            x = block(x, context, block_temb, (cos, sin))
        x = gather_sequence(x, self.cp)

        shift, scale = (self.scale_shift_table + temb.unsqueeze(1)).chunk(2, dim=1)
        x = (self.norm_out(x.float()) * (1 + scale) + shift).to(x.dtype)
        x = self.proj_out(x)
        x = x.reshape(b, *grid, pt, ph, pw, -1).permute(0, 7, 1, 4, 2, 5, 3, 6)
        return x.flatten(6, 7).flatten(4, 5).flatten(2, 3)


class DiTGraph(nn.Module):
    """The DiT's math as one capturable module (its compiled artifact binds these weights by name)."""

    def __init__(self, dit: WanDiT):
        super().__init__()
        self.dit = dit

    def forward(self, hidden_states, timestep, encoder_hidden_states, cp_rank) -> torch.Tensor:
        return self.dit.run(hidden_states, timestep, encoder_hidden_states, cp_rank)


def dit_example_inputs(
    cfg: WanDiTConfig,
    *,
    batch_size: int,
    latent_shape: tuple[int, int, int],
    text_len: int,
    dtype: torch.dtype,
) -> tuple[torch.Tensor, ...]:
    """What the pipeline calls an expert with: latents ``[B, C, F', H', W']`` in the model dtype, the
    scheduler's int64 timesteps ``[B]``, the text ``[B, L, text_dim]`` and the CP rank."""
    return (
        torch.zeros(batch_size, cfg.in_channels, *latent_shape, dtype=dtype),
        torch.zeros(batch_size, dtype=torch.int64),
        torch.zeros(batch_size, text_len, cfg.text_dim, dtype=dtype),
        torch.zeros((), dtype=torch.int64),
    )


def dit_component_graph(
    cfg: WanDiTConfig,
    *,
    model_name: str,
    batch_size: int,
    latent_shape: tuple[int, int, int],
    text_len: int,
    dtype: torch.dtype,
    layout: ParallelLayout | None = None,
) -> ComponentGraph:
    """One expert's graph for one video size, described without building it (``build`` makes the module
    from ``cfg`` with uninitialised weights, in the tracing mesh)."""
    args = dit_example_inputs(
        cfg, batch_size=batch_size, latent_shape=latent_shape, text_len=text_len, dtype=dtype
    )

    def build() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
        return DiTGraph(WanDiT(cfg, dtype=dtype)), args

    config = dataclasses.asdict(cfg)
    return ComponentGraph(
        model_name=model_name,
        graph="denoise",
        package="trnmodels.wan22",
        model_config=config,
        inputs=signature(args[:3]),
        dtype=str(dtype).removeprefix("torch."),
        build=build,
        layout=layout or get_parallel_layout(),
    )


def compile_dit(
    dit: WanDiT,
    *,
    model_name: str,
    batch_size: int,
    latent_shape: tuple[int, int, int],
    text_len: int,
    cache_dir: str | Path | None = None,
    on_result: Callable[[ComponentResult], None] | None = None,
) -> list[ComponentResult]:
    """Compile (or find in the cache) ``dit``'s graph for one video size and use it from then on."""
    graph = dit_component_graph(
        dit.config,
        model_name=model_name,
        batch_size=batch_size,
        latent_shape=latent_shape,
        text_len=text_len,
        dtype=dit.dtype,
    )
    results = compile_components([graph], cache_dir, on_result)
    loaded = load_component_graph(graph, DiTGraph(dit), cache_dir)
    if loaded is not None:
        dit._graphs[graph.inputs] = loaded
    return results
