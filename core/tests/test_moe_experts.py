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
from trnmodels.core.modules import ExpertsCheckpointFormat, MoEExperts, per_expert_keys
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


def per_expert_checkpoint(seed: int = 1) -> dict[str, torch.Tensor]:
    """Mixtral's layout: ``experts.{j}.w1`` (gate) / ``w3`` (up) ``[I, H]``, ``w2`` (down) ``[H, I]``."""
    g = torch.Generator().manual_seed(seed)
    return {
        f"experts.{j}.{name}.weight": torch.randn(*shape, generator=g) * 0.3
        for j in range(E)
        for name, shape in (("w1", (INTER, H)), ("w3", (INTER, H)), ("w2", (H, INTER)))
    }


def mixtral_experts_reference(ckpt, x, weights, experts) -> torch.Tensor:
    """Hand-computed: each token sums ``w · W2 (silu(W1 x) * W3 x)`` over its chosen experts."""
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for w, j in zip(weights[t], experts[t], strict=True):
            w1, w2, w3 = (ckpt[f"experts.{int(j)}.{n}.weight"] for n in ("w1", "w2", "w3"))
            out[t] += w * (w2 @ (torch.nn.functional.silu(w1 @ x[t]) * (w3 @ x[t])))
    return out


@pytest.mark.parametrize("tp,ep", [(1, 1), (1, 2), (2, 1), (2, 2)])
def test_per_expert_layout_matches_the_hand_computed_experts(tp, ep):
    """Every rank loads only its experts' keys and its TP slice; the partial outputs of all ranks (summed
    here by hand, as the all-reduce would) equal the reference."""
    ckpt = per_expert_checkpoint()
    g = torch.Generator().manual_seed(2)
    x = torch.randn(5, H, generator=g)
    weights = torch.softmax(torch.randn(5, 2, generator=g), -1)
    chosen = torch.tensor([[0, 3], [1, 2], [2, 0], [3, 1], [1, 0]])
    keys = per_expert_keys("experts.", E)
    total = torch.zeros_like(x)
    for rank in range(tp * ep):
        recording = RecordingCheckpoint(ckpt)
        with mesh(rank, tp, ep):
            experts = MoEExperts(
                E, H, INTER, act="silu", checkpoint_format=ExpertsCheckpointFormat(per_expert=True)
            )
            load_parameters(experts, recording, keys, rank=rank % tp, world_size=tp, progress=False)
            # The fake process group's all-reduce returns this rank's partial sum unchanged.
            total += experts(x, weights, chosen, torch.tensor(rank))
        owned = {f"experts.{j}." for j in range(E)[rank // tp * E // ep : (rank // tp + 1) * E // ep]}
        assert {k.rsplit(".", 2)[0] + "." for k, r in recording.reads.items() if r} == owned
    torch.testing.assert_close(total, mixtral_experts_reference(ckpt, x, weights, chosen))


def test_per_expert_layout_interleaves_gate_and_up_for_swiglu_clamped():
    ckpt = per_expert_checkpoint()
    with mesh(1, 2, 1):
        experts = MoEExperts(E, H, INTER, checkpoint_format=ExpertsCheckpointFormat(per_expert=True))
        load_parameters(
            experts, StateDictCheckpoint(ckpt), per_expert_keys("experts.", E), rank=1, world_size=2
        )
    part = INTER // 2
    for j in range(E):
        gate = ckpt[f"experts.{j}.w1.weight"][part:].T
        up = ckpt[f"experts.{j}.w3.weight"][part:].T
        torch.testing.assert_close(experts.gate_up[j][:, 0::2], gate, rtol=0, atol=0)
        torch.testing.assert_close(experts.gate_up[j][:, 1::2], up, rtol=0, atol=0)
        torch.testing.assert_close(
            experts.down[j], ckpt[f"experts.{j}.w2.weight"][:, part:].T, rtol=0, atol=0
        )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_bf16_experts_reduce_over_contiguous_memory_after_loading(dtype):
    """BF16 expert weights sit in [E, out, in] memory behind their [E, in, out] shape (a CPU without BF16
    arithmetic runs the experts' matmuls 20-50x slower otherwise); FP32 keeps [E, in, out]. Loading keeps
    the layout and the values."""
    w = weights(transposed=False)
    with mesh(0, 1, 1):
        experts = MoEExperts(E, H, INTER, bias=True, dtype=dtype)
        ckpt = StateDictCheckpoint({k: v for k, v in w.items() if not k.startswith("reference")})
        load_parameters(experts, ckpt, MAPPING, rank=0, world_size=1, progress=False)
    for name in ("gate_up", "down"):
        param = getattr(experts, name)
        assert param.is_contiguous() == (dtype == torch.float32), name
        assert param.transpose(1, 2).is_contiguous() == (dtype == torch.bfloat16), name
        torch.testing.assert_close(param, w[f"reference_{name}"].to(dtype), rtol=0, atol=0)
