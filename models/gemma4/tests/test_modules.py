"""Module level: each Gemma 4 block against its transformers twin with the same weights.

Weights reach our modules through our own key mappings and loaders (``load_from_hf_module``). FP32 must
match tightly; BF16 is judged three-way (our BF16 error relative to HF BF16's own error vs HF FP32).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from transformers.models.gemma4 import modeling_gemma4 as hf

from trnmodels.core.accuracy import assert_module_bf16_three_way, load_from_hf_module
from trnmodels.core.attention import AttentionMetadata, bind_kv_caches, collect_kv_spec
from trnmodels.core.kv_cache import allocate_kv_cache, slot_mapping
from trnmodels.core.modules import ExpertsCheckpointFormat, GatedMLP, MoEExperts, RotaryEmbedding
from trnmodels.core.runtime_config import NeuronConfig
from trnmodels.gemma4.config import Gemma4Config
from trnmodels.gemma4.model import Gemma4Attention, Gemma4DecoderLayer, Gemma4Router, PerLayerEmbeddings

from .conftest import FULL, MOE, SLIDING, perturb, text_config

T = 11  # past the window of 8
BLOCK = 4
DENSE = dict(
    attention_k_eq_v=True,
    num_kv_shared_layers=2,  # layer 2 reads layer 0's cache, layer 3 reads layer 1's
    hidden_size_per_layer_input=8,
    use_double_wide_mlp=True,
)


def configs(dtype: torch.dtype, **overrides):
    hf_cfg = text_config(**{**DENSE, **overrides})
    return hf_cfg, Gemma4Config.from_configs(hf_cfg, NeuronConfig(dtype=dtype, block_size=BLOCK))


def prefill_metadata(module: nn.Module) -> AttentionMetadata:
    """Bind fresh caches to every attention layer in ``module`` and describe one prefilled sequence."""
    blocks = -(-T // BLOCK)
    bind_kv_caches(module, allocate_kv_cache(collect_kv_spec(module, BLOCK), blocks + 1))
    table = torch.arange(1, blocks + 1)
    return AttentionMetadata(
        slot_mapping=slot_mapping(table, torch.arange(T), BLOCK), seq_ids=torch.zeros(T, dtype=torch.int64)
    )


def hf_mask(layer_type: str, window: int, dtype: torch.dtype) -> torch.Tensor:
    i = torch.arange(T)
    hidden = (i[None, :] > i[:, None]) | ((i[:, None] - i[None, :] >= window) & (layer_type == SLIDING))
    return torch.zeros(T, T, dtype=dtype).masked_fill(hidden, torch.finfo(dtype).min)[None, None]


def hf_rope(hf_cfg, x: torch.Tensor, layer_type: str):
    return hf.Gemma4TextRotaryEmbedding(hf_cfg)(x, torch.arange(T)[None], layer_type)


def our_rope(cfg: Gemma4Config, layer_type: str, dtype: torch.dtype):
    return RotaryEmbedding(cfg.rope[layer_type])(torch.arange(T), dtype)


def attention_pair(layers: tuple[int, ...]):
    """Attention layers run in order on the same sequence; with KV sharing the later reads the earlier's
    K/V (HF: ``shared_kv_states``; ours: the shared paged cache). Output: every layer's, concatenated."""

    def make(hf_cfg, cfg):
        theirs = nn.ModuleList(hf.Gemma4TextAttention(hf_cfg, i) for i in layers).eval()
        perturb(theirs, 0)
        ours = nn.ModuleList(Gemma4Attention(cfg, i) for i in layers)
        keys = {f"{j}.{k}": v for j, m in enumerate(ours) for k, v in m.checkpoint_keys(f"{j}.").items()}
        load_from_hf_module(ours, theirs, keys)
        types = [hf_cfg.layer_types[i] for i in layers]

        def run_ours(x):
            meta = prefill_metadata(ours)
            outs = [m(x[0], *our_rope(cfg, t, x.dtype), meta) for m, t in zip(ours, types, strict=True)]
            return torch.cat(outs)[None]

        def run_theirs(module, x):
            shared: dict = {}
            outs = [
                m(x, hf_rope(hf_cfg, x, t), hf_mask(t, hf_cfg.sliding_window, x.dtype), shared)[0]
                for m, t in zip(module, types, strict=True)
            ]
            return torch.cat(outs, dim=1)

        return ours, theirs, run_ours, run_theirs

    return make


def init_experts(module: nn.Module) -> None:
    """A standalone HF module skips ``_init_weights``: its expert tensors are uninitialised memory."""
    with torch.no_grad():
        for name, p in module.named_parameters():
            if "experts." in name or name in ("gate_up_proj", "down_proj"):
                p.normal_(0.0, 0.2)


def mlp_pair(hf_cfg, cfg):
    theirs = hf.Gemma4TextMLP(hf_cfg, layer_idx=3).eval()  # a KV-shared layer: double wide
    assert theirs.intermediate_size == 2 * hf_cfg.intermediate_size
    ours = GatedMLP(cfg.hidden_size, cfg.layers[3].intermediate_size, cfg.hidden_act, dtype=cfg.dtype)
    load_from_hf_module(ours, theirs, ours.checkpoint_keys(""))
    return ours, theirs, lambda x: ours(x), lambda m, x: m(x)


def ple_pair(hf_cfg, cfg):
    """PLE from token ids plus the main embedding (the pair's input ``x``)."""
    theirs = hf.Gemma4TextModel(hf_cfg).eval()
    perturb(theirs, 0)
    ours = PerLayerEmbeddings(cfg)
    ignore = ("layers.*", "embed_tokens.weight", "norm.weight")
    load_from_hf_module(ours, theirs, PerLayerEmbeddings.checkpoint_keys(""), ignore=ignore)
    ids = torch.randint(0, hf_cfg.vocab_size, (1, T))

    def run_theirs(module, x):
        return module.project_per_layer_inputs(x, module.get_per_layer_inputs(ids, x))

    return ours, theirs, lambda x: ours(ids[0], x[0], torch.tensor(0))[None], run_theirs


def decoder_pair(layer_idx: int):
    def make(hf_cfg, cfg):
        theirs = hf.Gemma4TextDecoderLayer(hf_cfg, layer_idx).eval()
        init_experts(theirs)
        perturb(theirs, 0)
        ours = Gemma4DecoderLayer(cfg, layer_idx)
        load_from_hf_module(ours, theirs, ours.checkpoint_keys(""))
        layer_type = hf_cfg.layer_types[layer_idx]
        ple = torch.randn(1, T, hf_cfg.hidden_size_per_layer_input)

        def run_ours(x):
            meta = prefill_metadata(ours)
            rope = our_rope(cfg, layer_type, x.dtype)
            per_layer = ple[0].to(x.dtype) if cfg.hidden_size_per_layer_input else None
            return ours(x[0], rope, per_layer, meta, torch.tensor(0))[None]

        def run_theirs(module, x):
            return module(
                x,
                ple.to(x.dtype) if hf_cfg.hidden_size_per_layer_input else None,
                shared_kv_states={},
                position_embeddings=hf_rope(hf_cfg, x, layer_type),
                attention_mask=hf_mask(layer_type, hf_cfg.sliding_window, x.dtype),
            )

        return ours, theirs, run_ours, run_theirs

    return make


def experts_pair(hf_cfg, cfg):
    theirs = hf.Gemma4TextExperts(hf_cfg).eval()
    init_experts(theirs)
    ours = MoEExperts(
        cfg.moe.num_experts,
        cfg.hidden_size,
        cfg.moe.intermediate_size,
        act=cfg.hidden_act,
        checkpoint_format=ExpertsCheckpointFormat(transposed=True),
        dtype=cfg.dtype,
    )
    load_from_hf_module(ours, theirs, {"gate_up": "gate_up_proj", "down": "down_proj"})
    gen = torch.Generator().manual_seed(1)
    experts = torch.stack([torch.randperm(cfg.moe.num_experts, generator=gen)[:2] for _ in range(T)])
    weights = torch.rand(T, 2, generator=gen)

    def run_ours(x):
        return ours(x[0], weights.to(x.dtype), experts, torch.tensor(0))[None]

    return ours, theirs, run_ours, lambda m, x: m(x[0], experts, weights.to(x.dtype))[None]


PAIRS = {
    "attention_sliding": attention_pair((0,)),
    "attention_full_k_eq_v": attention_pair((1,)),
    "attention_sliding_kv_shared": attention_pair((0, 2)),
    "attention_full_kv_shared": attention_pair((1, 3)),
    "mlp_double_wide": mlp_pair,
    "ple": ple_pair,
    "decoder_layer_full_ple": decoder_pair(1),
    "experts": experts_pair,
    "decoder_layer_moe": decoder_pair(0),
}
MOE_PAIRS = {"experts", "decoder_layer_moe"}


def build(block: str, dtype: torch.dtype):
    torch.manual_seed(0)
    overrides = dict(MOE, hidden_size_per_layer_input=0) if block in MOE_PAIRS else {}
    hf_cfg, cfg = configs(dtype, **overrides)
    return cfg, PAIRS[block](hf_cfg, cfg)


@pytest.mark.parametrize("block", PAIRS)
def test_fp32_matches_hf(block):
    cfg, (_, theirs, run_ours, run_theirs) = build(block, torch.float32)
    x = torch.randn(1, T, cfg.hidden_size)
    with torch.no_grad():
        torch.testing.assert_close(run_ours(x), run_theirs(theirs, x), atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("block", PAIRS)
def test_bf16_three_way(block):
    cfg, (_, theirs, run_ours, run_theirs) = build(block, torch.bfloat16)
    assert_module_bf16_three_way(run_ours, theirs, run_theirs, torch.randn(1, T, cfg.hidden_size), block)


def test_router_matches_hf():
    hf_cfg, cfg = configs(torch.float32, **MOE)
    theirs = hf.Gemma4TextRouter(hf_cfg).eval()
    perturb(theirs, 0)
    ours = load_from_hf_module(Gemma4Router(cfg, cfg.moe), theirs, Gemma4Router.checkpoint_keys(""))
    x = torch.randn(T, cfg.hidden_size)
    with torch.no_grad():
        _, hf_weights, hf_experts = theirs(x)
        weights, experts = ours(x)
    assert torch.equal(experts, hf_experts)
    torch.testing.assert_close(weights, hf_weights, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("layer_type,head_dim", [(SLIDING, 16), (FULL, 32)])
def test_rope_per_layer_type_matches_hf(layer_type, head_dim):
    hf_cfg, cfg = configs(torch.float32)
    assert cfg.rope[layer_type].head_dim == head_dim
    positions = torch.tensor([0, 1, 5, 17, 100, 255])
    cos, sin = RotaryEmbedding(cfg.rope[layer_type])(positions, torch.float32)
    hf_cos, hf_sin = hf.Gemma4TextRotaryEmbedding(hf_cfg)(torch.zeros(1), positions[None], layer_type)
    torch.testing.assert_close(cos, hf_cos[0])
    torch.testing.assert_close(sin, hf_sin[0])
