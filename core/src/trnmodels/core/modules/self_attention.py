"""A decoder layer's self-attention: fused QKV → (QK norm) → RoPE → ``PagedAttention`` → row-parallel out.

The options are what the supported models vary: a bias per projection (Llama's ``attention_bias``, gpt-oss),
a per-head norm on q and k before RoPE (Qwen 3, Gemma 4), learned sinks (gpt-oss), a sliding window, a
query scale, a per-layer head size and KV-head count, and KV sharing (a layer that projects only queries
and reads another layer's cache). A model with more (Gemma 4's scale-free v_norm) subclasses it and
overrides ``project`` and ``checkpoint_keys``.

Checkpoint keys follow the HF layout ``q_proj``/``k_proj``/``v_proj``/``o_proj`` (+ ``q_norm``,
``k_norm``, ``sinks``): the fused ``qkv_proj`` declares them as its sources, as vLLM's
``stacked_params_mapping`` does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from .. import ops
from ..attention import AttentionMetadata, PagedAttention
from ..parallel import (
    ColumnParallelLinear,
    QKVParallelLinear,
    RowParallelLinear,
    get_tp_group,
    kv_heads_per_rank,
)
from ..weights import KeyDict, set_weight_loader, sharded

QKV_SOURCES = ("q_proj", "k_proj", "v_proj")
"""The checkpoint projections the fused ``qkv_proj`` concatenates, in order."""


class SelfAttention(nn.Module):
    """``forward(x [T, hidden], cos, sin, meta) → [T, hidden]``, reduced over TP; heads split over TP.

    ``qk_norm(head_dim)`` builds the per-head norm applied to q and to k before RoPE (None: no norm).
    With ``v_is_k`` the checkpoint has no ``v_proj``: V is the K projection, before k's norm and RoPE.
    With ``kv_sharing_target_layer_name`` the layer owns no K/V projection and no cache: it projects
    queries only (``q_proj``) and attends over the target layer's cache.
    """

    def __init__(
        self,
        layer_name: str,
        hidden_size: int,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        *,
        qkv_bias: bool = False,
        o_bias: bool = False,
        qk_norm: Callable[[int], nn.Module] | None = None,
        scale: float | None = None,
        sliding_window: int | None = None,
        sinks: bool = False,
        v_is_k: bool = False,
        kv_sharing_target_layer_name: str | None = None,
        dtype: torch.dtype = torch.float32,
    ):
        super().__init__()
        self.head_dim = head_dim
        self.qkv_bias, self.o_bias = qkv_bias, o_bias
        self.shares_kv = kv_sharing_target_layer_name is not None
        tp = get_tp_group()
        if self.shares_kv:
            self.q_proj = ColumnParallelLinear(hidden_size, num_heads * head_dim, qkv_bias, dtype=dtype)
            self.num_heads = num_heads // tp.world_size
            local_kv_heads = kv_heads_per_rank(num_heads, num_kv_heads, tp.world_size)
        else:
            self.qkv_proj = QKVParallelLinear(
                hidden_size, head_dim, num_heads, num_kv_heads, qkv_bias, v_is_k=v_is_k, dtype=dtype
            )
            self.num_heads, local_kv_heads = self.qkv_proj.num_heads, self.qkv_proj.num_kv_heads
        self.q_norm = qk_norm(head_dim) if qk_norm is not None else None
        self.k_norm = qk_norm(head_dim) if qk_norm is not None and not self.shares_kv else None
        self.o_proj = RowParallelLinear(num_heads * head_dim, hidden_size, o_bias, dtype=dtype)
        self.attn = PagedAttention(
            layer_name,
            self.num_heads,
            local_kv_heads,
            head_dim,
            scale=scale,
            sliding_window=sliding_window,
            sinks=sinks,
            dtype=dtype,
            kv_sharing_target_layer_name=kv_sharing_target_layer_name,
        )
        if self.attn.sinks is not None:
            # One learned sink logit per query head: a rank holds its heads' sinks.
            set_weight_loader(self.attn.sinks, sharded(0))

    @classmethod
    def for_layer(cls, cfg: Any, layer_idx: int, **options: Any) -> SelfAttention:
        """Layer ``layer_idx``'s attention from a config with the standard fields (``hidden_size``,
        ``num_heads``, ``num_kv_heads``, ``head_dim``, ``attention_bias`` on q/k/v and out, ``dtype``);
        ``options`` add or override the keyword options (``qk_norm=``, ``sliding_window=``, ``sinks=``)."""
        bias = cfg.attention_bias
        options = {"qkv_bias": bias, "o_bias": bias, "dtype": cfg.dtype, **options}
        return cls(
            f"layers.{layer_idx}.self_attn",
            cfg.hidden_size,
            cfg.num_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
            **options,
        )

    def project(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """This rank's rotated ``q [T, H, D]`` and ``k, v [T, Hkv, D]`` (None on a KV-sharing layer)."""
        if not self.shares_kv and self.q_norm is None and self.k_norm is None:
            # q and k rotate by one table, and the rotation is a chain of small ops whose host cost
            # outweighs its arithmetic at decode: one rotation of both heads at once, not one of each.
            heads = self.qkv_proj.heads(x)
            h, hkv = self.num_heads, self.qkv_proj.num_kv_heads
            qk = ops.apply_rope(heads[:, : h + hkv], cos, sin)
            v = heads[:, h:] if self.qkv_proj.v_is_k else heads[:, h + hkv :]
            return qk[:, :h], qk[:, h:], v
        k: torch.Tensor | None
        v: torch.Tensor | None
        if self.shares_kv:
            q, k, v = self.q_proj(x).reshape(x.shape[0], self.num_heads, self.head_dim), None, None
        else:
            q, k, v = self.qkv_proj(x)
            if self.k_norm is not None:
                k = self.k_norm(k)
            k = ops.apply_rope(k, cos, sin)
        if self.q_norm is not None:
            q = self.q_norm(q)
        return ops.apply_rope(q, cos, sin), k, v

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, meta: AttentionMetadata
    ) -> torch.Tensor:
        return self.o_proj(self.attn(*self.project(x, cos, sin), meta))

    def checkpoint_keys(self, prefix: str) -> KeyDict:
        """``{parameter: key(s)}`` under ``prefix`` (e.g. ``model.layers.3.self_attn.``)."""
        keys: KeyDict = {"o_proj.weight": f"{prefix}o_proj.weight"}
        if self.shares_kv:
            keys["q_proj.weight"] = f"{prefix}q_proj.weight"
            if self.qkv_bias:
                keys["q_proj.bias"] = f"{prefix}q_proj.bias"
        else:
            sources = QKV_SOURCES[:2] if self.qkv_proj.v_is_k else QKV_SOURCES
            keys["qkv_proj.weight"] = [f"{prefix}{p}.weight" for p in sources]
            if self.qkv_bias:
                keys["qkv_proj.bias"] = [f"{prefix}{p}.bias" for p in sources]
        if self.o_bias:
            keys["o_proj.bias"] = f"{prefix}o_proj.bias"
        if self.q_norm is not None:
            keys.update({f"q_norm.{n}": f"{prefix}q_norm.{n}" for n, _ in self.q_norm.named_parameters()})
        if self.k_norm is not None:
            keys.update({f"k_norm.{n}": f"{prefix}k_norm.{n}" for n, _ in self.k_norm.named_parameters()})
        if self.attn.sinks is not None:
            keys["attn.sinks"] = f"{prefix}sinks"
        return keys
