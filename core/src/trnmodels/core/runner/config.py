"""Runner settings: batch limits, the bucket lists every compiled graph is shaped by, and sampling.

A bucket is one static shape. Prefill pads its flat tokens to a ``num_batched_tokens_buckets`` entry;
decode pads its batch to a ``num_seqs_buckets`` entry and its longest context to a
``context_len_buckets`` entry. Defaults are powers of two up to the configured maximum, which is always
the last bucket.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from ..errors import ConfigError, InputError


def powers_of_two(smallest: int, largest: int) -> tuple[int, ...]:
    """``smallest, 2*smallest, …`` below ``largest``, then ``largest`` itself."""
    buckets, b = [], smallest
    while b < largest:
        buckets.append(b)
        b *= 2
    return (*buckets, largest)


def check_buckets(name: str, buckets: Sequence[int], maximum: int, what: str) -> tuple[int, ...]:
    if not buckets:
        raise ConfigError(f"{name}: needs at least one bucket")
    if any(not isinstance(b, int) or b < 1 for b in buckets):
        raise ConfigError(f"{name}: buckets must be positive integers, got {list(buckets)}")
    if any(a >= b for a, b in itertools.pairwise(buckets)):
        raise ConfigError(f"{name}: buckets must be strictly ascending, got {list(buckets)}")
    if buckets[-1] < maximum:
        raise ConfigError(f"{name}: the largest bucket {buckets[-1]} cannot hold {what} = {maximum}")
    return tuple(buckets)


@dataclass(frozen=True)
class RunnerConfig:
    """``max_model_len`` bounds prompt plus generated tokens; a whole prompt prefills in one step, so
    the largest token bucket must hold ``max_model_len``."""

    max_num_seqs: int = 8
    max_model_len: int = 256
    block_size: int = 32
    num_batched_tokens_buckets: tuple[int, ...] | None = None
    num_seqs_buckets: tuple[int, ...] | None = None
    context_len_buckets: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        for name in ("max_num_seqs", "max_model_len", "block_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name}: expected a positive integer, got {value!r}")
        tokens = self.num_batched_tokens_buckets or powers_of_two(
            min(128, self.max_model_len), self.max_model_len
        )
        seqs = self.num_seqs_buckets or powers_of_two(1, self.max_num_seqs)
        ctx_max = math.ceil(self.max_model_len / self.block_size) * self.block_size
        ctx = self.context_len_buckets or powers_of_two(min(self.block_size * 4, ctx_max), ctx_max)
        object.__setattr__(
            self,
            "num_batched_tokens_buckets",
            check_buckets("num_batched_tokens_buckets", tokens, self.max_model_len, "max_model_len"),
        )
        object.__setattr__(
            self,
            "num_seqs_buckets",
            check_buckets("num_seqs_buckets", seqs, self.max_num_seqs, "max_num_seqs"),
        )
        object.__setattr__(
            self,
            "context_len_buckets",
            check_buckets("context_len_buckets", ctx, self.max_model_len, "max_model_len"),
        )
        bad = [c for c in self.context_len_buckets if c % self.block_size]
        if bad:
            raise ConfigError(f"context_len_buckets: {bad} are not multiples of block_size={self.block_size}")

    @property
    def blocks_per_seq(self) -> int:
        return math.ceil(self.max_model_len / self.block_size)

    @property
    def num_blocks(self) -> int:
        """Enough for ``max_num_seqs`` full-length sequences, plus the null block."""
        return self.max_num_seqs * self.blocks_per_seq + 1


def pick_bucket(buckets: Sequence[int], size: int) -> int:
    for b in buckets:
        if b >= size:
            return b
    raise InputError(f"size {size} exceeds the largest bucket {buckets[-1]}")


@dataclass(frozen=True)
class SamplingParams:
    """``temperature=0`` is greedy. ``top_k <= 0`` and ``top_p = 1`` switch those filters off.
    ``seed`` (an integer in ``[0, 2**64 - 1]``) makes sampling reproducible; without it a request draws
    from a random seed. NaN or inf is refused everywhere (NaN compares false with every bound)."""

    max_new_tokens: int = 16
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    ignore_eos: bool = False
    stop_token_ids: tuple[int, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise InputError(f"max_new_tokens: expected a positive integer, got {self.max_new_tokens!r}")
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise InputError(f"temperature: expected a finite number >= 0, got {self.temperature}")
        if not (math.isfinite(self.top_p) and 0 < self.top_p <= 1):
            raise InputError(f"top_p: expected a value in (0, 1], got {self.top_p}")
        if self.seed is not None and (
            isinstance(self.seed, bool) or not isinstance(self.seed, int) or not 0 <= self.seed < 1 << 64
        ):
            raise InputError(f"seed: expected an integer in [0, 2**64 - 1], got {self.seed!r}")
