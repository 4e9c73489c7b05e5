"""Tensor-parallel layers. Each declares how it splits and attaches the matching weight loader.

- ``ColumnParallelLinear``: output features split; no communication.
- ``RowParallelLinear``: input features split; partial sums all-reduced (bias added once, after).
- ``QKVParallelLinear``: fused q/k/v with query heads split and KV heads split or replicated.
- ``MergedColumnParallelLinear``: several column-split outputs fused (gate and up).
- ``VocabParallelEmbedding`` / ``ParallelLMHead``: vocab split, padded to a multiple of the TP degree.
- ``ReplicatedLinear``: the whole weight on every rank (projections too small or too precision-bound to split).

Layers read the TP group at construction, so a model builds the same code at any degree.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import ShardingError
from ..ops.linear import linear
from ..weights.loaders import concat_sharded, fused_qkv, padded_rows, set_weight_loader, sharded
from .state import ProcessGroupHandle, get_tp_group


def check_divisible(what: str, size: int, world_size: int) -> int:
    if size % world_size:
        raise ShardingError(f"{what}={size} is not divisible by tp_degree={world_size}")
    return size // world_size


def kv_heads_per_rank(num_heads: int, num_kv_heads: int, world_size: int) -> int:
    """KV heads each rank holds, replicating them when TP exceeds their count. Validates the split."""
    check_divisible("num_attention_heads", num_heads, world_size)
    if num_heads % num_kv_heads:
        raise ShardingError(
            f"num_attention_heads={num_heads} is not divisible by num_key_value_heads={num_kv_heads}"
        )
    if num_kv_heads >= world_size:
        return check_divisible("num_key_value_heads", num_kv_heads, world_size)
    if world_size % num_kv_heads:
        raise ShardingError(
            f"tp_degree={world_size} exceeds num_key_value_heads={num_kv_heads} but is not a multiple of it, "
            "so the KV heads cannot be replicated evenly"
        )
    return 1


def _param(*shape: int, dtype: torch.dtype) -> nn.Parameter:
    return nn.Parameter(torch.empty(*shape, dtype=dtype), requires_grad=False)


class ColumnParallelLinear(nn.Module):
    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = False,
        *,
        dtype: torch.dtype = torch.float32,
        tp: ProcessGroupHandle | None = None,
    ):
        super().__init__()
        self.tp = tp or get_tp_group()
        self.out_per_rank = check_divisible("out_features", out_features, self.tp.world_size)
        self.weight = _param(self.out_per_rank, in_features, dtype=dtype)
        set_weight_loader(self.weight, sharded(0))
        self.bias = _param(self.out_per_rank, dtype=dtype) if bias else None
        if self.bias is not None:
            set_weight_loader(self.bias, sharded(0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)


class MergedColumnParallelLinear(ColumnParallelLinear):
    """Several column-parallel outputs in one matmul; each rank holds its slice of each, concatenated."""

    def __init__(self, in_features: int, out_sizes: list[int], bias: bool = False, **kwargs):
        super().__init__(in_features, sum(out_sizes), bias, **kwargs)
        for size in out_sizes:
            check_divisible("out_features", size, self.tp.world_size)
        set_weight_loader(self.weight, concat_sharded(0))
        if self.bias is not None:
            set_weight_loader(self.bias, concat_sharded(0))


class QKVParallelLinear(nn.Module):
    """Fused q/k/v projection. Returns ``q [T, Hq_local, D]``, ``k`` and ``v [T, Hkv_local, D]``.

    With ``v_is_k`` (a layer whose V is its K projection) the weight holds q and k rows only, and ``v``
    is the same tensor as ``k``: a step reads the K projection once."""

    def __init__(
        self,
        hidden_size: int,
        head_dim: int,
        num_heads: int,
        num_kv_heads: int,
        bias: bool = False,
        *,
        v_is_k: bool = False,
        dtype: torch.dtype = torch.float32,
        tp: ProcessGroupHandle | None = None,
    ):
        super().__init__()
        self.tp = tp or get_tp_group()
        self.head_dim = head_dim
        self.v_is_k = v_is_k
        self.num_kv_heads = kv_heads_per_rank(num_heads, num_kv_heads, self.tp.world_size)
        self.num_heads = num_heads // self.tp.world_size
        rows = (self.num_heads + (1 if v_is_k else 2) * self.num_kv_heads) * head_dim
        loader = fused_qkv(num_heads, num_kv_heads, head_dim, with_v=not v_is_k)
        self.weight = _param(rows, hidden_size, dtype=dtype)
        set_weight_loader(self.weight, loader)
        self.bias = _param(rows, dtype=dtype) if bias else None
        if self.bias is not None:
            set_weight_loader(self.bias, loader)

    def heads(self, x: torch.Tensor) -> torch.Tensor:
        """Every projected head, ``[T, Hq_local + 2 * Hkv_local, D]``: q's heads, then k's, then v's
        (with ``v_is_k``, ``[T, Hq_local + Hkv_local, D]``: q's, then k's)."""
        return linear(x, self.weight, self.bias).view(*x.shape[:-1], -1, self.head_dim)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if self.v_is_k:
            q, k = self.heads(x).split([self.num_heads, self.num_kv_heads], dim=-2)
            return q, k, k
        q, k, v = self.heads(x).split([self.num_heads, self.num_kv_heads, self.num_kv_heads], dim=-2)
        return q, k, v


class RowParallelLinear(nn.Module):
    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = False,
        *,
        reduce_output: bool = True,
        dtype: torch.dtype = torch.float32,
        tp: ProcessGroupHandle | None = None,
    ):
        super().__init__()
        self.tp = tp or get_tp_group()
        self.reduce_output = reduce_output
        self.weight = _param(
            out_features, check_divisible("in_features", in_features, self.tp.world_size), dtype=dtype
        )
        set_weight_loader(self.weight, sharded(1))
        self.bias = _param(out_features, dtype=dtype) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """With ``reduce_output=False`` this returns the rank's partial sum without the bias: whoever
        reduces the partials adds the bias once."""
        out = linear(x, self.weight)
        if not self.reduce_output:
            return out
        out = self.tp.all_reduce(out)
        return out + self.bias if self.bias is not None else out


class ReplicatedLinear(nn.Module):
    """A linear layer every rank holds whole: the checkpoint tensor loads as it is, and nothing is
    communicated."""

    def __init__(
        self, in_features: int, out_features: int, bias: bool = False, *, dtype: torch.dtype = torch.float32
    ):
        super().__init__()
        self.weight = _param(out_features, in_features, dtype=dtype)
        self.bias = _param(out_features, dtype=dtype) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)


# Every layer that multiplies its input by a 2-D weight through ``linear`` (the LM head aside).
LINEAR_LAYERS = (ColumnParallelLinear, QKVParallelLinear, RowParallelLinear, ReplicatedLinear)


def padded_vocab(vocab_size: int, world_size: int) -> int:
    return math.ceil(vocab_size / world_size) * world_size


class _VocabShardedTable(nn.Module):
    """A ``[vocab, dim]`` table split by rows over TP, padded so every rank holds the same count."""

    def __init__(
        self,
        vocab_size: int,
        dim: int,
        *,
        dtype: torch.dtype = torch.float32,
        tp: ProcessGroupHandle | None = None,
    ):
        super().__init__()
        self.tp = tp or get_tp_group()
        self.vocab_size = vocab_size
        self.rows_per_rank = padded_vocab(vocab_size, self.tp.world_size) // self.tp.world_size
        self.weight = _param(self.rows_per_rank, dim, dtype=dtype)
        set_weight_loader(self.weight, padded_rows(self.rows_per_rank))


class VocabParallelEmbedding(_VocabShardedTable):
    """Each rank embeds the ids in its vocab range and zeros the rest; an all-reduce assembles the rows.

    The rank is a tensor argument of ``forward`` so every rank runs the same compiled graph.
    """

    def forward(self, ids: torch.Tensor, rank: torch.Tensor) -> torch.Tensor:
        if self.tp.world_size == 1:
            return F.embedding(ids, self.weight)
        local = ids - rank * self.rows_per_rank
        mine = (local >= 0) & (local < self.rows_per_rank)
        rows = F.embedding(local.clamp(0, self.rows_per_rank - 1), self.weight)
        return self.tp.all_reduce(rows * mine[..., None].to(rows.dtype))


class ParallelLMHead(_VocabShardedTable):
    """Vocab-split output projection; logits are gathered and the vocab padding is cut off."""

    def tie(self, embedding: VocabParallelEmbedding) -> None:
        """Use ``embedding``'s table as this head's weight: tied checkpoints store one table, and the
        model holds and loads it once (both are split by rows over the same TP group)."""
        if (embedding.vocab_size, embedding.weight.shape) != (self.vocab_size, self.weight.shape):
            raise ValueError(
                f"cannot tie a head of vocab {self.vocab_size} {list(self.weight.shape)} to an embedding "
                f"of vocab {embedding.vocab_size} {list(embedding.weight.shape)}"
            )
        self.weight = embedding.weight

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.tp.all_gather(linear(hidden, self.weight), dim=-1)
        return logits[..., : self.vocab_size]
