"""Rank functions for ``test_parallel.py`` and ``test_mesh.py``, in a plain module ranks can import.

pytest's importlib mode registers test modules under names (``core.tests.test_parallel``) a rank process
cannot import, so ``run_on_ranks`` targets live here; the test puts this directory on ``sys.path``, which
each launch hands to its ranks. Not collected by pytest (no ``test_`` prefix).
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
from torch import nn

from trnmodels.core.errors import ShardingError
from trnmodels.core.parallel import (
    ColumnParallelLinear,
    ParallelLMHead,
    QKVParallelLinear,
    RowParallelLinear,
    VocabParallelEmbedding,
    get_tp_group,
    init_parallel_state,
)
from trnmodels.core.weights import StateDictCheckpoint, load_parameters


class _MLP(nn.Module):
    def __init__(self, hidden: int, inter: int):
        super().__init__()
        self.up = ColumnParallelLinear(hidden, inter, bias=True)
        self.down = RowParallelLinear(inter, hidden, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.relu(self.up(x)))


def _error(fn) -> str:
    try:
        fn()
    except ShardingError as e:
        return str(e)
    return "<no error>"


def all_checks(
    rank: int, world_size: int, weights: dict[str, torch.Tensor], inputs: dict[str, torch.Tensor]
) -> list[dict]:
    """Run every multi-rank check on this rank; rank 0 returns all ranks' results, indexed by rank."""
    tp = get_tp_group()
    out: dict[str, object] = {"rank": tp.rank, "world_size": tp.world_size}

    # Collectives, with hand-computable inputs.
    x = torch.tensor([[1.0, 2.0], [3.0, 4.0]]) * (rank + 1)
    out["all_reduce"] = tp.all_reduce(x)
    out["all_gather_0"] = tp.all_gather(x, dim=0)
    out["all_gather_last"] = tp.all_gather(x, dim=-1)
    y = torch.arange(8.0).reshape(2, 4) + 10 * rank
    out["reduce_scatter_0"] = tp.reduce_scatter(y, dim=0)
    out["reduce_scatter_1"] = tp.reduce_scatter(y, dim=1)
    out["reduce_scatter_bad"] = _error(lambda: tp.reduce_scatter(torch.zeros(3, 2), dim=0))
    out["init_mismatch"] = _error(lambda: init_parallel_state(4))

    # Each module loads its own keys from one shared checkpoint, ignoring the other modules' keys.
    ckpt = StateDictCheckpoint(weights)
    load = dict(rank=rank, world_size=world_size, ignore=["*"], progress=False)

    # Column → Row MLP loaded through the layers' own loaders.
    mlp = _MLP(weights["up.weight"].shape[1], weights["up.weight"].shape[0])
    load_parameters(mlp, ckpt, {n: n for n in ("up.weight", "up.bias", "down.weight", "down.bias")}, **load)
    out["up_weight_shape"] = tuple(mlp.up.weight.shape)
    out["down_weight_shape"] = tuple(mlp.down.weight.shape)
    out["mlp"] = mlp(inputs["x"])

    # Vocab-parallel embedding and LM head (vocab not divisible by the TP degree).
    vocab, dim = weights["embed.weight"].shape
    emb = VocabParallelEmbedding(vocab, dim)
    load_parameters(emb, ckpt, {"weight": "embed.weight"}, **load)
    out["embed_local"] = emb.weight.detach().clone()
    out["embed"] = emb(inputs["ids"], torch.tensor(rank))
    head = ParallelLMHead(vocab, dim)
    load_parameters(head, ckpt, {"weight": "lm_head.weight"}, **load)
    out["lm_head_local"] = head.weight.detach().clone()
    out["logits"] = head(inputs["h"])

    # Fused QKV with KV heads replicated (1 < tp) and split (2 == tp).
    hidden = inputs["x"].shape[-1]
    head_dim = 2
    for kv in (1, 2):
        qkv = QKVParallelLinear(hidden, head_dim, num_heads=4, num_kv_heads=kv, bias=True)
        keys = [f"q{kv}.weight", f"k{kv}.weight", f"v{kv}.weight"]
        biases = [f"q{kv}.bias", f"k{kv}.bias", f"v{kv}.bias"]
        load_parameters(qkv, ckpt, {"weight": keys, "bias": biases}, **load)
        q, k, v = qkv(inputs["x"])
        out[f"qkv{kv}"] = (q, k, v)
        out[f"qkv{kv}_heads"] = (qkv.num_heads, qkv.num_kv_heads)
        # V taken from the K projection: only q and k keys, only q and k rows.
        qk = QKVParallelLinear(hidden, head_dim, num_heads=4, num_kv_heads=kv, bias=True, v_is_k=True)
        load_parameters(qk, ckpt, {"weight": keys[:2], "bias": biases[:2]}, **load)
        q, k, v = qk(inputs["x"])
        out[f"qk{kv}"] = (q, k, v, v is k, tuple(qk.weight.shape))

    gathered: list[dict | None] = [None] * world_size
    dist.all_gather_object(gathered, out)
    return gathered


def mesh_checks(rank: int, world_size: int) -> dict:
    """Collectives on every group of the TP x EP mesh, with the rank number as the input."""
    from trnmodels.core.parallel import get_ep_group, get_parallel_layout, get_world_group

    x = torch.tensor([float(rank + 1)])
    tp, ep, world = get_tp_group(), get_ep_group(), get_world_group()
    out = {
        "rank": rank,
        "tp": (tp.rank, tp.world_size, tp.all_reduce(x).item(), tp.all_gather(x).tolist()),
        "ep": (ep.rank, ep.world_size, ep.all_reduce(x).item(), ep.all_gather(x).tolist()),
        "world": world.all_reduce(x).item(),
        "coords": get_parallel_layout().coords(rank),
    }
    gathered = [None] * world_size
    dist.all_gather_object(gathered, out)
    return gathered


def raise_sharding_error(rank: int, world_size: int) -> None:
    raise ShardingError(f"rank {rank} of {world_size}: ep_degree=3 does not divide num_local_experts=4")


def environment_variable(rank: int, world_size: int, name: str) -> list[str | None]:
    """Every rank's value of the environment variable ``name`` (rank 0's result holds them all)."""
    values: list[str | None] = [None] * world_size
    dist.all_gather_object(values, os.environ.get(name))
    return values
