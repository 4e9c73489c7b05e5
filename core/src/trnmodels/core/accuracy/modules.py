"""Module-level comparison: load one HF module's weights into ours through our own loaders.

Going through ``load_parameters`` (not ``load_state_dict``) means a module test also checks the
key mapping and the fused/sharded loaders the real checkpoint path uses: an HF weight we do not map
is an error here too, unless the test names it in ``ignore``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import torch

from ..weights import StateDictCheckpoint, load_parameters


def load_from_hf_module(
    ours: torch.nn.Module,
    hf_module: torch.nn.Module,
    mapping: Mapping[str, str | list[str]],
    ignore: Iterable[str] = (),
) -> torch.nn.Module:
    """Fill ``ours`` from ``hf_module.state_dict()`` via ``mapping`` (our name → HF key(s)); returns ours."""
    checkpoint = StateDictCheckpoint(hf_module.state_dict(), type(hf_module).__name__)
    load_parameters(ours, checkpoint, mapping, ignore=ignore, progress=False)
    return ours
