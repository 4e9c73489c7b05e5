"""Tensor parallelism: collectives and parallel layers at TP=2 over gloo, and the single-rank paths.

All multi-rank checks run in ONE spawn (``_rank_fns.all_checks``), which returns every rank's results to
the parent; the parent compares them with hand values or a full-size single-process reference.
"""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from trnmodels.core.errors import ShardingError
from trnmodels.core.parallel import (
    ColumnParallelLinear,
    ParallelLMHead,
    RowParallelLinear,
    VocabParallelEmbedding,
    destroy_parallel_state,
    get_tp_group,
    init_parallel_state,
    kv_heads_per_rank,
    padded_vocab,
)
from trnmodels.core.parallel.launch import run_on_ranks

HERE = Path(__file__).resolve().parent
VOCAB, DIM, HIDDEN, INTER, HEAD_DIM, HEADS = 11, 3, 8, 6, 2, 4


def _weights_and_inputs() -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    torch.manual_seed(0)
    w = {
        "up.weight": torch.randn(INTER, HIDDEN),
        "up.bias": torch.randn(INTER),
        "down.weight": torch.randn(HIDDEN, INTER),
        "down.bias": torch.randn(HIDDEN),
        "embed.weight": torch.randn(VOCAB, DIM),
        "lm_head.weight": torch.randn(VOCAB, DIM),
    }
    for kv in (1, 2):
        for name, heads in (("q", HEADS), ("k", kv), ("v", kv)):
            w[f"{name}{kv}.weight"] = torch.randn(heads * HEAD_DIM, HIDDEN)
            w[f"{name}{kv}.bias"] = torch.randn(heads * HEAD_DIM)
    inputs = {
        "x": torch.randn(5, HIDDEN),
        # ids in both shards (rank 0 owns 0..5, rank 1 owns 6..10 plus one padding row).
        "ids": torch.tensor([0, 5, 6, 10, 3, 7]),
        "h": torch.randn(4, DIM),
    }
    return w, inputs


# Every test of the spawn is slow (`nox -s tests-fast` skips them); the world-size-1 tests below stay fast.
@pytest.fixture(scope="module")
def tp2(tmp_path_factory):
    """Every rank's results from one 2-rank spawn, plus the weights and inputs they used."""
    weights, inputs = _weights_and_inputs()
    mp = pytest.MonkeyPatch()
    # The spawned ranks inherit sys.path, so they can import the rank function by its module name.
    mp.syspath_prepend(str(HERE))
    try:
        rank_fns = importlib.import_module("_rank_fns")
        results = run_on_ranks(rank_fns.all_checks, 2, weights, inputs)
    finally:
        mp.undo()
    assert [r["rank"] for r in results] == [0, 1]
    assert all(r["world_size"] == 2 for r in results)
    return results, weights, inputs


@pytest.mark.slow
def test_all_reduce(tp2):
    results, _, _ = tp2
    for r in results:
        torch.testing.assert_close(r["all_reduce"], torch.tensor([[3.0, 6.0], [9.0, 12.0]]))


@pytest.mark.slow
def test_all_gather_dim0_and_last(tp2):
    results, _, _ = tp2
    for r in results:
        torch.testing.assert_close(
            r["all_gather_0"], torch.tensor([[1.0, 2.0], [3.0, 4.0], [2.0, 4.0], [6.0, 8.0]])
        )
        torch.testing.assert_close(
            r["all_gather_last"], torch.tensor([[1.0, 2.0, 2.0, 4.0], [3.0, 4.0, 6.0, 8.0]])
        )


@pytest.mark.slow
def test_reduce_scatter_dim0_and_dim1(tp2):
    results, _, _ = tp2
    # Sum over ranks of arange(8).reshape(2, 4) + 10 * rank = 2 * arange + 10.
    total = torch.tensor([[10.0, 12.0, 14.0, 16.0], [18.0, 20.0, 22.0, 24.0]])
    for rank, r in enumerate(results):
        torch.testing.assert_close(r["reduce_scatter_0"], total[rank : rank + 1])
        torch.testing.assert_close(r["reduce_scatter_1"], total[:, 2 * rank : 2 * rank + 2])
        assert "size 3" in r["reduce_scatter_bad"] and "world size 2" in r["reduce_scatter_bad"]
        assert "tp_degree=4" in r["init_mismatch"] and "world size 2" in r["init_mismatch"]


@pytest.mark.slow
def test_column_then_row_parallel_equals_full_linears(tp2):
    results, w, inputs = tp2
    ref = F.linear(torch.relu(F.linear(inputs["x"], w["up.weight"], w["up.bias"])), w["down.weight"])
    ref = ref + w["down.bias"]
    for r in results:
        assert r["up_weight_shape"] == (INTER // 2, HIDDEN)
        assert r["down_weight_shape"] == (HIDDEN, INTER // 2)
        torch.testing.assert_close(r["mlp"], ref)


@pytest.mark.slow
def test_vocab_parallel_embedding_odd_vocab(tp2):
    results, w, inputs = tp2
    table = w["embed.weight"]
    # Rank 0 holds rows 0..5; rank 1 holds rows 6..10 and one zero padding row.
    torch.testing.assert_close(results[0]["embed_local"], table[:6])
    torch.testing.assert_close(results[1]["embed_local"], torch.cat([table[6:], torch.zeros(1, DIM)]))
    for r in results:
        torch.testing.assert_close(r["embed"], F.embedding(inputs["ids"], table))


@pytest.mark.slow
def test_parallel_lm_head_odd_vocab(tp2):
    results, w, inputs = tp2
    for r in results:
        assert r["logits"].shape == (inputs["h"].shape[0], VOCAB)
        torch.testing.assert_close(r["logits"], inputs["h"] @ w["lm_head.weight"].T)


@pytest.mark.slow
@pytest.mark.parametrize("kv", [1, 2])
def test_qkv_parallel_heads_per_rank(tp2, kv):
    results, w, inputs = tp2
    x = inputs["x"]
    q = F.linear(x, w[f"q{kv}.weight"], w[f"q{kv}.bias"]).reshape(-1, HEADS, HEAD_DIM)
    k = F.linear(x, w[f"k{kv}.weight"], w[f"k{kv}.bias"]).reshape(-1, kv, HEAD_DIM)
    v = F.linear(x, w[f"v{kv}.weight"], w[f"v{kv}.bias"]).reshape(-1, kv, HEAD_DIM)
    for rank, r in enumerate(results):
        assert r[f"qkv{kv}_heads"] == (2, 1)
        q_r, k_r, v_r = r[f"qkv{kv}"]
        kv_head = 0 if kv == 1 else rank  # kv=1: replicated on both ranks; kv=2: one each
        torch.testing.assert_close(q_r, q[:, 2 * rank : 2 * rank + 2])
        torch.testing.assert_close(k_r, k[:, kv_head : kv_head + 1])
        torch.testing.assert_close(v_r, v[:, kv_head : kv_head + 1])
        # v_is_k: the same q and k from a weight of q's and k's rows alone (2 + 1 heads of 2), v = k.
        q_r, k_r, v_r, same, shape = r[f"qk{kv}"]
        torch.testing.assert_close(q_r, q[:, 2 * rank : 2 * rank + 2])
        torch.testing.assert_close(k_r, k[:, kv_head : kv_head + 1])
        assert same and shape == (3 * HEAD_DIM, x.shape[-1])


# --- in-process: world size 1 and validation -------------------------------------------------------


@pytest.fixture
def single():
    init_parallel_state(1)
    yield get_tp_group()
    destroy_parallel_state()


def test_world_size_one_needs_no_process_group(single):
    assert not dist.is_initialized()
    assert single.world_size == 1 and single.rank == 0 and single.group is None
    assert get_tp_group() is single
    x = torch.arange(6.0).reshape(2, 3)
    assert single.all_reduce(x) is x
    assert single.all_gather(x, dim=-1) is x
    assert single.reduce_scatter(x, dim=1) is x
    assert single.rank_tensor().item() == 0
    assert not dist.is_initialized()


def test_run_on_ranks_world_one_runs_in_process():
    try:
        assert run_on_ranks(_world_one, 1, 7) == (0, 1, 7, False)
    finally:
        destroy_parallel_state()


def _world_one(rank, world_size, extra):
    return rank, world_size, extra, dist.is_initialized()


def test_world_size_one_layers_are_plain(single):
    torch.manual_seed(0)
    emb = VocabParallelEmbedding(VOCAB, DIM)
    head = ParallelLMHead(VOCAB, DIM)
    col = ColumnParallelLinear(4, 6)
    row = RowParallelLinear(6, 4)
    assert emb.weight.shape == (VOCAB, DIM) and head.weight.shape == (VOCAB, DIM)
    assert col.weight.shape == (6, 4) and row.weight.shape == (4, 6)
    with torch.no_grad():
        emb.weight.normal_()
        head.weight.normal_()
    ids = torch.tensor([0, 10, 4])
    torch.testing.assert_close(emb(ids, torch.tensor(0)), emb.weight[ids])
    h = torch.randn(2, DIM)
    torch.testing.assert_close(head(h), h @ head.weight.T)


def test_tied_head_is_the_embedding_table(single):
    torch.manual_seed(0)
    emb = VocabParallelEmbedding(VOCAB, DIM)
    head = ParallelLMHead(VOCAB, DIM)
    head.tie(emb)
    with torch.no_grad():
        emb.weight.normal_()
    assert head.weight is emb.weight
    h = torch.randn(2, DIM)
    torch.testing.assert_close(head(h), h @ emb.weight.T)
    # One table in memory: a module holding both lists it once (the loader fills it once).
    both = torch.nn.ModuleDict({"embed": emb, "head": head})
    assert [name for name, _ in both.named_parameters()] == ["embed.weight"]
    with pytest.raises(ValueError, match=r"cannot tie a head of vocab 7"):
        ParallelLMHead(7, DIM).tie(emb)


def test_init_parallel_state_without_distributed_raises():
    assert not dist.is_initialized()
    with pytest.raises(ShardingError, match=r"tp_degree=2.*torch\.distributed"):
        init_parallel_state(2)
    assert get_tp_group().world_size == 1


@pytest.mark.parametrize(
    ("heads", "kv", "tp", "names"),
    [
        (6, 6, 4, ["num_attention_heads=6", "tp_degree=4"]),
        (6, 3, 2, ["num_key_value_heads=3", "tp_degree=2"]),
        (12, 3, 4, ["tp_degree=4", "num_key_value_heads=3"]),
        (8, 3, 1, ["num_attention_heads=8", "num_key_value_heads=3"]),
    ],
)
def test_kv_heads_per_rank_errors_name_the_numbers(heads, kv, tp, names):
    with pytest.raises(ShardingError) as e:
        kv_heads_per_rank(heads, kv, tp)
    for name in names:
        assert name in str(e.value)


@pytest.mark.parametrize(
    ("heads", "kv", "tp", "expected"),
    [(8, 1, 2, 1), (8, 2, 4, 1), (8, 2, 8, 1), (8, 8, 2, 4), (8, 4, 4, 1), (8, 2, 1, 2)],
)
def test_kv_heads_per_rank_split_and_replication(heads, kv, tp, expected):
    assert kv_heads_per_rank(heads, kv, tp) == expected


def test_padded_vocab():
    assert padded_vocab(11, 2) == 12
    assert padded_vocab(12, 4) == 12
    assert padded_vocab(5, 4) == 8
