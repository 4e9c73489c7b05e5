"""Lazy access to checkpoint tensors: a single ``model.safetensors`` or a sharded index.

Nothing but the headers is read when a checkpoint is opened; a loader asks for the slice its rank owns
and only those bytes are read (positioned reads, see ``safetensors_file``). Damaged files, a broken index and missing shards fail with the file named.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from ..errors import CheckpointError
from .safetensors_file import SafetensorsFile

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"


class TensorSource(Protocol):
    """Where one tensor's bytes come from: a safetensors slice, or an in-memory tensor."""

    def get_shape(self) -> list[int]: ...

    def __getitem__(self, index: Any) -> torch.Tensor: ...


@dataclass(frozen=True)
class CheckpointTensor:
    """A tensor in a checkpoint, not yet read. ``read(index)`` reads only the indexed slice."""

    key: str
    file: str
    shape: tuple[int, ...]
    source: TensorSource

    def read(self, index: Any = slice(None)) -> torch.Tensor:
        try:
            return self.source[index]
        except Exception as e:  # safetensors raises its own error types for damaged data
            raise CheckpointError(f"{self.file}: cannot read tensor {self.key!r}: {e}") from None

    @property
    def reads_into(self) -> bool:
        """Whether ``read_rows_into`` can fill a tensor without a temporary (a file source can)."""
        return hasattr(self.source, "read_rows_into")

    def read_rows_into(self, start: int, stop: int, out: torch.Tensor) -> None:
        """Rows ``[start, stop)`` straight into ``out`` (see ``reads_into``)."""
        try:
            self.source.read_rows_into(start, stop, out)  # type: ignore[attr-defined]
        except Exception as e:
            raise CheckpointError(f"{self.file}: cannot read tensor {self.key!r}: {e}") from None

    @property
    def dtype(self) -> torch.dtype | None:
        """The stored dtype, from the file header (``None`` if the source does not say)."""
        return getattr(self.source, "dtype", None)

    def describe(self) -> str:
        return f"{self.key} {list(self.shape)} in {Path(self.file).name}"


class Checkpoint(Protocol):
    name: str

    def keys(self) -> Iterable[str]: ...

    def tensor(self, key: str) -> CheckpointTensor: ...


class _TensorSlice:
    def __init__(self, tensor: torch.Tensor):
        self._tensor = tensor

    def get_shape(self) -> list[int]:
        return list(self._tensor.shape)

    @property
    def dtype(self) -> torch.dtype:
        return self._tensor.dtype

    def __getitem__(self, index: Any) -> torch.Tensor:
        return self._tensor[index]


class StateDictCheckpoint:
    """An in-memory checkpoint, so module tests load HF weights through the same loaders as real files."""

    def __init__(self, state_dict: Mapping[str, torch.Tensor], name: str = "<state_dict>"):
        self._tensors = {k: v.detach() for k, v in state_dict.items()}
        self.name = name

    def keys(self) -> Iterable[str]:
        return self._tensors.keys()

    def tensor(self, key: str) -> CheckpointTensor:
        t = self._tensors[key]
        return CheckpointTensor(key, self.name, tuple(t.shape), _TensorSlice(t))


class SafetensorsCheckpoint:
    """A checkpoint directory of safetensors files, opened lazily."""

    def __init__(self, checkpoint_dir: str | Path, *, stem: str = "model"):
        """``stem`` names the files: ``model`` (transformers) or ``diffusion_pytorch_model`` (diffusers)."""
        self.dir = Path(checkpoint_dir)
        self.name = str(self.dir)
        self._handles: dict[str, SafetensorsFile] = {}
        single_file, index_file = f"{stem}.safetensors", f"{stem}.safetensors.index.json"
        index = self.dir / index_file
        single = self.dir / single_file
        if index.is_file():
            self._key_to_file = self._read_index(index)
        elif single.is_file():
            self._key_to_file = {k: single_file for k in self._open(single_file).keys()}
        else:
            raise CheckpointError(f"{self.dir}: no {single_file} or {index_file} found")

    def _read_index(self, index: Path) -> dict[str, str]:
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise CheckpointError(f"{index}: not a safetensors index with a 'weight_map' ({e})") from None
        if not isinstance(weight_map, dict) or not all(isinstance(f, str) for f in weight_map.values()):
            raise CheckpointError(
                f"{index}: 'weight_map' must map tensor names to file names, got {weight_map!r:.80}"
            )
        missing = sorted({f for f in weight_map.values() if not (self.dir / f).is_file()})
        if missing:
            raise CheckpointError(f"{index}: shard file(s) listed but not present: {', '.join(missing)}")
        for file in sorted(set(weight_map.values())):
            stored = set(self._open(file).keys())
            absent = [k for k, f in weight_map.items() if f == file and k not in stored]
            if absent:
                raise CheckpointError(
                    f"{self.dir / file}: index lists keys the file lacks: {first_names(absent)}"
                )
        return dict(weight_map)

    def _open(self, file: str) -> SafetensorsFile:
        if file not in self._handles:
            self._handles[file] = SafetensorsFile(self.dir / file)
        return self._handles[file]

    def close(self) -> None:
        """Close the shard files (also done by ``with``)."""
        for handle in self._handles.values():
            handle.close()
        self._handles.clear()

    def __enter__(self) -> SafetensorsCheckpoint:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def keys(self) -> Iterable[str]:
        return self._key_to_file.keys()

    def tensor(self, key: str) -> CheckpointTensor:
        file = self._key_to_file[key]
        source = self._open(file).get_slice(key)
        return CheckpointTensor(key, str(self.dir / file), tuple(source.get_shape()), source)


def first_names(items: list[str], n: int = 10) -> str:
    shown = ", ".join(items[:n])
    return shown if len(items) <= n else f"{shown}, … ({len(items)} in all)"
