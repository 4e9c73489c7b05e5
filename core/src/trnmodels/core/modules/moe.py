"""Expert-parallel MoE experts: each rank holds and loads only its experts, TP-split inside them.

Expert parallelism (``ep_degree``) splits the expert list: EP rank ``r`` owns experts
``[r * E / ep, (r + 1) * E / ep)``. Tensor parallelism splits each owned expert's intermediate width, as
in a dense MLP. Every rank sees every token (attention is replicated across EP groups), runs its experts
on all of them with the routing weight of tokens that chose another rank's expert set to zero
(``ops.combine_matrix``), and one all-reduce over the TP x EP ranks sums the partial outputs: each token's
output then holds exactly the work of the experts it chose, wherever they live. Static shapes throughout,
so the same graph serves every rank; the rank arrives as a tensor.

Checkpoint layouts differ by model, so the loader is chosen by ``ExpertsCheckpointFormat``: fused tensors
stored ``[E, in, out]`` (gpt-oss BF16) or ``[E, out, in]`` (transposed: Gemma 4), MXFP4
``*_blocks``/``*_scales`` pairs (gpt-oss's published form), dequantized at load, or one ``nn.Linear``
weight per expert and projection (per_expert: Mixtral's ``experts.{j}.w1/w3/w2``, Qwen-MoE's
``experts.{j}.gate_proj/up_proj/down_proj``; ``per_expert_keys`` names them).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from .. import ops
from ..errors import CheckpointError, ConfigError, ShardingError
from ..ops.mlp import activation
from ..parallel.layers import check_divisible
from ..parallel.state import get_ep_group, get_parallel_layout, get_tp_group, get_world_group
from ..quant.mxfp4 import mxfp4_loader
from ..weights.checkpoint import CheckpointTensor
from ..weights.load import KeyDict
from ..weights.loaders import WeightLoader, set_weight_loader

INTERLEAVED = "swiglu_clamped"
"""The activation whose ``gate_up`` columns interleave gate and up (gpt-oss); others take halves."""


@dataclass(frozen=True)
class ExpertsCheckpointFormat:
    """How the checkpoint stores the ``gate_up`` and ``down`` expert weights.

    ``transposed=False``: ``[E, in, out]`` (gpt-oss). ``transposed=True``: ``[E, out, in]`` (nn.Linear
    order). ``mxfp4=True``: each weight maps to ``[blocks_key, scales_key]`` and is dequantized.
    ``per_expert=True``: one ``nn.Linear`` weight ``[out, in]`` per expert and projection; ``gate_up``
    maps to the ``2E`` keys ``[gate_0, up_0, gate_1, up_1, ...]`` and ``down`` to the ``E`` keys
    ``[down_0, ...]`` (``per_expert_keys`` builds both lists). Each rank reads only its experts' keys.
    """

    transposed: bool = False
    mxfp4: bool = False
    per_expert: bool = False


def per_expert_keys(
    prefix: str, num_experts: int, gate: str = "w1", up: str = "w3", down: str = "w2"
) -> KeyDict:
    """``MoEExperts`` weights → per-expert checkpoint keys ``{prefix}{j}.{name}.weight``, for
    ``ExpertsCheckpointFormat(per_expert=True)``. The defaults are Mixtral's names; Qwen-MoE passes
    ``gate_proj``, ``up_proj``, ``down_proj``."""
    return {
        "gate_up": [f"{prefix}{j}.{name}.weight" for j in range(num_experts) for name in (gate, up)],
        "down": [f"{prefix}{j}.{down}.weight" for j in range(num_experts)],
    }


def experts_per_rank(num_experts: int, ep_degree: int) -> int:
    if num_experts % ep_degree:
        raise ShardingError(
            f"ep_degree={ep_degree} does not divide num_local_experts={num_experts}: every EP rank must hold "
            f"the same number of experts (try an ep_degree among "
            f"{[d for d in range(1, num_experts + 1) if num_experts % d == 0]})"
        )
    return num_experts // ep_degree


def _intermediate_columns(
    w: torch.Tensor, intermediate: int, interleaved: bool, rank: int, world_size: int
) -> torch.Tensor:
    """This TP rank's part of a ``[..., 2I]`` gate_up tensor (interleaved pairs, or gate | up halves)."""
    if w.shape[-1] != 2 * intermediate:
        raise CheckpointError(f"gate_up: last dim {w.shape[-1]} is not 2 x intermediate_size {intermediate}")
    part = intermediate // world_size
    if interleaved:  # gate/up pairs sit side by side, so a rank's units are one contiguous run
        return w[..., 2 * rank * part : 2 * (rank + 1) * part]
    gate, up = w[..., :intermediate], w[..., intermediate:]
    return torch.cat(
        [gate[..., rank * part : (rank + 1) * part], up[..., rank * part : (rank + 1) * part]], -1
    )


def _expert_weights(experts: int, fan_in: int, fan_out: int, dtype: torch.dtype) -> torch.Tensor:
    """An ``[experts, fan_in, fan_out]`` tensor. Below FP32 it is laid out as ``[experts, fan_out, fan_in]``
    in memory (nn.Linear's order): ``ops.experts_ffn``'s matmuls then reduce over contiguous memory, which
    a CPU without BF16 arithmetic needs to run a BF16 matmul fast (20-50x). FP32 matmuls are as fast
    either way, so FP32 keeps the checkpoints' ``[E, in, out]`` order and loads without a transposing
    copy (2 GB/s here, against 20 GB/s for a plain copy). Loading copies into the layout and keeps it."""
    if dtype == torch.float32:
        return torch.empty(experts, fan_in, fan_out, dtype=dtype)
    return torch.empty(experts, fan_out, fan_in, dtype=dtype).transpose(1, 2)


class MoEExperts(nn.Module):
    """This rank's ``E / ep`` experts: ``gate_up [E_local, H, 2 I_local]``, ``down [E_local, I_local, H]``.

    ``forward(x [T, H], weights [T, k], experts [T, k], rank)`` returns the summed output of the chosen
    experts, ``[T, H]``, already reduced over the TP x EP ranks.
    """

    def __init__(
        self,
        num_experts: int,
        hidden_size: int,
        intermediate_size: int,
        *,
        act: str = INTERLEAVED,
        bias: bool = False,
        alpha: float = 1.702,
        limit: float = 7.0,
        checkpoint_format: ExpertsCheckpointFormat = ExpertsCheckpointFormat(),
        dtype: torch.dtype = torch.float32,
    ):
        super().__init__()
        if checkpoint_format.per_expert and (bias or checkpoint_format.mxfp4 or checkpoint_format.transposed):
            raise ConfigError(
                "ExpertsCheckpointFormat(per_expert=True) takes unbiased nn.Linear weights only "
                "(no bias, mxfp4 or transposed)"
            )
        if act != INTERLEAVED:
            activation(act)  # fail at build, not at the first forward
        self.tp, self.ep, self.world = get_tp_group(), get_ep_group(), get_world_group()
        self.layout = get_parallel_layout()
        self.num_experts = num_experts
        self.act, self.alpha, self.limit = act, alpha, limit
        self.intermediate_size = intermediate_size
        self.num_local = experts_per_rank(num_experts, self.ep.world_size)
        self.first_expert = self.ep.rank * self.num_local
        inter = check_divisible("intermediate_size", intermediate_size, self.tp.world_size)
        self.gate_up = nn.Parameter(_expert_weights(self.num_local, hidden_size, 2 * inter, dtype), False)
        self.down = nn.Parameter(_expert_weights(self.num_local, inter, hidden_size, dtype), False)
        self.gate_up_bias = (
            nn.Parameter(torch.empty(self.num_local, 2 * inter, dtype=dtype), False) if bias else None
        )
        self.down_bias = (
            nn.Parameter(torch.empty(self.num_local, hidden_size, dtype=dtype), False) if bias else None
        )
        self.checkpoint_format = checkpoint_format
        self._attach_loaders()

    # -- loading ------------------------------------------------------------------------------------------

    def _experts(self) -> slice:
        return slice(self.first_expert, self.first_expert + self.num_local)

    def _read(self, tensors: Sequence[CheckpointTensor], is_weight: bool) -> torch.Tensor:
        """This EP rank's experts of one tensor, as ``[E_local, in, out]`` (weights) or ``[E_local, n]``."""
        fmt = self.checkpoint_format
        if is_weight and fmt.mxfp4:
            return mxfp4_loader(self._experts(), dtype=torch.float32)(tensors, 0, 1)
        if len(tensors) != 1:
            raise CheckpointError(f"expected one checkpoint key, got {[t.key for t in tensors]}")
        (t,) = tensors
        want = 3 if is_weight else 2
        if len(t.shape) != want or t.shape[0] != self.num_experts:
            raise CheckpointError(
                f"{t.describe()}: expected {want} dims with {self.num_experts} experts first"
            )
        value = t.read(self._experts())
        return value.transpose(1, 2) if is_weight and fmt.transposed else value

    def _per_expert(
        self, tensors: Sequence[CheckpointTensor], per_expert: int, shape: tuple[int, int]
    ) -> list[list[CheckpointTensor]]:
        """This EP rank's experts' keys, ``per_expert`` consecutive keys each, every one ``shape``."""
        if len(tensors) != per_expert * self.num_experts:
            raise CheckpointError(
                f"expected {per_expert} x {self.num_experts} per-expert keys, got {len(tensors)} "
                f"(first: {tensors[0].key if tensors else None})"
            )
        for t in tensors:
            if tuple(t.shape) != shape:
                raise CheckpointError(f"{t.describe()}: expected shape {list(shape)} (nn.Linear [out, in])")
        mine = range(self.num_experts)[self._experts()]
        return [list(tensors[per_expert * j : per_expert * (j + 1)]) for j in mine]

    def _per_expert_gate_up(
        self, tensors: Sequence[CheckpointTensor], rank: int, world_size: int
    ) -> torch.Tensor:
        """``[E_local, H, 2 I_local]`` from this rank's rows of each local expert's gate and up weights."""
        hidden = self.gate_up.shape[1]
        part = self.intermediate_size // world_size
        rows = slice(rank * part, (rank + 1) * part)
        experts = []
        for gate, up in self._per_expert(tensors, 2, (self.intermediate_size, hidden)):
            g, u = gate.read(rows).T, up.read(rows).T
            if self.act == INTERLEAVED:  # unit i's gate and up sit side by side: columns 2i, 2i + 1
                experts.append(torch.stack((g, u), dim=-1).reshape(hidden, 2 * part))
            else:
                experts.append(torch.cat((g, u), dim=-1))
        return torch.stack(experts)

    def _per_expert_down(
        self, tensors: Sequence[CheckpointTensor], rank: int, world_size: int
    ) -> torch.Tensor:
        """``[E_local, I_local, H]`` from this rank's columns of each local expert's down weight."""
        hidden = self.down.shape[2]
        part = self.intermediate_size // world_size
        cols = (slice(None), slice(rank * part, (rank + 1) * part))
        pairs = self._per_expert(tensors, 1, (hidden, self.intermediate_size))
        return torch.stack([down.read(cols).T for (down,) in pairs])

    def _gate_up_loader(self, is_weight: bool) -> WeightLoader:
        def load(tensors: Sequence[CheckpointTensor], rank: int, world_size: int) -> torch.Tensor:
            if self.checkpoint_format.per_expert:
                return self._per_expert_gate_up(tensors, rank, world_size).contiguous()
            value = self._read(tensors, is_weight)
            return _intermediate_columns(
                value, self.intermediate_size, self.act == INTERLEAVED, rank, world_size
            ).contiguous()

        return load

    def _down_loader(self) -> WeightLoader:
        def load(tensors: Sequence[CheckpointTensor], rank: int, world_size: int) -> torch.Tensor:
            if self.checkpoint_format.per_expert:
                return self._per_expert_down(tensors, rank, world_size).contiguous()
            value = self._read(tensors, is_weight=True)
            part = value.shape[1] // world_size
            return value[:, rank * part : (rank + 1) * part].contiguous()

        return load

    def _down_bias_loader(self) -> WeightLoader:
        def load(tensors: Sequence[CheckpointTensor], rank: int, world_size: int) -> torch.Tensor:
            return self._read(tensors, is_weight=False)

        return load

    def _attach_loaders(self) -> None:
        set_weight_loader(self.gate_up, self._gate_up_loader(is_weight=True))
        set_weight_loader(self.down, self._down_loader())
        if self.gate_up_bias is not None and self.down_bias is not None:
            set_weight_loader(self.gate_up_bias, self._gate_up_loader(is_weight=False))
            set_weight_loader(self.down_bias, self._down_bias_loader())

    # -- forward ------------------------------------------------------------------------------------------

    def forward(
        self, x: torch.Tensor, weights: torch.Tensor, experts: torch.Tensor, rank: torch.Tensor
    ) -> torch.Tensor:
        first_expert = self.layout.coord_tensor(rank, "ep") * self.num_local
        combine = ops.combine_matrix(weights, experts, self.num_local, first_expert)
        down_bias = self.down_bias
        if down_bias is not None and self.tp.world_size > 1:
            # Each TP rank holds the whole bias; only TP rank 0 adds it, so the all-reduce counts it once.
            down_bias = down_bias * (self.layout.coord_tensor(rank, "tp") == 0).to(down_bias.dtype)
        partial = ops.experts_ffn(
            x,
            self.gate_up,
            self.down,
            combine,
            act=self.act,
            gate_up_bias=self.gate_up_bias,
            down_bias=down_bias,
            alpha=self.alpha,
            limit=self.limit,
            top_k=experts.shape[1],
        )
        return self.world.all_reduce(partial)
