"""QK-norm attention assembled from core blocks matches transformers' Qwen3 attention.

Qwen3 normalises each head of q and k (RMSNorm over head_dim) before RoPE: the per-head QK-norm that
Gemma 4 also uses. The block here is what a plugin writes: fused QKV, per-head RMSNorm, RoPE, prefill
attention, row-parallel output projection, with weights loaded through our key mapping.
"""

from __future__ import annotations

from typing import ClassVar

import torch
import transformers
from transformers.models.qwen3 import modeling_qwen3 as hf

from trnmodels.core import ops
from trnmodels.core.accuracy import load_from_hf_module
from trnmodels.core.modules import RMSNorm, RotaryEmbedding
from trnmodels.core.parallel import QKVParallelLinear, RowParallelLinear


class QKNormAttention(torch.nn.Module):
    def __init__(self, hidden: int, heads: int, kv_heads: int, head_dim: int, eps: float):
        super().__init__()
        self.qkv_proj = QKVParallelLinear(hidden, head_dim, heads, kv_heads)
        self.q_norm = RMSNorm(head_dim, eps)
        self.k_norm = RMSNorm(head_dim, eps)
        self.o_proj = RowParallelLinear(heads * head_dim, hidden)
        self.scale = head_dim**-0.5

    def forward(self, x, cos, sin, window=None):
        q, k, v = self.qkv_proj(x)
        q = ops.apply_rope(self.q_norm(q), cos, sin)
        k = ops.apply_rope(self.k_norm(k), cos, sin)
        seq = torch.zeros(x.shape[0], dtype=torch.int64)
        out = ops.prefill_attention(q, k, v, seq, scale=self.scale, sliding_window=window)
        return self.o_proj(out.reshape(x.shape[0], -1))

    MAPPING: ClassVar[dict[str, str | list[str]]] = {
        "qkv_proj.weight": ["q_proj.weight", "k_proj.weight", "v_proj.weight"],
        "q_norm.weight": "q_norm.weight",
        "k_norm.weight": "k_norm.weight",
        "o_proj.weight": "o_proj.weight",
    }


def test_qk_norm_attention_matches_qwen3():
    torch.manual_seed(0)
    config = transformers.Qwen3Config(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        rms_norm_eps=1e-6,
    )
    config._attn_implementation = "eager"
    theirs = hf.Qwen3Attention(config, layer_idx=0).eval()
    with torch.no_grad():
        theirs.q_norm.weight.normal_(1.0, 0.3)
        theirs.k_norm.weight.normal_(1.0, 0.3)
    ours = load_from_hf_module(QKNormAttention(32, 4, 2, 16, 1e-6), theirs, QKNormAttention.MAPPING)

    t = 13
    x = torch.randn(1, t, 32)
    positions = torch.arange(t)
    hf_cos, hf_sin = hf.Qwen3RotaryEmbedding(config)(x, positions[None])
    mask = torch.full((t, t), torch.finfo(torch.float32).min).triu(1)[None, None]
    cos, sin = RotaryEmbedding(ops.RopeConfig.from_hf(config, 16))(positions, torch.float32)
    with torch.no_grad():
        expected = theirs(x, (hf_cos, hf_sin), mask)[0][0]
        torch.testing.assert_close(ours(x[0], cos, sin), expected, atol=2e-6, rtol=1e-5)
        # With the q norm reset to identity the output moves: the test sees the norm.
        ours.q_norm.weight.fill_(1.0)
        assert not torch.allclose(ours(x[0], cos, sin), expected, atol=1e-3)
