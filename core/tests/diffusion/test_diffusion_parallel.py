"""Context and CFG parallelism on 2 gloo ranks, against single-rank references computed here."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
import torch

from trnmodels.core.diffusion import SequentialCFG, combine_cfg, cp_self_attention, split_sequence, use_ring
from trnmodels.core.errors import ShardingError
from trnmodels.core.ops import attention
from trnmodels.core.parallel import ParallelLayout, ProcessGroupHandle
from trnmodels.core.parallel.launch import run_on_ranks

HERE = Path(__file__).parent


@pytest.fixture(scope="module")
def inputs():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 12, 5, generator=g)
    q, k, v = (torch.randn(2, 12, 3, 8, generator=g) for _ in range(3))
    cond, uncond = torch.randn(2, 4, generator=g), torch.randn(2, 4, generator=g)
    return x, q, k, v, cond, uncond


@pytest.fixture(scope="module")
def ranks(inputs):
    mp = pytest.MonkeyPatch()
    mp.syspath_prepend(str(HERE))
    try:
        fns = importlib.import_module("_diffusion_rank_fns")
        return run_on_ranks(fns.cp_and_cfg_checks, ParallelLayout(cp=2), *inputs)
    finally:
        mp.undo()


@pytest.mark.slow  # the 2-rank spawn (`ranks`); the single-rank tests below stay fast
def test_split_and_gather_sequence(ranks, inputs):
    x = inputs[0]
    for r in ranks:
        torch.testing.assert_close(r["chunk"], x[:, r["rank"] * 6 : (r["rank"] + 1) * 6], rtol=0, atol=0)
        torch.testing.assert_close(r["regathered"], x, rtol=0, atol=0)


@pytest.mark.slow
@pytest.mark.parametrize("path", ["allgather", "ring"])
def test_cp_self_attention_matches_full_attention(ranks, inputs, path):
    _, q, k, v, _, _ = inputs
    expected = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    ).transpose(1, 2)
    for r in ranks:
        torch.testing.assert_close(r[path], expected, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_ring_switch(ranks):
    for r in ranks:
        assert r["ring_available"] and r["use_ring_auto"]
        assert r["use_ring_off"] is False


@pytest.mark.slow
def test_cfg_parallel_matches_sequential(ranks, inputs):
    *_, cond, uncond = inputs
    expected = SequentialCFG().predict_noise_with_cfg(lambda e: e * 2.0, cond, uncond, 3.5)
    torch.testing.assert_close(expected, uncond * 2 + 3.5 * (cond * 2 - uncond * 2))
    for r in ranks:
        torch.testing.assert_close(r["cfg"], expected, rtol=0, atol=0)
        # Each rank ran exactly its own branch.
        branch = cond if r["rank"] == 0 else uncond
        assert r["cfg_calls"] == [pytest.approx(float((branch).sum()))]
        assert "guidance is disabled" in r["no_guidance_error"]


def test_single_rank_paths():
    single = ProcessGroupHandle("cp", 1, 0, None)
    q = torch.randn(1, 4, 2, 8)
    torch.testing.assert_close(cp_self_attention(q, q, q, single, scale=0.3), attention(q, q, q, scale=0.3))
    assert split_sequence(q, single, torch.tensor(0)) is q
    assert use_ring(single, True) is False
    torch.testing.assert_close(combine_cfg(torch.ones(2), torch.zeros(2), 5.0), torch.full((2,), 5.0))


def test_indivisible_sequence_is_refused():
    two = ProcessGroupHandle("cp", 2, 0, None)
    with pytest.raises(ShardingError, match="13 tokens is not divisible by cp_degree=2"):
        split_sequence(torch.zeros(1, 13, 4), two, torch.tensor(0))


def test_ring_falls_back_where_it_cannot_run():
    """A group without all_to_all (the fake group compiles trace on): auto and off take the all-gather
    path, and requiring the ring is a clear error."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from trnmodels.core.errors import BackendUnavailableError

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    try:
        fake = ProcessGroupHandle("cp", 2, 0, dist.group.WORLD)
        assert use_ring(fake, None) is False
        assert use_ring(fake, False) is False
        with pytest.raises(BackendUnavailableError, match="cannot run ring attention"):
            use_ring(fake, True)
    finally:
        dist.destroy_process_group()


def test_cfg_mixin_sits_ahead_of_the_upstream_pipeline():
    from trnmodels.core.diffusion import CFGParallelMixin

    class Upstream:
        def __call__(self):
            return "upstream"

    class Pipeline(CFGParallelMixin, Upstream):
        pass

    mro = Pipeline.__mro__
    assert mro.index(CFGParallelMixin) < mro.index(SequentialCFG) < mro.index(Upstream)
    # CFG group of 1: the mixin defers to the sequential form (both branches here, in order).
    seen = []
    out = Pipeline().predict_noise_with_cfg(lambda e: seen.append(e) or e, torch.ones(2), torch.zeros(2), 4.0)
    assert len(seen) == 2 and torch.equal(seen[0], torch.ones(2))
    torch.testing.assert_close(out, torch.full((2,), 4.0))
    Pipeline().check_cfg_parallel(False)  # nothing to split on one rank: guidance off is fine
