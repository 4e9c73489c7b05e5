"""Rotary position embeddings: default, llama3 scaling, YaRN, and partial or proportional rotary.

``RopeConfig`` reads a transformers config (``rope_parameters``, including the per-layer-type form);
``inv_freq`` turns it into frequencies once, at model build; ``cos_sin`` and ``apply_rope`` run in the
graph. The rotation is the half-split (NeoX) form that Llama, gpt-oss and Gemma checkpoints use.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from ..errors import ConfigError

ROPE_TYPES = ("default", "llama3", "yarn", "proportional")


@dataclass(frozen=True)
class RopeConfig:
    head_dim: int
    theta: float
    rope_type: str = "default"
    partial_rotary_factor: float = 1.0
    factor: float = 1.0
    low_freq_factor: float | None = None
    high_freq_factor: float | None = None
    original_max_position_embeddings: int | None = None
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    attention_factor: float | None = None
    mscale: float | None = None
    mscale_all_dim: float | None = None
    truncate: bool = True

    def __post_init__(self) -> None:
        if self.rope_type not in ROPE_TYPES:
            raise ConfigError(
                f"rope_parameters.rope_type: expected one of {ROPE_TYPES}, got {self.rope_type!r}"
            )
        needs = {
            "llama3": ("low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
            "yarn": ("original_max_position_embeddings",),
        }.get(self.rope_type, ())
        missing = [name for name in needs if getattr(self, name) is None]
        if missing:
            raise ConfigError(f"rope_parameters ({self.rope_type}): missing field(s) {', '.join(missing)}")

    @classmethod
    def from_hf(cls, config: Any, head_dim: int, layer_type: str | None = None) -> RopeConfig:
        """Build from a transformers config; ``layer_type`` selects a per-layer-type entry (Gemma)."""
        params = dict(getattr(config, "rope_parameters", None) or {})
        if layer_type is not None and layer_type in params:
            params = dict(params[layer_type])
        theta = params.get("rope_theta", getattr(config, "rope_theta", None))
        if theta is None:
            raise ConfigError("rope_parameters: missing field 'rope_theta'")
        partial = params.get("partial_rotary_factor", getattr(config, "partial_rotary_factor", None) or 1.0)
        factor = params.get("factor")
        if params.get("rope_type", "default") == "yarn" and factor is None:
            if "original_max_position_embeddings" not in params:
                raise ConfigError("rope_parameters (yarn): missing field(s) original_max_position_embeddings")
            factor = config.max_position_embeddings / params["original_max_position_embeddings"]
        return cls(
            head_dim=head_dim,
            theta=float(theta),
            rope_type=params.get("rope_type", "default"),
            partial_rotary_factor=float(partial),
            factor=float(factor if factor is not None else 1.0),
            low_freq_factor=params.get("low_freq_factor"),
            high_freq_factor=params.get("high_freq_factor"),
            original_max_position_embeddings=params.get("original_max_position_embeddings"),
            beta_fast=float(params.get("beta_fast") or 32.0),
            beta_slow=float(params.get("beta_slow") or 1.0),
            attention_factor=params.get("attention_factor"),
            mscale=params.get("mscale"),
            mscale_all_dim=params.get("mscale_all_dim"),
            truncate=bool(params.get("truncate", True)),
        )


def _base_inv_freq(theta: float, dim: int) -> torch.Tensor:
    return 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))


def _llama3(cfg: RopeConfig, inv_freq: torch.Tensor) -> torch.Tensor:
    # Long wavelengths are slowed by `factor`, short ones kept, and the band between is blended smoothly.
    old_len = cfg.original_max_position_embeddings
    low_wavelen = old_len / cfg.low_freq_factor
    high_wavelen = old_len / cfg.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / cfg.factor, inv_freq)
    smooth = (old_len / wavelen - cfg.low_freq_factor) / (cfg.high_freq_factor - cfg.low_freq_factor)
    blended = (1 - smooth) * scaled / cfg.factor + smooth * scaled
    is_medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(is_medium, blended, scaled)


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _yarn(cfg: RopeConfig, dim: int) -> tuple[torch.Tensor, float]:
    # Frequencies that rotate many times within the original context extrapolate; slow ones interpolate.
    def correction_dim(rotations: float) -> float:
        return (
            dim
            * math.log(cfg.original_max_position_embeddings / (rotations * 2 * math.pi))
            / (2 * math.log(cfg.theta))
        )

    low, high = correction_dim(cfg.beta_fast), correction_dim(cfg.beta_slow)
    if cfg.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    extrapolation = _base_inv_freq(cfg.theta, dim)
    inv_freq = extrapolation / cfg.factor * ramp + extrapolation * (1 - ramp)
    if cfg.attention_factor is not None:
        scaling = float(cfg.attention_factor)
    elif cfg.mscale and cfg.mscale_all_dim:
        scaling = _yarn_mscale(cfg.factor, cfg.mscale) / _yarn_mscale(cfg.factor, cfg.mscale_all_dim)
    else:
        scaling = _yarn_mscale(cfg.factor)
    return inv_freq, scaling


def inv_freq(cfg: RopeConfig) -> tuple[torch.Tensor, float]:
    """Inverse frequencies (length = rotary dim / 2) and the cos/sin scaling factor."""
    if cfg.rope_type == "proportional":
        # Gemma 4 full layers: the rotated angles use the full head_dim as denominator, the rest stay still.
        angles = int(cfg.partial_rotary_factor * cfg.head_dim // 2)
        rotated = 1.0 / (
            cfg.theta ** (torch.arange(0, 2 * angles, 2, dtype=torch.int64).float() / cfg.head_dim)
        )
        still = torch.zeros(cfg.head_dim // 2 - angles)
        return torch.cat([rotated, still]) / cfg.factor, 1.0
    dim = int(cfg.head_dim * cfg.partial_rotary_factor)
    if cfg.rope_type == "yarn":
        return _yarn(cfg, dim)
    base = _base_inv_freq(cfg.theta, dim)
    if cfg.rope_type == "llama3":
        return _llama3(cfg, base), 1.0
    return base, 1.0


def cos_sin(
    inv_freq: torch.Tensor, positions: torch.Tensor, scaling: float = 1.0, dtype: torch.dtype = torch.float32
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of shape ``[*positions.shape, rotary_dim]``, computed in float32 and cast once."""
    freqs = positions.float()[..., None] * inv_freq.float()
    emb = torch.cat([freqs, freqs], dim=-1)
    return (emb.cos() * scaling).to(dtype), (emb.sin() * scaling).to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` of shape ``[T, H, D]`` by ``cos``/``sin`` of shape ``[T, R]``, R ≤ D (partial rotary)."""
    rotary_dim = cos.shape[-1]
    cos, sin = cos[:, None, :], sin[:, None, :]
    if rotary_dim == x.shape[-1]:
        return x * cos + _rotate_half(x) * sin
    x_rot, x_pass = x[..., :rotary_dim], x[..., rotary_dim:]
    return torch.cat([x_rot * cos + _rotate_half(x_rot) * sin, x_pass], dim=-1)
