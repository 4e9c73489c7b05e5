"""Llama 3 (3.1, 3.2, 3.3) on trnmodels core: the dense-model template.

To port another dense model, copy this file and change what differs (see docs/porting.md). The model
sees flat, padded tokens and per-step attention metadata; the KV cache lives behind core's
``SelfAttention``; ``PagedCausalLM`` owns the embedding, head, the standard decoder forward and checkpoint
layout. The layers' parameter names are the checkpoint's (HF's; fused projections declare their sources),
so they need no key mapping of their own.
"""

from __future__ import annotations

from trnmodels.core.causal_lm import PagedCausalLM
from trnmodels.core.decoder_config import DenseDecoderConfig
from trnmodels.core.modules import GatedMLP, PreNormDecoderLayer, RotaryEmbedding, SelfAttention


class LlamaDecoderLayer(PreNormDecoderLayer):
    def __init__(self, cfg: DenseDecoderConfig, layer_idx: int):
        mlp = GatedMLP(cfg.hidden_size, cfg.intermediate_size, cfg.hidden_act, cfg.mlp_bias, dtype=cfg.dtype)
        super().__init__(cfg, SelfAttention.for_layer(cfg, layer_idx), mlp)


class LlamaForCausalLM(PagedCausalLM):
    def __init__(self, cfg: DenseDecoderConfig):
        layers = (LlamaDecoderLayer(cfg, i) for i in range(cfg.num_layers))
        super().__init__(cfg, layers, rotary=RotaryEmbedding(cfg.rope))

    def ignored_checkpoint_keys(self) -> tuple[str, ...]:
        # Older exports carry RoPE tables; they are recomputed from the config, never loaded.
        return ("*.rotary_emb.inv_freq",)
