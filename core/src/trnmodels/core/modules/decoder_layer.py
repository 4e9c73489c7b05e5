"""The pre-norm decoder block most LLMs share (Llama, Qwen, Mistral, gpt-oss): attention and MLP, each
behind an RMSNorm and added to the residual stream."""

from __future__ import annotations

from typing import Protocol

import torch
from torch import nn

from ..attention import AttentionMetadata
from ..weights import KeyDict, prefixed
from .norm import RMSNorm
from .self_attention import SelfAttention


class NormConfig(Protocol):
    hidden_size: int
    rms_norm_eps: float
    dtype: torch.dtype


class PreNormDecoderLayer(nn.Module):
    """``x + self_attn(norm(x))``, then ``x + mlp(norm(x), rank)``; parameter names are HF's.

    ``mlp`` is dense (``GatedMLP``, the same on every rank) or routed (it reads ``rank`` to pick its
    experts). Each sublayer declares its own checkpoint keys; the norms are stored at their own names.
    ``norm_scale_in_float32`` rounds the norms as gpt-oss does (scale, then cast) rather than as Llama does.
    """

    def __init__(
        self,
        cfg: NormConfig,
        self_attn: SelfAttention,
        mlp: nn.Module,
        *,
        norm_scale_in_float32: bool = False,
    ):
        super().__init__()
        norm = dict(dtype=cfg.dtype, scale_in_float32=norm_scale_in_float32)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, **norm)
        self.self_attn = self_attn
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, **norm)
        self.mlp = mlp

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        meta: AttentionMetadata,
        rank: torch.Tensor | None = None,  # a routed MLP needs it; a dense one is the same on every rank
    ) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, meta)
        return x + self.mlp(self.post_attention_layernorm(x), rank)

    def checkpoint_keys(self, prefix: str) -> KeyDict:
        return {
            "input_layernorm.weight": f"{prefix}input_layernorm.weight",
            "post_attention_layernorm.weight": f"{prefix}post_attention_layernorm.weight",
            **prefixed("self_attn.", self.self_attn.checkpoint_keys(f"{prefix}self_attn.")),
            **prefixed("mlp.", self.mlp.checkpoint_keys(f"{prefix}mlp.")),
        }
