"""Context parallelism for diffusion transformers: the token sequence split over the CP group.

A DiT's blocks are per-token except self-attention, so the sequence is split once before the blocks
(``split_sequence``) and gathered once after them (``gather_sequence``). Self-attention needs every
token's K/V; two ways to get them:

- all-gather (``allgather_self_attention``): gather K/V over the group, attend locally. Simple, and the
  K/V of the whole sequence sits on every rank.
- ring (``ring_self_attention``): K/V blocks travel round the ring while each rank folds them into an
  online softmax, so no rank ever holds more than two blocks. Selected by ``enable_ring_attention``.

``enable_ring_attention`` is a tri-state, as in the stage config: ``None`` (default) runs the ring where
it can run and falls back to all-gather otherwise; ``False`` always all-gathers; ``True`` requires the
ring and raises where it cannot run. The ring needs a point-to-point permutation of the group
(``all_to_all``), which process groups without it (or a single rank) cannot do. A ring step's split
sizes depend on the rank, so graph capture (one compiled graph for every rank) takes the all-gather path;
on Trainium the ring attention kernel is what a compiled graph would run instead.

The rank a graph needs to pick its chunk is a tensor argument, never baked in, so every CP rank runs the
same compiled graph.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

from ..errors import BackendUnavailableError, ShardingError
from ..ops.attention import attention
from ..parallel.state import ProcessGroupHandle

# Backends whose process groups implement all_to_all (what a ring step's permutation lowers to). The fake
# group a compile traces on is not one of them.
RING_BACKENDS = ("gloo", "nccl", "xla", "neuron")


def check_sequence_divisible(seq_len: int, cp: ProcessGroupHandle, what: str = "sequence") -> int:
    """Tokens per rank; a clear error when the CP degree does not divide the sequence."""
    if seq_len % cp.world_size:
        raise ShardingError(
            f"context parallelism: the {what} of {seq_len} tokens is not divisible by cp_degree={cp.world_size}"
        )
    return seq_len // cp.world_size


def split_sequence(x: torch.Tensor, cp: ProcessGroupHandle, rank: torch.Tensor, dim: int = 1) -> torch.Tensor:
    """This rank's contiguous chunk of ``x`` along ``dim`` (``rank`` is a 0-d int64 tensor)."""
    if cp.world_size == 1:
        return x
    dim = dim % x.dim()
    check_sequence_divisible(x.shape[dim], cp)
    chunks = x.unflatten(dim, (cp.world_size, -1))
    return chunks.index_select(dim, rank.reshape(1)).squeeze(dim)


def gather_sequence(x: torch.Tensor, cp: ProcessGroupHandle, dim: int = 1) -> torch.Tensor:
    """Inverse of ``split_sequence``: every rank's chunk, concatenated in rank order."""
    return cp.all_gather(x, dim=dim)


def ring_available(cp: ProcessGroupHandle) -> bool:
    """Whether this group can run a ring step here: not on one rank, not on a group without all_to_all,
    and not while a graph is being captured (a compiled graph is shared by every rank)."""
    if cp.world_size == 1 or cp.group is None or torch.compiler.is_compiling():
        return False
    try:
        return dist.get_backend(cp.group) in RING_BACKENDS
    except (RuntimeError, ValueError):
        return False


def use_ring(cp: ProcessGroupHandle, enable_ring_attention: bool | None) -> bool:
    """Resolve the tri-state switch against what this group can do."""
    if enable_ring_attention is False or cp.world_size == 1:
        return False
    available = ring_available(cp)
    if enable_ring_attention is True and not available:
        raise BackendUnavailableError(
            f"enable_ring_attention=true, but the CP group (size {cp.world_size}) cannot run ring attention "
            "here (its process group has no all_to_all, or a shared graph is being captured); set it to "
            "false or leave it unset to all-gather K/V"
        )
    return available


def allgather_self_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cp: ProcessGroupHandle, *, scale: float
) -> torch.Tensor:
    """Local queries ``[B, Tq, H, D]`` against the whole sequence's K/V, gathered along tokens."""
    return attention(q, gather_sequence(k, cp), gather_sequence(v, cp), scale=scale)


def _ring_shift(x: torch.Tensor, cp: ProcessGroupHandle) -> torch.Tensor:
    """Send ``x`` to the next rank of the ring and receive the previous rank's.

    The permutation's split sizes depend on the rank, so a graph holding a ring step is rank-specific;
    on Trainium the ring kernel takes this role (the all-gather path shares one graph across ranks).
    """
    n = cp.world_size
    flat = x.contiguous().reshape(-1)  # all_to_all splits along dim 0
    moved = funcol.permute_tensor(flat, [(i + 1) % n for i in range(n)], cp.group)
    return funcol.wait_tensor(moved).reshape(x.shape)


def ring_self_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cp: ProcessGroupHandle, *, scale: float
) -> torch.Tensor:
    """The same result as ``allgather_self_attention``, with K/V blocks passed round the ring.

    Each step folds one K/V block into a running (max, denominator, numerator) online softmax in
    float32; after ``cp`` steps every rank has seen every block exactly once.
    """
    qh = q.transpose(1, 2)  # [B, H, Tq, D]
    kv = torch.stack([k, v])  # one permutation per step for both
    out = denom = running_max = None
    for step in range(cp.world_size):
        kb, vb = kv[0].transpose(1, 2), kv[1].transpose(1, 2)
        scores = torch.matmul(qh, kb.transpose(-1, -2)).float() * scale
        block_max = scores.amax(dim=-1, keepdim=True)
        if running_max is None:
            new_max = block_max
        else:
            new_max = torch.maximum(running_max, block_max)
        probs = torch.exp(scores - new_max)
        block_out = torch.matmul(probs.to(vb.dtype), vb).float()
        block_den = probs.sum(dim=-1, keepdim=True)
        if running_max is None:
            out, denom = block_out, block_den
        else:
            correction = torch.exp(running_max - new_max)
            out = out * correction + block_out
            denom = denom * correction + block_den
        running_max = new_max
        if step < cp.world_size - 1:
            kv = _ring_shift(kv, cp)
    return (out / denom).to(q.dtype).transpose(1, 2)


def cp_self_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cp: ProcessGroupHandle,
    *,
    scale: float,
    enable_ring_attention: bool | None = None,
) -> torch.Tensor:
    """Self-attention of this rank's query chunk over the whole (CP-split) sequence."""
    if cp.world_size == 1:
        return attention(q, k, v, scale=scale)
    if use_ring(cp, enable_ring_attention):
        return ring_self_attention(q, k, v, cp, scale=scale)
    return allgather_self_attention(q, k, v, cp, scale=scale)
