"""Module-level comparison: load one HF module's weights into ours through our own loaders.

Going through ``load_parameters`` (not ``load_state_dict``) means a module test also checks the
key mapping and the fused/sharded loaders the real checkpoint path uses: an HF weight we do not map
is an error here too, unless the test names it in ``ignore``.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Mapping

import torch

from ..weights import StateDictCheckpoint, load_parameters
from .three_way import assert_close_three_way


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


def assert_module_bf16_three_way(
    run_ours: Callable[[torch.Tensor], torch.Tensor],
    theirs: torch.nn.Module,
    run_theirs: Callable[[torch.nn.Module, torch.Tensor], torch.Tensor],
    x: torch.Tensor,
    name: str,
) -> None:
    """Our BF16 module (loaded from ``theirs``) judged three-way on input ``x``: its error against the HF
    module in FP32 must stay within what HF's own module in BF16 makes (``theirs`` is left unchanged).

    ``run_ours(x)`` runs ours; ``run_theirs(module, x)`` runs an HF module, so it can run a BF16 copy.
    """
    with torch.no_grad():
        expected = run_theirs(theirs.float(), x.float())
        baseline = run_theirs(copy.deepcopy(theirs).to(torch.bfloat16), x.bfloat16())
        target = run_ours(x.bfloat16())
    assert_close_three_way(target, expected, baseline, name=name)
