"""The paged KV cache: what a model needs (``KVSpec``), and how tokens map to cache slots.

Layout per layer: one K and one V tensor ``[num_blocks, num_kv_heads, block_size, head_dim]``.
A token at position p of a sequence lives in slot ``block_table[p // block_size] * block_size +
p % block_size``.

Padding rule: block 0 is the null block. The allocator never hands it out, and every padding token
(in a padded prefill or a padded decode batch) writes its K/V into block 0, so padding can never
overwrite a live slot. A slot of -1 is never used, because indexed writes wrap negative indices.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, overload

import torch

from .errors import ConfigError

NULL_BLOCK = 0


@dataclass(frozen=True)
class LayerSpec:
    """One attention layer's cache: KV heads on this rank, head size, dtype and optional sliding window."""

    name: str
    num_kv_heads: int
    head_dim: int
    dtype: torch.dtype
    sliding_window: int | None = None


@dataclass(frozen=True)
class KVSpec:
    layers: tuple[LayerSpec, ...]
    block_size: int = 32

    def __post_init__(self) -> None:
        names = [layer.name for layer in self.layers]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ConfigError(f"KVSpec: duplicate layer names {duplicates}")

    def bytes_per_block(self) -> int:
        return sum(
            2 * layer.num_kv_heads * self.block_size * layer.head_dim * layer.dtype.itemsize
            for layer in self.layers
        )


def allocate_kv_cache(
    spec: KVSpec, num_blocks: int, device: torch.device | str = "cpu"
) -> dict[str, list[torch.Tensor]]:
    """Zero-filled K and V per layer (zeros keep never-written slots finite under masking)."""
    return {
        layer.name: [
            torch.zeros(
                num_blocks,
                layer.num_kv_heads,
                spec.block_size,
                layer.head_dim,
                dtype=layer.dtype,
                device=device,
            )
            for _ in range(2)
        ]
        for layer in spec.layers
    }


@overload
def slot_mapping(block_table: torch.Tensor, positions: torch.Tensor, block_size: int) -> torch.Tensor: ...
@overload
def slot_mapping(block_table: Sequence[int], positions: int, block_size: int) -> int: ...
def slot_mapping(block_table: Any, positions: Any, block_size: int) -> Any:
    """Cache slots of ``positions`` in a sequence with ``block_table``: both 1-D tensors, or the block ids
    and one position as ints (a runner building a step's inputs on the host)."""
    return block_table[positions // block_size] * block_size + positions % block_size


def null_slots(count: int, block_size: int) -> torch.Tensor:
    """Slots for padding tokens: distinct slots of the null block, wrapping when there are more."""
    return torch.arange(count, dtype=torch.int64) % block_size + NULL_BLOCK * block_size


def write_kv(
    k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slots: torch.Tensor
) -> None:
    """Write ``k/v [T, Hkv, D]`` into the caches at ``slots [T]``, in place."""
    eager_cpu = (
        not torch.compiler.is_compiling()
        and k_cache.is_cpu
        and k_cache.is_contiguous()
        and v_cache.is_contiguous()
        and k_cache.shape == v_cache.shape
    )
    if eager_cpu:
        # Every layer of a step writes at the same slots: their rows in the flat caches are computed once
        # and looked up by value. One index_copy_ per cache then costs about a third of the per-layer
        # division, remainder and two indexed assignments (12.6 -> 5 us a layer at batch 1).
        _, hkv, block_size, d = k_cache.shape
        rows = _cache_rows(tuple(slots.tolist()), hkv, block_size)
        k_cache.view(-1, d).index_copy_(0, rows, k.to(k_cache.dtype).reshape(-1, d))
        v_cache.view(-1, d).index_copy_(0, rows, v.to(v_cache.dtype).reshape(-1, d))
        return
    block_size = k_cache.shape[2]
    blocks, offsets = slots // block_size, slots % block_size
    k_cache[blocks, :, offsets] = k.to(k_cache.dtype)
    v_cache[blocks, :, offsets] = v.to(v_cache.dtype)


def cache_rows(slots: torch.Tensor, num_kv_heads: int, block_size: int) -> torch.Tensor:
    """``[..., Hkv]``: the rows of a cache viewed as ``[blocks * Hkv * block_size, D]`` that hold the K/V
    of ``slots [...]``, head by head (one ``index_select`` or ``index_copy_`` then reaches them all)."""
    start = slots // block_size * (num_kv_heads * block_size) + slots % block_size
    return start[..., None] + torch.arange(num_kv_heads) * block_size


@functools.lru_cache(maxsize=8)
def _cache_rows(slots: tuple[int, ...], num_kv_heads: int, block_size: int) -> torch.Tensor:
    """``cache_rows`` of a step's slots, flat: every layer of the step looks them up by value."""
    with torch.inference_mode(False):  # rows made inside a step are reused outside one
        return cache_rows(torch.tensor(slots, dtype=torch.int64), num_kv_heads, block_size).reshape(-1)


def read_kv(
    k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The K/V at ``slots [T]`` as ``[T, Hkv, D]`` each: the inverse of ``write_kv``."""
    block_size = k_cache.shape[2]
    blocks, offsets = slots // block_size, slots % block_size
    return k_cache[blocks, :, offsets], v_cache[blocks, :, offsets]


def read_sequence_kv(cache: torch.Tensor, block_table: torch.Tensor, length: int) -> torch.Tensor:
    """One sequence's first ``length`` cached entries as ``[num_kv_heads, length, head_dim]``."""
    positions = torch.arange(length)
    slots = slot_mapping(block_table, positions, cache.shape[2])
    return cache[slots // cache.shape[2], :, slots % cache.shape[2]].transpose(0, 1)


@dataclass
class BlockAllocator:
    """Hands out cache blocks; block 0 (the null block) is reserved for padding writes."""

    num_blocks: int
    _free: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.num_blocks < 2:
            raise ConfigError(f"num_blocks: need at least 2 (one is the null block), got {self.num_blocks}")
        self._free = list(range(self.num_blocks - 1, NULL_BLOCK, -1))

    @property
    def num_free(self) -> int:
        return len(self._free)

    def allocate(self, count: int) -> list[int]:
        if count > len(self._free):
            raise ConfigError(
                f"KV cache: {count} blocks requested, {len(self._free)} free of {self.num_blocks}"
            )
        taken, self._free = self._free[len(self._free) - count :][::-1], self._free[: len(self._free) - count]
        return taken

    def free(self, blocks: list[int]) -> None:
        self._free.extend(reversed(blocks))
