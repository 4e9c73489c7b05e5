"""gpt-oss (20b, 120b) on trnmodels core: the mixture-of-experts template.

What differs from the dense template (models/llama3): attention has learned sinks, biases and alternates
sliding-window and full layers (``layer_types``; the KV spec carries each layer's window); the MLP is a
top-k routed MoE whose experts are split over EP ranks and TP-split inside (core ``MoEExperts``); expert
weights come as BF16 tensors or MXFP4 blocks/scales, dequantized at load.

The rank arrives as one global tensor; ``PagedCausalLM.embed`` and ``MoEExperts`` turn it into the TP or
EP index, so one compiled graph serves every rank.
"""

from __future__ import annotations

import torch
from torch import nn

from trnmodels.core import ops
from trnmodels.core.causal_lm import PagedCausalLM
from trnmodels.core.modules import (
    ExpertsCheckpointFormat,
    MoEExperts,
    PreNormDecoderLayer,
    RMSNorm,
    RotaryEmbedding,
    SelfAttention,
)
from trnmodels.core.parallel import ReplicatedLinear
from trnmodels.core.weights import KeyDict

from .config import GptOssConfig


class GptOssMoE(nn.Module):
    """Router (linear with bias, softmax over the top-k logits) and the expert-parallel experts."""

    def __init__(self, cfg: GptOssConfig):
        super().__init__()
        self.top_k = cfg.experts_per_token
        self.mxfp4 = cfg.mxfp4
        # The router is tiny and every rank needs all of its logits: replicated.
        self.router = ReplicatedLinear(cfg.hidden_size, cfg.num_experts, bias=True, dtype=cfg.dtype)
        self.experts = MoEExperts(
            cfg.num_experts,
            cfg.hidden_size,
            cfg.intermediate_size,
            act="swiglu_clamped",
            bias=True,
            alpha=cfg.swiglu_alpha,
            limit=cfg.swiglu_limit,
            checkpoint_format=ExpertsCheckpointFormat(mxfp4=cfg.mxfp4),
            dtype=cfg.dtype,
        )

    def forward(self, x: torch.Tensor, rank: torch.Tensor) -> torch.Tensor:
        logits = self.router(x)
        weights, experts = ops.route(logits, self.top_k)
        return self.experts(x, weights, experts, rank)

    def checkpoint_keys(self, prefix: str) -> KeyDict:
        def weight(name: str) -> str | list[str]:
            stem = f"{prefix}experts.{name}"
            return [f"{stem}_blocks", f"{stem}_scales"] if self.mxfp4 else stem

        return {
            "router.weight": f"{prefix}router.weight",
            "router.bias": f"{prefix}router.bias",
            "experts.gate_up": weight("gate_up_proj"),
            "experts.gate_up_bias": f"{prefix}experts.gate_up_proj_bias",
            "experts.down": weight("down_proj"),
            "experts.down_bias": f"{prefix}experts.down_proj_bias",
        }


class GptOssDecoderLayer(PreNormDecoderLayer):
    def __init__(self, cfg: GptOssConfig, layer_idx: int):
        attn = SelfAttention.for_layer(cfg, layer_idx, sliding_window=cfg.window(layer_idx), sinks=True)
        # HF's GptOssRMSNorm scales in float32 and casts once (Llama's casts, then scales).
        super().__init__(cfg, attn, GptOssMoE(cfg), norm_scale_in_float32=True)


class GptOssForCausalLM(PagedCausalLM):
    def __init__(self, cfg: GptOssConfig):
        layers = (GptOssDecoderLayer(cfg, i) for i in range(cfg.num_layers))
        norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, scale_in_float32=True, dtype=cfg.dtype)
        super().__init__(cfg, layers, norm, rotary=RotaryEmbedding(cfg.rope))
