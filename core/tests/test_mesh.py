"""The rank mesh (TP x EP x CP x CFG): layout arithmetic by hand, groups and collectives over gloo on a
TP=2 x EP=2 mesh of 4 ranks, and user errors raised inside ranks reaching the caller as themselves."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from trnmodels.core.errors import ShardingError
from trnmodels.core.parallel import ParallelLayout
from trnmodels.core.parallel.launch import run_on_ranks

HERE = Path(__file__).resolve().parent


@pytest.fixture
def rank_fns(monkeypatch):
    monkeypatch.syspath_prepend(str(HERE))
    monkeypatch.setenv("PYTHONPATH", str(HERE) + ":" + ":".join(sys.path))
    import _rank_fns

    return _rank_fns


def test_layout_coordinates_by_hand():
    layout = ParallelLayout(tp=2, ep=3, cfg=2)
    assert layout.world_size == 12
    # rank = ((cfg * CP + cp) * EP + ep) * TP + tp
    assert layout.coords(0) == {"tp": 0, "ep": 0, "cp": 0, "cfg": 0}
    assert layout.coords(5) == {"tp": 1, "ep": 2, "cp": 0, "cfg": 0}
    assert layout.coords(7) == {"tp": 1, "ep": 0, "cp": 0, "cfg": 1}
    assert all(layout.rank_of(layout.coords(r)) == r for r in range(12))
    assert ParallelLayout(tp=2, ep=2).group_ranks("tp") == [[0, 1], [2, 3]]
    assert ParallelLayout(tp=2, ep=2).group_ranks("ep") == [[0, 2], [1, 3]]
    ranks = torch.arange(12)
    for dim in ("tp", "ep", "cfg", "cp"):
        expected = torch.tensor([layout.coords(r)[dim] for r in range(12)])
        assert torch.equal(layout.coord_tensor(ranks, dim), expected), dim
    assert ParallelLayout(tp=2, ep=2).describe() == "tp_degree=2, ep_degree=2"


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_layout_rejects_non_positive_degrees(bad):
    with pytest.raises(ShardingError, match="ep_degree: expected a positive integer"):
        ParallelLayout(ep=bad)


@pytest.mark.slow
def test_tp2_ep2_groups_over_gloo(rank_fns):
    results = run_on_ranks(rank_fns.mesh_checks, ParallelLayout(tp=2, ep=2))
    # Rank r contributes r + 1. TP groups {0,1} {2,3}; EP groups {0,2} {1,3}; world sums to 10.
    expected_tp = {
        0: (0, 3.0, [1.0, 2.0]),
        1: (1, 3.0, [1.0, 2.0]),
        2: (0, 7.0, [3.0, 4.0]),
        3: (1, 7.0, [3.0, 4.0]),
    }
    expected_ep = {
        0: (0, 4.0, [1.0, 3.0]),
        1: (0, 6.0, [2.0, 4.0]),
        2: (1, 4.0, [1.0, 3.0]),
        3: (1, 6.0, [2.0, 4.0]),
    }
    for r in results:
        rank = r["rank"]
        tp_rank, tp_size, tp_sum, tp_all = r["tp"]
        ep_rank, ep_size, ep_sum, ep_all = r["ep"]
        assert (tp_rank, tp_sum, tp_all) == expected_tp[rank] and tp_size == 2
        assert (ep_rank, ep_sum, ep_all) == expected_ep[rank] and ep_size == 2
        assert r["world"] == 10.0
        assert r["coords"]["tp"] == tp_rank and r["coords"]["ep"] == ep_rank


@pytest.mark.slow
def test_user_error_inside_ranks_reaches_the_caller_as_itself(rank_fns):
    with pytest.raises(ShardingError, match=r"of 2: ep_degree=3 does not divide num_local_experts=4"):
        run_on_ranks(rank_fns.raise_sharding_error, 2)


@pytest.mark.slow
def test_ranks_see_the_environment_of_their_launch_not_of_the_fork_server(rank_fns, monkeypatch):
    """Ranks fork from a server that keeps the environment it started with; each launch hands over the
    caller's environment as it is then, a variable set or removed after the server started included."""
    name = "TRNMODELS_TEST_RANK_ENVIRONMENT"
    monkeypatch.setenv(name, "first")
    assert run_on_ranks(rank_fns.environment_variable, 2, name) == ["first", "first"]
    monkeypatch.setenv(name, "second")  # the server is running now: it started with "first" or without
    assert run_on_ranks(rank_fns.environment_variable, 2, name) == ["second", "second"]
    monkeypatch.delenv(name)
    assert run_on_ranks(rank_fns.environment_variable, 2, name) == [None, None]
