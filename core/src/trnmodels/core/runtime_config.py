"""The runtime config: how a model is run (parallelism, dtype, cache), as opposed to what the model is."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .errors import ConfigError

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}


def parse_dtype(name: str | torch.dtype) -> torch.dtype:
    """Accept ``"bfloat16"``/``torch.bfloat16``; anything else is a named error."""
    if isinstance(name, torch.dtype):
        if name not in DTYPES.values():
            raise ConfigError(f"dtype: expected one of {sorted(DTYPES)}, got {name}")
        return name
    try:
        return DTYPES[name]
    except KeyError:
        raise ConfigError(f"dtype: expected one of {sorted(DTYPES)}, got {name!r}") from None


@dataclass(frozen=True)
class NeuronConfig:
    """Runtime settings shared by every plugin.

    ``tp_degree`` splits attention heads and MLP width over ranks; ``ep_degree`` splits MoE experts (the
    world size is ``tp_degree * ep_degree``; see ``parallel.state.ParallelLayout``). ``block_size`` is the paged KV cache's
    tokens per block. ``kernel_backend`` forces ``torch`` or ``nki`` ops; ``auto`` picks per tensor.
    """

    tp_degree: int = 1
    ep_degree: int = 1
    dtype: torch.dtype = torch.float32
    block_size: int = 32
    max_model_len: int = 2048
    kernel_backend: str = "auto"

    def __post_init__(self) -> None:
        object.__setattr__(self, "dtype", parse_dtype(self.dtype))
        if not isinstance(self.tp_degree, int) or self.tp_degree < 1:
            raise ConfigError(f"tp_degree: expected a positive integer, got {self.tp_degree}")
        if not isinstance(self.ep_degree, int) or self.ep_degree < 1:
            raise ConfigError(f"ep_degree: expected a positive integer, got {self.ep_degree}")
        if not isinstance(self.block_size, int) or self.block_size < 1:
            raise ConfigError(f"block_size: expected a positive integer, got {self.block_size}")
        if self.kernel_backend not in ("auto", "torch", "nki"):
            raise ConfigError(f"kernel_backend: expected auto, torch or nki, got {self.kernel_backend!r}")
