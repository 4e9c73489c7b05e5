"""Load a module's parameters from a checkpoint through an explicit parameter → key(s) mapping.

Strict: every parameter must be mapped, every mapped key must exist, and every checkpoint key must be
used or explicitly ignored. All problems are collected and reported together, before any weight is read.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Protocol

import torch
from tqdm.auto import tqdm

from ..errors import CheckpointError
from .checkpoint import Checkpoint, CheckpointTensor, SafetensorsCheckpoint, first_names
from .loaders import RowPlan, get_weight_loader

KeyMap = Mapping[str, str | list[str]]
"""A read-only ``{parameter name: checkpoint key, or the keys a fused parameter concatenates}``."""
KeyDict = dict[str, str | list[str]]
"""The mutable mapping a module builds in its ``checkpoint_keys``."""


def prefixed(prefix: str, keys: KeyMap) -> KeyDict:
    """A submodule's ``{parameter: checkpoint key(s)}`` mapping, its parameter names under ``prefix``."""
    return {f"{prefix}{name}": key for name, key in keys.items()}


HF_FUSED_SOURCES: Mapping[str, tuple[str, ...]] = {
    "qkv_proj": ("q_proj", "k_proj", "v_proj"),
    "gate_up_proj": ("gate_proj", "up_proj"),
}
"""Core's fused projections and the HF checkpoint projections each concatenates, in order."""


def identity_keys(
    module: torch.nn.Module, prefix: str = "", fused: Mapping[str, Sequence[str]] = HF_FUSED_SOURCES
) -> KeyDict:
    """Each parameter of ``module`` at its own name under ``prefix``, except fused ones: a path segment
    named in ``fused`` (``qkv_proj``) maps to its sources' keys in order (``q_proj``, ``k_proj``,
    ``v_proj``), as vLLM's ``stacked_params_mapping`` does. A module whose checkpoint names differ
    otherwise writes its mapping itself."""
    keys: KeyDict = {}
    for name, _ in module.named_parameters():
        parts = name.split(".")
        stacked = next((i for i, part in enumerate(parts) if part in fused), None)
        if stacked is None:
            keys[name] = f"{prefix}{name}"
        else:
            keys[name] = [
                prefix + ".".join([*parts[:stacked], source, *parts[stacked + 1 :]])
                for source in fused[parts[stacked]]
            ]
    return keys


def _as_list(keys: str | list[str]) -> list[str]:
    return [keys] if isinstance(keys, str) else list(keys)


def check_key_coverage(
    checkpoint: Checkpoint, parameter_names: Iterable[str], mapping: KeyMap, ignore: Iterable[str] = ()
) -> None:
    """Raise one error listing unmapped parameters, missing keys and unexpected keys."""
    names = set(parameter_names)
    unmapped = sorted(names - set(mapping))
    stale = sorted(set(mapping) - names)
    if unmapped or stale:
        raise CheckpointError(
            "key mapping does not match the model's parameters: "
            + "; ".join(
                s
                for s in (
                    unmapped and f"parameters with no checkpoint key: {first_names(unmapped)}",
                    stale and f"mapped names that are not parameters: {first_names(stale)}",
                )
                if s
            )
        )
    wanted = {k for keys in mapping.values() for k in _as_list(keys)}
    present = set(checkpoint.keys())
    missing = sorted(wanted - present)
    unexpected = sorted(k for k in present - wanted if not any(fnmatch.fnmatchcase(k, p) for p in ignore))
    problems = []
    if missing:
        problems.append(f"missing keys: {first_names(missing)}")
    if unexpected:
        problems.append(f"unexpected keys: {first_names(unexpected)}")
    if problems:
        raise CheckpointError(f"checkpoint {checkpoint.name} does not fit the model: " + "; ".join(problems))


def _check_float_storage(
    name: str, param: torch.Tensor, tensors: list[CheckpointTensor], value: torch.Tensor
) -> None:
    """A floating-point parameter takes floating-point storage (any float dtype: casts between them are
    fine). Integer storage reaches it only through a loader that decodes it explicitly, i.e. every key
    is integer (MXFP4 blocks and scales) and the loader returns floats; an integer key mixed with float
    ones (promoted by a concatenation) or copied as is would be cast silently into a wrong model."""
    if not param.is_floating_point():
        return
    stored = [t for t in tensors if t.dtype is not None and not t.dtype.is_floating_point]
    if value.is_floating_point() and (not stored or len(stored) == len(tensors)):
        return
    bad = stored[0] if stored else tensors[0]
    raise CheckpointError(
        f"{bad.describe()}: the checkpoint stores {bad.dtype or value.dtype} but parameter {name} expects "
        f"{param.dtype}; integer, bool and complex tensors are not cast to floating point (a quantized "
        "checkpoint needs the plugin's dequantizing loader)"
    )


def load_parameters(
    module: torch.nn.Module,
    checkpoint: Checkpoint,
    mapping: KeyMap,
    *,
    rank: int = 0,
    world_size: int = 1,
    ignore: Iterable[str] = (),
    progress: bool = True,
) -> None:
    """Fill every parameter of ``module`` with its rank-local slice, converting to the parameter's dtype.

    Float-to-float conversion is allowed (a BF16 checkpoint runs in FP32); an integer or bool tensor for a
    floating-point parameter is refused: casting it would load a silently wrong model. Packed integer
    formats (MXFP4 blocks and scales) load through a loader that dequantizes them, so what reaches the
    parameter is already floating point.

    ``ignore`` holds glob patterns of checkpoint keys the model deliberately does not use.
    """
    params = dict(module.named_parameters())
    check_key_coverage(checkpoint, params, mapping, ignore)
    bar = tqdm(params.items(), desc="loading weights", unit="param", disable=not progress, leave=False)
    with torch.no_grad():
        for name, param in bar:
            tensors: list[CheckpointTensor] = [checkpoint.tensor(k) for k in _as_list(mapping[name])]
            loader = get_weight_loader(param)
            if _read_rows_into(param, getattr(loader, "row_plan", None), tensors, rank, world_size):
                continue
            value = loader(tensors, rank, world_size)
            if tuple(value.shape) != tuple(param.shape):
                sources = ", ".join(t.describe() for t in tensors)
                raise CheckpointError(
                    f"{sources}: parameter {name} expects shape {list(param.shape)} on rank {rank} of "
                    f"{world_size}, the checkpoint gives {list(value.shape)}"
                )
            _check_float_storage(name, param, tensors, value)
            param.copy_(value.to(param.dtype))


def _read_rows_into(
    param: torch.Tensor, plan: RowPlan | None, tensors: list[CheckpointTensor], rank: int, world_size: int
) -> bool:
    """Read a whole-rows value from the files straight into ``param`` when nothing needs converting: its
    row ranges stored in the parameter's dtype and row shape, filling exactly its rows. Otherwise (no
    plan, an in-memory source) leave it to the loader and the checks after it, and say so."""
    ranges = plan(tensors, rank, world_size) if plan is not None else None
    if not ranges or param.dim() == 0 or not param.is_contiguous():
        return False
    row_shape = tuple(param.shape[1:])
    for t, _, _ in ranges:
        if t is not None and (not t.reads_into or t.dtype != param.dtype or tuple(t.shape[1:]) != row_shape):
            return False
    if sum(stop - start for _, start, stop in ranges) != param.shape[0]:
        return False
    row = 0
    for t, start, stop in ranges:
        rows = param.data[row : row + stop - start]
        if t is None:
            rows.zero_()
        else:
            t.read_rows_into(start, stop, rows)
        row += stop - start
    return True


class RankInGroup(Protocol):
    """Where this process sits in the group a module is sharded over (a TP group handle)."""

    @property
    def rank(self) -> int: ...

    @property
    def world_size(self) -> int: ...


def load_checkpoint_dir(
    module: torch.nn.Module,
    checkpoint_dir: str | Path,
    mapping: KeyMap,
    group: RankInGroup,
    *,
    stem: str = "model",
    ignore: Iterable[str] = (),
    progress: bool = True,
) -> None:
    """``load_parameters`` from one folder's safetensors files (single or indexed shards, named by
    ``stem``), each rank reading its slice for its place in ``group``; the files are closed after."""
    with SafetensorsCheckpoint(checkpoint_dir, stem=stem) as checkpoint:
        load_parameters(
            module,
            checkpoint,
            mapping,
            rank=group.rank,
            world_size=group.world_size,
            ignore=ignore,
            progress=progress,
        )
