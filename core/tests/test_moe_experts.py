"""``MoEExperts`` loading: each EP rank reads only its experts; TP cuts each expert's intermediate width
for interleaved (gpt-oss) and gate|up layouts, from [E, in, out] or transposed checkpoints. The ranks
are simulated in-process on torch's fake process group (loading needs no peers); values are compared
with slices taken by hand. Forward correctness under TP/EP is proven end to end by the gpt-oss tests."""

from __future__ import annotations

from contextlib import contextmanager

import pytest
import torch
import torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore

from trnmodels.core.errors import ShardingError
from trnmodels.core.modules import ExpertsCheckpointFormat, MoEExperts
from trnmodels.core.parallel import destroy_parallel_state, init_parallel_state
from trnmodels.core.weights import StateDictCheckpoint, load_parameters
from trnmodels.core.weights.checkpoint import CheckpointTensor

E, H, INTER = 4, 6, 8


@contextmanager
def mesh(rank: int, tp: int, ep: int):
    world = tp * ep
    if world > 1:
        dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world)
    try:
        init_parallel_state(tp, ep_degree=ep)
        yield
    finally:
        destroy_parallel_state()
        if world > 1:
            dist.destroy_process_group()


class RecordingCheckpoint(StateDictCheckpoint):
    """Records which experts (dim-0 indices) each tensor read touched."""

    def __init__(self, tensors):
        super().__init__(tensors)
        self.reads: dict[str, list] = {}

    def tensor(self, key: str) -> CheckpointTensor:
        inner = super().tensor(key)
        reads = self.reads.setdefault(key, [])

        class Source:
            def __getitem__(self, index):
                first = index[0] if isinstance(index, tuple) else index
                reads.append(range(E)[first])
                return inner.source[index]

        return CheckpointTensor(key, inner.file, inner.shape, Source())


def weights(transposed: bool) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    gate_up = torch.randn(E, H, 2 * INTER, generator=g)
    down = torch.randn(E, INTER, H, generator=g)
    return {
        "gate_up": gate_up.transpose(1, 2).contiguous() if transposed else gate_up,
        "down": down.transpose(1, 2).contiguous() if transposed else down,
        "gate_up_bias": torch.randn(E, 2 * INTER, generator=g),
        "down_bias": torch.randn(E, H, generator=g),
        "reference_gate_up": gate_up,
        "reference_down": down,
    }


MAPPING = {n: n for n in ("gate_up", "down", "gate_up_bias", "down_bias")}


@pytest.mark.parametrize("act", ["swiglu_clamped", "silu"])
@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("rank,tp,ep", [(0, 1, 2), (1, 1, 2), (3, 2, 2), (1, 2, 1)])
def test_rank_holds_and_reads_only_its_slice(act, transposed, rank, tp, ep):
    w = weights(transposed)
    ckpt = RecordingCheckpoint({k: v for k, v in w.items() if not k.startswith("reference")})
    tp_rank, ep_rank = rank % tp, rank // tp
    with mesh(rank, tp, ep):
        experts = MoEExperts(
            E, H, INTER, act=act, bias=True, checkpoint_format=ExpertsCheckpointFormat(transposed=transposed)
        )
        load_parameters(experts, ckpt, MAPPING, rank=tp_rank, world_size=tp, progress=False)
    mine = slice(ep_rank * E // ep, (ep_rank + 1) * E // ep)
    part = INTER // tp
    units = slice(tp_rank * part, (tp_rank + 1) * part)
    gate_up = w["reference_gate_up"][mine]
    if act == "swiglu_clamped":  # interleaved pairs: gate_up[..., 2i] and [..., 2i + 1] belong to unit i
        expected = gate_up[..., 2 * units.start : 2 * units.stop]
    else:
        expected = torch.cat([gate_up[..., :INTER][..., units], gate_up[..., INTER:][..., units]], -1)
    torch.testing.assert_close(experts.gate_up, expected, rtol=0, atol=0)
    torch.testing.assert_close(experts.down, w["reference_down"][mine][:, units], rtol=0, atol=0)
    torch.testing.assert_close(experts.down_bias, w["down_bias"][mine], rtol=0, atol=0)
    for key, reads in ckpt.reads.items():
        assert all(r == range(E)[mine] for r in reads), f"{key} read experts {reads}, owns {mine}"


def test_ep_degree_that_does_not_divide_the_experts():
    with (
        mesh(0, 1, 3),
        pytest.raises(ShardingError, match=r"ep_degree=3 does not divide num_local_experts=4"),
    ):
        MoEExperts(E, H, INTER)
