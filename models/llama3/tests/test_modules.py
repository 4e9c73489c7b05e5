"""Module level: each Llama block against its transformers twin with the same weights.

Weights reach our modules through our own key mappings and loaders (``load_from_hf_module``). FP32 must
match tightly; BF16 is judged three-way (our BF16 error relative to HF BF16's own error vs HF FP32).
"""

from __future__ import annotations

import pytest
import torch
from transformers.models.llama import modeling_llama as hf

from trnmodels.core.accuracy import assert_module_bf16_three_way, load_from_hf_module
from trnmodels.core.attention import AttentionMetadata
from trnmodels.core.decoder_config import DenseDecoderConfig
from trnmodels.core.kv_cache import allocate_kv_cache, slot_mapping
from trnmodels.core.modules import GatedMLP, RMSNorm, RotaryEmbedding, SelfAttention
from trnmodels.core.runtime_config import NeuronConfig
from trnmodels.llama3.model import LlamaDecoderLayer

from .conftest import hf_config
from .test_conformance import LLAMA3_ROPE

T = 19


def configs(dtype: torch.dtype):
    hf_cfg = hf_config(head_dim=16, rope_parameters=LLAMA3_ROPE, attention_bias=True)
    hf_cfg._attn_implementation = "eager"
    return hf_cfg, DenseDecoderConfig.from_configs(hf_cfg, NeuronConfig(dtype=dtype, block_size=4))


def prefill_metadata(module: torch.nn.Module, num_tokens: int, block_size: int = 4) -> AttentionMetadata:
    """Bind a fresh cache to every attention layer in ``module`` and describe one prefilled sequence."""
    from trnmodels.core.attention import bind_kv_caches, collect_kv_spec

    spec = collect_kv_spec(module, block_size)
    blocks = -(-num_tokens // block_size)
    bind_kv_caches(module, allocate_kv_cache(spec, blocks + 1))
    table = torch.arange(1, blocks + 1)
    return AttentionMetadata(
        slot_mapping=slot_mapping(table, torch.arange(num_tokens), block_size),
        seq_ids=torch.zeros(num_tokens, dtype=torch.int64),
    )


def causal_mask(n: int, dtype: torch.dtype) -> torch.Tensor:
    return torch.full((n, n), torch.finfo(dtype).min, dtype=dtype).triu(1)[None, None]


def hf_rope(hf_cfg, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return hf.LlamaRotaryEmbedding(hf_cfg)(x, torch.arange(T)[None])


def with_rope_and_cache(ours, cfg):
    """Run one of our attention-bearing blocks on ``x [1, T, hidden]`` as a single prefilled sequence."""
    rotary = RotaryEmbedding(cfg.rope)

    def run(x):
        cos, sin = rotary(torch.arange(T), x.dtype)
        return ours(x[0], cos, sin, prefill_metadata(ours, T))[None]

    return run


def attention_pair(hf_cfg, cfg):
    theirs = hf.LlamaAttention(hf_cfg, layer_idx=0).eval()
    ours = SelfAttention.for_layer(cfg, 0)
    load_from_hf_module(ours, theirs, ours.checkpoint_keys(""))

    def run_theirs(module, x):
        return module(x, hf_rope(hf_cfg, x), causal_mask(T, x.dtype))[0]

    return ours, theirs, with_rope_and_cache(ours, cfg), run_theirs


def mlp_pair(hf_cfg, cfg):
    theirs = hf.LlamaMLP(hf_config(mlp_bias=True)).eval()
    ours = GatedMLP(cfg.hidden_size, cfg.intermediate_size, "silu", bias=True, dtype=cfg.dtype)
    load_from_hf_module(ours, theirs, ours.checkpoint_keys(""))
    return ours, theirs, lambda x: ours(x), lambda m, x: m(x)


def norm_pair(hf_cfg, cfg):
    theirs = hf.LlamaRMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
    with torch.no_grad():
        theirs.weight.normal_(1.0, 0.2)
    ours = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype=cfg.dtype)
    load_from_hf_module(ours, theirs, {"weight": "weight"})
    return ours, theirs, lambda x: ours(x), lambda m, x: m(x)


def decoder_pair(hf_cfg, cfg):
    theirs = hf.LlamaDecoderLayer(hf_cfg, layer_idx=0).eval()
    with torch.no_grad():
        for name, p in theirs.named_parameters():
            if "norm" in name:
                p.normal_(1.0, 0.2)
    ours = LlamaDecoderLayer(cfg, 0)
    load_from_hf_module(ours, theirs, ours.checkpoint_keys(""))

    def run_theirs(module, x):
        return module(x, attention_mask=causal_mask(T, x.dtype), position_embeddings=hf_rope(hf_cfg, x))

    return ours, theirs, with_rope_and_cache(ours, cfg), run_theirs


PAIRS = {"attention": attention_pair, "mlp": mlp_pair, "rmsnorm": norm_pair, "decoder_layer": decoder_pair}


@pytest.mark.parametrize("block", PAIRS)
def test_fp32_matches_hf(block):
    torch.manual_seed(0)
    hf_cfg, cfg = configs(torch.float32)
    _, theirs, run_ours, run_theirs = PAIRS[block](hf_cfg, cfg)
    x = torch.randn(1, T, cfg.hidden_size)
    with torch.no_grad():
        torch.testing.assert_close(run_ours(x), run_theirs(theirs, x), atol=2e-6, rtol=1e-5)


@pytest.mark.parametrize("block", PAIRS)
def test_bf16_three_way(block):
    torch.manual_seed(0)
    hf_cfg, cfg = configs(torch.bfloat16)
    _, theirs, run_ours, run_theirs = PAIRS[block](hf_cfg, cfg)
    assert_module_bf16_three_way(run_ours, theirs, run_theirs, torch.randn(1, T, cfg.hidden_size), block)


def test_rope_matches_hf():
    hf_cfg, cfg = configs(torch.float32)
    positions = torch.tensor([0, 1, 5, 17, 100, 255])
    cos, sin = RotaryEmbedding(cfg.rope)(positions, torch.float32)
    hf_cos, hf_sin = hf.LlamaRotaryEmbedding(hf_cfg)(torch.zeros(1), positions[None])
    torch.testing.assert_close(cos, hf_cos[0])
    torch.testing.assert_close(sin, hf_sin[0])
