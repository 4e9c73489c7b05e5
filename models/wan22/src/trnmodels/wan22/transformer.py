"""The Wan2.2 DiT (diffusers' ``WanTransformer3DModel``, A14B configs): raw parameters, TP and CP.

Every matmul weight is a raw parameter carrying its TP weight loader (declared beside the layer that
splits it); ``checkpoint_keys`` names the diffusers key(s) of every parameter, a fused QKV mapping to a
list. Attention heads, the FFN width and the text/time projections are split over TP; the patch
embedding, the output head and the modulation tables are replicated. With context parallelism the token
sequence is split over the CP group after the patch embedding and gathered before the output head.

Pure math comes from diffusers: the 3D RoPE tables (``WanRotaryPosEmbed``, buffers only) and the
sinusoidal timestep embedding. Norms and modulation run in float32 where diffusers keeps them in float32,
so BF16 rounds where the reference rounds. Shapes are static: one graph per video size.
"""

from __future__ import annotations

import dataclasses
import json
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

from trnmodels.core.diffusion import cp_self_attention, gather_sequence, split_sequence
from trnmodels.core.diffusion.compile import (
    ComponentGraph,
    ComponentResult,
    compile_components,
    load_component_graph,
    signature,
)
from trnmodels.core.errors import ConfigError, InputError
from trnmodels.core.ops import attention, layer_norm
from trnmodels.core.parallel import (
    ParallelLayout,
    ProcessGroupHandle,
    check_divisible,
    get_cp_group,
    get_parallel_layout,
    get_tp_group,
)
from trnmodels.core.weights import (
    SafetensorsCheckpoint,
    concat_sharded,
    load_parameters,
    prefixed,
    set_weight_loader,
    sharded,
)

KeyDict = dict[str, str | list[str]]


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
        return cls.from_dict({**json.loads(file.read_text()), **overrides}, str(file))


def _param(*shape: int, dtype: torch.dtype) -> nn.Parameter:
    return nn.Parameter(torch.empty(*shape, dtype=dtype), requires_grad=False)


def _column(out_features: int, in_features: int, tp: ProcessGroupHandle, dtype: torch.dtype, what: str):
    """A column-split weight and bias (output features split over TP)."""
    rows = check_divisible(what, out_features, tp.world_size)
    w, b = _param(rows, in_features, dtype=dtype), _param(rows, dtype=dtype)
    set_weight_loader(w, sharded(0))
    set_weight_loader(b, sharded(0))
    return w, b


def _row(out_features: int, in_features: int, tp: ProcessGroupHandle, dtype: torch.dtype, what: str):
    """A row-split weight (input features split) and its replicated bias, added once after the reduce."""
    w = _param(out_features, check_divisible(what, in_features, tp.world_size), dtype=dtype)
    set_weight_loader(w, sharded(1))
    return w, _param(out_features, dtype=dtype)


def rms_norm_across_heads(
    x: torch.Tensor, weight: torch.Tensor, eps: float, tp: ProcessGroupHandle, full_dim: int
) -> torch.Tensor:
    """RMSNorm over all heads' features (``rms_norm_across_heads``) when TP holds only some heads:
    the sum of squares is all-reduced, so each rank normalises by the statistic of the whole vector."""
    xf = x.float()
    sumsq = tp.all_reduce(xf.pow(2).sum(-1, keepdim=True))
    return (xf * torch.rsqrt(sumsq / full_dim + eps) * weight.float()).to(x.dtype)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Wan's interleaved-pair rotation of ``x [B, T, H, D]`` by the tables ``[1, T, 1, D]``."""
    x1, x2 = x.float().unflatten(-1, (-1, 2)).unbind(-1)
    c, s = cos[..., 0::2], sin[..., 1::2]
    return torch.stack([x1 * c - x2 * s, x1 * s + x2 * c], dim=-1).flatten(-2).to(x.dtype)


class WanSelfAttention(nn.Module):
    """Fused QKV (heads split over TP), QK RMSNorm across heads, 3D RoPE, CP-aware attention."""

    def __init__(self, cfg: WanDiTConfig, dtype: torch.dtype, tp: ProcessGroupHandle, cp: ProcessGroupHandle):
        super().__init__()
        self.tp, self.cp, self.cfg = tp, cp, cfg
        dim = cfg.inner_dim
        self.heads = check_divisible("num_attention_heads", cfg.num_attention_heads, tp.world_size)
        local = self.heads * cfg.attention_head_dim
        self.qkv_weight = _param(3 * local, dim, dtype=dtype)
        self.qkv_bias = _param(3 * local, dtype=dtype)
        set_weight_loader(self.qkv_weight, concat_sharded(0))
        set_weight_loader(self.qkv_bias, concat_sharded(0))
        self.norm_q_weight = _param(local, dtype=dtype)
        self.norm_k_weight = _param(local, dtype=dtype)
        set_weight_loader(self.norm_q_weight, sharded(0))
        set_weight_loader(self.norm_k_weight, sharded(0))
        self.out_weight, self.out_bias = _row(dim, dim, tp, dtype, "inner_dim")

    @staticmethod
    def checkpoint_keys(prefix: str) -> KeyDict:
        return {
            "qkv_weight": [f"{prefix}to_{p}.weight" for p in "qkv"],
            "qkv_bias": [f"{prefix}to_{p}.bias" for p in "qkv"],
            "norm_q_weight": f"{prefix}norm_q.weight",
            "norm_k_weight": f"{prefix}norm_k.weight",
            "out_weight": f"{prefix}to_out.0.weight",
            "out_bias": f"{prefix}to_out.0.bias",
        }

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        cfg = self.cfg
        q, k, v = F.linear(x, self.qkv_weight, self.qkv_bias).chunk(3, dim=-1)
        q = rms_norm_across_heads(q, self.norm_q_weight, cfg.eps, self.tp, cfg.inner_dim)
        k = rms_norm_across_heads(k, self.norm_k_weight, cfg.eps, self.tp, cfg.inner_dim)
        q, k, v = (t.unflatten(-1, (self.heads, cfg.attention_head_dim)) for t in (q, k, v))
        q, k = apply_rotary(q, *rope), apply_rotary(k, *rope)
        out = cp_self_attention(
            q,
            k,
            v,
            self.cp,
            scale=cfg.attention_head_dim**-0.5,
            enable_ring_attention=cfg.enable_ring_attention,
        )
        out = self.tp.all_reduce(F.linear(out.flatten(2), self.out_weight))
        return out + self.out_bias


class WanCrossAttention(nn.Module):
    """Queries from the video tokens, fused K/V from the text; the text is never CP-split."""

    def __init__(self, cfg: WanDiTConfig, dtype: torch.dtype, tp: ProcessGroupHandle):
        super().__init__()
        self.tp, self.cfg = tp, cfg
        dim = cfg.inner_dim
        self.heads = check_divisible("num_attention_heads", cfg.num_attention_heads, tp.world_size)
        local = self.heads * cfg.attention_head_dim
        self.q_weight, self.q_bias = _column(dim, dim, tp, dtype, "inner_dim")
        self.kv_weight = _param(2 * local, dim, dtype=dtype)
        self.kv_bias = _param(2 * local, dtype=dtype)
        set_weight_loader(self.kv_weight, concat_sharded(0))
        set_weight_loader(self.kv_bias, concat_sharded(0))
        self.norm_q_weight = _param(local, dtype=dtype)
        self.norm_k_weight = _param(local, dtype=dtype)
        set_weight_loader(self.norm_q_weight, sharded(0))
        set_weight_loader(self.norm_k_weight, sharded(0))
        self.out_weight, self.out_bias = _row(dim, dim, tp, dtype, "inner_dim")

    @staticmethod
    def checkpoint_keys(prefix: str) -> KeyDict:
        return {
            "q_weight": f"{prefix}to_q.weight",
            "q_bias": f"{prefix}to_q.bias",
            "kv_weight": [f"{prefix}to_{p}.weight" for p in "kv"],
            "kv_bias": [f"{prefix}to_{p}.bias" for p in "kv"],
            "norm_q_weight": f"{prefix}norm_q.weight",
            "norm_k_weight": f"{prefix}norm_k.weight",
            "out_weight": f"{prefix}to_out.0.weight",
            "out_bias": f"{prefix}to_out.0.bias",
        }

    def forward(self, x: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        cfg = self.cfg
        q = F.linear(x, self.q_weight, self.q_bias)
        k, v = F.linear(context, self.kv_weight, self.kv_bias).chunk(2, dim=-1)
        q = rms_norm_across_heads(q, self.norm_q_weight, cfg.eps, self.tp, cfg.inner_dim)
        k = rms_norm_across_heads(k, self.norm_k_weight, cfg.eps, self.tp, cfg.inner_dim)
        q, k, v = (t.unflatten(-1, (self.heads, cfg.attention_head_dim)) for t in (q, k, v))
        out = attention(q, k, v, scale=cfg.attention_head_dim**-0.5)
        out = self.tp.all_reduce(F.linear(out.flatten(2), self.out_weight))
        return out + self.out_bias


class WanBlock(nn.Module):
    """Modulated self-attention, cross-attention, modulated GELU-tanh FFN (``WanTransformerBlock``)."""

    def __init__(self, cfg: WanDiTConfig, dtype: torch.dtype, tp: ProcessGroupHandle, cp: ProcessGroupHandle):
        super().__init__()
        self.tp, self.cfg = tp, cfg
        dim = cfg.inner_dim
        self.attn1 = WanSelfAttention(cfg, dtype, tp, cp)
        self.attn2 = WanCrossAttention(cfg, dtype, tp)
        if cfg.cross_attn_norm:
            # diffusers keeps norm1..3 in float32 whatever the model dtype.
            self.norm2_weight = _param(dim, dtype=torch.float32)
            self.norm2_bias = _param(dim, dtype=torch.float32)
        self.ffn_up_weight, self.ffn_up_bias = _column(cfg.ffn_dim, dim, tp, dtype, "ffn_dim")
        self.ffn_down_weight, self.ffn_down_bias = _row(dim, cfg.ffn_dim, tp, dtype, "ffn_dim")
        self.scale_shift_table = _param(1, 6, dim, dtype=torch.float32)

    def checkpoint_keys(self, prefix: str) -> KeyDict:
        keys: KeyDict = {
            **prefixed("attn1.", WanSelfAttention.checkpoint_keys(f"{prefix}attn1.")),
            **prefixed("attn2.", WanCrossAttention.checkpoint_keys(f"{prefix}attn2.")),
            "ffn_up_weight": f"{prefix}ffn.net.0.proj.weight",
            "ffn_up_bias": f"{prefix}ffn.net.0.proj.bias",
            "ffn_down_weight": f"{prefix}ffn.net.2.weight",
            "ffn_down_bias": f"{prefix}ffn.net.2.bias",
            "scale_shift_table": f"{prefix}scale_shift_table",
        }
        if self.cfg.cross_attn_norm:
            keys["norm2_weight"] = f"{prefix}norm2.weight"
            keys["norm2_bias"] = f"{prefix}norm2.bias"
        return keys

    def ffn(self, x: torch.Tensor) -> torch.Tensor:
        h = F.gelu(F.linear(x, self.ffn_up_weight, self.ffn_up_bias), approximate="tanh")
        return self.tp.all_reduce(F.linear(h, self.ffn_down_weight)) + self.ffn_down_bias

    def forward(
        self,
        x: torch.Tensor,
        context: torch.Tensor,
        temb: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
    ) -> torch.Tensor:
        eps = self.cfg.eps
        shift, scale, gate, c_shift, c_scale, c_gate = (self.scale_shift_table + temb.float()).chunk(6, dim=1)
        h = (layer_norm(x.float(), None, None, eps) * (1 + scale) + shift).to(x.dtype)
        x = (x.float() + self.attn1(h, rope) * gate).to(x.dtype)
        if self.cfg.cross_attn_norm:
            h = layer_norm(x.float(), self.norm2_weight, self.norm2_bias, eps).to(x.dtype)
        else:
            h = x
        x = x + self.attn2(h, context)
        h = (layer_norm(x.float(), None, None, eps) * (1 + c_scale) + c_shift).to(x.dtype)
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
        pt, ph, pw = cfg.patch_size
        self.rope = WanRotaryPosEmbed(cfg.attention_head_dim, cfg.patch_size, cfg.rope_max_seq_len)
        self.patch_weight = _param(dim, cfg.in_channels, pt, ph, pw, dtype=dtype)
        self.patch_bias = _param(dim, dtype=dtype)
        # diffusers keeps the time embedder in float32.
        self.time_in_weight = _param(dim, cfg.freq_dim, dtype=torch.float32)
        self.time_in_bias = _param(dim, dtype=torch.float32)
        self.time_out_weight = _param(dim, dim, dtype=torch.float32)
        self.time_out_bias = _param(dim, dtype=torch.float32)
        self.time_proj_weight, self.time_proj_bias = _column(6 * dim, dim, tp, dtype, "6 * inner_dim")
        self.text_in_weight, self.text_in_bias = _column(dim, cfg.text_dim, tp, dtype, "inner_dim")
        self.text_out_weight, self.text_out_bias = _row(dim, dim, tp, dtype, "inner_dim")
        self.blocks = nn.ModuleList([WanBlock(cfg, dtype, tp, self.cp) for _ in range(cfg.num_layers)])
        self.scale_shift_table = _param(1, 2, dim, dtype=torch.float32)
        self.proj_out_weight = _param(cfg.out_channels * math.prod(cfg.patch_size), dim, dtype=dtype)
        self.proj_out_bias = _param(cfg.out_channels * math.prod(cfg.patch_size), dtype=dtype)
        self._graphs: dict[Any, Callable[..., Any]] = {}

    def checkpoint_keys(self) -> KeyDict:
        keys: KeyDict = {
            "patch_weight": "patch_embedding.weight",
            "patch_bias": "patch_embedding.bias",
            "time_in_weight": "condition_embedder.time_embedder.linear_1.weight",
            "time_in_bias": "condition_embedder.time_embedder.linear_1.bias",
            "time_out_weight": "condition_embedder.time_embedder.linear_2.weight",
            "time_out_bias": "condition_embedder.time_embedder.linear_2.bias",
            "time_proj_weight": "condition_embedder.time_proj.weight",
            "time_proj_bias": "condition_embedder.time_proj.bias",
            "text_in_weight": "condition_embedder.text_embedder.linear_1.weight",
            "text_in_bias": "condition_embedder.text_embedder.linear_1.bias",
            "text_out_weight": "condition_embedder.text_embedder.linear_2.weight",
            "text_out_bias": "condition_embedder.text_embedder.linear_2.bias",
            "scale_shift_table": "scale_shift_table",
            "proj_out_weight": "proj_out.weight",
            "proj_out_bias": "proj_out.bias",
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
        with SafetensorsCheckpoint(path, stem="diffusion_pytorch_model") as checkpoint:
            load_parameters(
                self,
                checkpoint,
                self.checkpoint_keys(),
                rank=self.tp.rank,
                world_size=self.tp.world_size,
                # norm_added_q: a key some exports carry and diffusers ignores on load.
                ignore=("*norm_added_q*",),
                progress=False,
            )

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
        temb = F.linear(
            F.silu(F.linear(sinusoid.float(), self.time_in_weight, self.time_in_bias)),
            self.time_out_weight,
            self.time_out_bias,
        ).to(dtype)
        proj = F.linear(F.silu(temb), self.time_proj_weight, self.time_proj_bias)
        return temb, self.tp.all_gather(proj, dim=-1).unflatten(1, (6, -1))

    def text_embedding(self, context: torch.Tensor) -> torch.Tensor:
        h = F.gelu(F.linear(context, self.text_in_weight, self.text_in_bias), approximate="tanh")
        return self.tp.all_reduce(F.linear(h, self.text_out_weight)) + self.text_out_bias

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
        x = F.conv3d(hidden_states, self.patch_weight, self.patch_bias, stride=cfg.patch_size)
        x = x.flatten(2).transpose(1, 2).contiguous()
        temb, block_temb = self.time_embedding(timestep, encoder_hidden_states.dtype)
        context = self.text_embedding(encoder_hidden_states)

        if self.cp.world_size > 1:
            x, cos, sin = (split_sequence(t, self.cp, cp_rank) for t in (x, cos, sin))
        for block in self.blocks:
            x = block(x, context, block_temb, (cos, sin))
        x = gather_sequence(x, self.cp)

        shift, scale = (self.scale_shift_table + temb.unsqueeze(1)).chunk(2, dim=1)
        x = (layer_norm(x.float(), None, None, cfg.eps) * (1 + scale) + shift).to(x.dtype)
        x = F.linear(x, self.proj_out_weight, self.proj_out_bias)
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
