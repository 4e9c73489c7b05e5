"""Module level: router, experts, MoE block, sink attention (full and sliding) and the decoder layer
against their transformers twins with the same weights, loaded through our own key mappings.

FP32 must match tightly; BF16 is judged three-way (our BF16 error relative to HF BF16's own error vs HF
FP32). The sequence is longer than the sliding window, so the window is exercised.
"""

from __future__ import annotations

import copy

import pytest
import torch
from transformers.models.gpt_oss import modeling_gpt_oss as hf

from trnmodels.core import ops
from trnmodels.core.accuracy import assert_module_bf16_three_way, load_from_hf_module
from trnmodels.core.attention import AttentionMetadata, bind_kv_caches, collect_kv_spec
from trnmodels.core.kv_cache import allocate_kv_cache, slot_mapping
from trnmodels.core.modules import MoEExperts, RotaryEmbedding, SelfAttention
from trnmodels.core.runtime_config import NeuronConfig
from trnmodels.gpt_oss.config import GptOssConfig
from trnmodels.gpt_oss.model import GptOssDecoderLayer, GptOssMoE

from .conftest import build_hf

T = 21  # > sliding_window (8)
SLIDING, FULL = 0, 1  # layer indices: gpt-oss alternates, sliding first


def configs(dtype: torch.dtype):
    hf_model = build_hf(seed=3)
    hf_cfg = hf_model.config
    return hf_model, hf_cfg, GptOssConfig.from_configs(hf_cfg, NeuronConfig(dtype=dtype, block_size=4))


def prefill_metadata(module: torch.nn.Module, num_tokens: int, block_size: int = 4) -> AttentionMetadata:
    spec = collect_kv_spec(module, block_size)
    blocks = -(-num_tokens // block_size)
    bind_kv_caches(module, allocate_kv_cache(spec, blocks + 1))
    return AttentionMetadata(
        slot_mapping=slot_mapping(torch.arange(1, blocks + 1), torch.arange(num_tokens), block_size),
        seq_ids=torch.zeros(num_tokens, dtype=torch.int64),
    )


def hf_mask(n: int, window: int | None, dtype: torch.dtype) -> torch.Tensor:
    """HF's eager mask: causal, and with a window only keys with ``q - k < window`` are visible."""
    q, k = torch.arange(n)[:, None], torch.arange(n)[None]
    visible = (k <= q) & ((q - k < window) if window else True)
    return torch.zeros(n, n, dtype=dtype).masked_fill(~visible, torch.finfo(dtype).min)[None, None]


def hf_rope(hf_cfg, x: torch.Tensor):
    return hf.GptOssRotaryEmbedding(hf_cfg)(x, torch.arange(T)[None])


def with_rope_and_cache(ours, cfg):
    rotary = RotaryEmbedding(cfg.rope)

    def run(x):
        cos, sin = rotary(torch.arange(T), x.dtype)
        meta = prefill_metadata(ours, T)
        if isinstance(ours, GptOssDecoderLayer):
            return ours(x[0], cos, sin, meta, torch.tensor(0))[None]
        return ours(x[0], cos, sin, meta)[None]

    return run


def attention_pair(layer_idx: int):
    def pair(hf_model, hf_cfg, cfg):
        theirs = hf_model.model.layers[layer_idx].self_attn
        ours = SelfAttention.for_layer(cfg, layer_idx, sliding_window=cfg.window(layer_idx), sinks=True)
        load_from_hf_module(ours, theirs, ours.checkpoint_keys(""))
        window = cfg.window(layer_idx)

        def run_theirs(module, x):
            return module(x, hf_rope(hf_cfg, x), hf_mask(T, window, x.dtype))[0]

        return theirs, with_rope_and_cache(ours, cfg), run_theirs

    return pair


def router_pair(hf_model, hf_cfg, cfg):
    theirs = hf_model.model.layers[0].mlp.router
    ours = GptOssMoE(cfg)
    load_from_hf_module(ours, hf_model.model.layers[0].mlp, ours.checkpoint_keys(""))

    def run_ours(x):
        logits = torch.nn.functional.linear(x[0], ours.router.weight, ours.router.bias)
        weights, experts = ops.route(logits, cfg.experts_per_token)
        # Dense [T, E] routing matrix: independent of the order top-k lists its picks in.
        return ops.combine_matrix(weights, experts, cfg.num_experts)[None]

    def run_theirs(module, x):
        _, scores, indices = module(x[0])
        dense = torch.zeros(T, cfg.num_experts, dtype=scores.dtype).scatter(1, indices, scores)
        return dense[None]

    return theirs, run_ours, run_theirs


def experts_pair(hf_model, hf_cfg, cfg):
    """The experts alone, fed the same (HF FP32) routing."""
    theirs = hf_model.model.layers[1].mlp.experts
    ours = MoEExperts(cfg.num_experts, cfg.hidden_size, cfg.intermediate_size, bias=True, dtype=cfg.dtype)
    keys = {"gate_up": "gate_up_proj", "gate_up_bias": "gate_up_proj_bias", "down": "down_proj"}
    load_from_hf_module(ours, theirs, {**keys, "down_bias": "down_proj_bias"})
    torch.manual_seed(1)
    logits = torch.randn(T, cfg.num_experts) * 4
    weights, experts = ops.route(logits, cfg.experts_per_token)

    def run_ours(x):
        return ours(x[0], weights.to(x.dtype), experts, torch.tensor(0))[None]

    def run_theirs(module, x):
        return module(x[0], experts, weights.to(x.dtype))[None]

    return theirs, run_ours, run_theirs


def moe_pair(hf_model, hf_cfg, cfg):
    theirs = hf_model.model.layers[1].mlp
    ours = GptOssMoE(cfg)
    load_from_hf_module(ours, theirs, ours.checkpoint_keys(""))
    return theirs, lambda x: ours(x[0], torch.tensor(0))[None], lambda m, x: m(x)[0]


def decoder_pair(layer_idx: int):
    def pair(hf_model, hf_cfg, cfg):
        theirs = hf_model.model.layers[layer_idx]
        ours = GptOssDecoderLayer(cfg, layer_idx)
        load_from_hf_module(ours, theirs, ours.checkpoint_keys(""))
        window = cfg.window(layer_idx)

        def run_theirs(module, x):
            return module(
                x, attention_mask=hf_mask(T, window, x.dtype), position_embeddings=hf_rope(hf_cfg, x)
            )

        return theirs, with_rope_and_cache(ours, cfg), run_theirs

    return pair


PAIRS = {
    "sink_attention_sliding": attention_pair(SLIDING),
    "sink_attention_full": attention_pair(FULL),
    "router": router_pair,
    "experts": experts_pair,
    "moe_block": moe_pair,
    "decoder_layer_sliding": decoder_pair(SLIDING),
    "decoder_layer_full": decoder_pair(FULL),
}


def test_layer_types_alternate_and_kv_spec_carries_windows():
    _, _, cfg = configs(torch.float32)
    assert cfg.layer_types == ("sliding_attention", "full_attention")
    assert [cfg.window(i) for i in range(2)] == [8, None]


@pytest.mark.parametrize("block", PAIRS)
def test_fp32_matches_hf(block):
    hf_model, hf_cfg, cfg = configs(torch.float32)
    theirs, run_ours, run_theirs = PAIRS[block](hf_model, hf_cfg, cfg)
    x = torch.randn(1, T, cfg.hidden_size, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(run_ours(x), run_theirs(theirs, x), atol=5e-6, rtol=1e-5)


@pytest.mark.parametrize("block", [b for b in PAIRS if b != "router"])
def test_bf16_three_way(block):
    hf_model, hf_cfg, cfg = configs(torch.bfloat16)
    theirs, run_ours, run_theirs = PAIRS[block](hf_model, hf_cfg, cfg)
    x = torch.randn(1, T, cfg.hidden_size, generator=torch.Generator().manual_seed(0))
    assert_module_bf16_three_way(run_ours, theirs, run_theirs, x, block)


def test_bf16_router_picks_match_hf():
    """In BF16 the routing weights are judged by the experts they pick, on well separated logits."""
    hf_model, hf_cfg, cfg = configs(torch.bfloat16)
    theirs, run_ours, run_theirs = router_pair(hf_model, hf_cfg, cfg)
    x = torch.randn(1, T, cfg.hidden_size, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ours = run_ours(x.bfloat16())
        ref = run_theirs(copy.deepcopy(theirs).to(torch.bfloat16), x.bfloat16())
    assert torch.equal(ours != 0, ref != 0)
    torch.testing.assert_close(ours.float(), ref.float(), atol=1e-2, rtol=0)


def test_only_chosen_experts_count():
    """Changing an expert no token chose leaves the output unchanged; changing a chosen one does not."""
    _, _, cfg = configs(torch.float32)
    experts_module = MoEExperts(cfg.num_experts, cfg.hidden_size, cfg.intermediate_size, bias=True)
    with torch.no_grad():
        for p in experts_module.parameters():
            p.normal_()
    x = torch.randn(5, cfg.hidden_size)
    weights = torch.full((5, 2), 0.5)
    experts = torch.tensor([[0, 1]] * 5)
    before = experts_module(x, weights, experts, torch.tensor(0))
    with torch.no_grad():
        experts_module.down[3].mul_(10)  # expert 3: never chosen
    torch.testing.assert_close(experts_module(x, weights, experts, torch.tensor(0)), before)
    with torch.no_grad():
        experts_module.down[1].mul_(10)  # expert 1: chosen by every token
    assert not torch.allclose(experts_module(x, weights, experts, torch.tensor(0)), before)
