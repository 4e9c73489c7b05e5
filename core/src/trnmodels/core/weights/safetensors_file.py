"""Positioned reads of safetensors files: only the bytes of the requested slice enter memory.

safetensors' own ``safe_open`` memory-maps the whole file, so every page a loader touches stays in the
process RSS until the file is closed: a rank slicing columns touches nearly every page of a tensor.
Here the header is parsed once and a slice is read with ``os.preadv`` into its own buffer; a slice
along a later dimension is read in bounded chunks of rows, so peak memory is the result plus one chunk.
"""

from __future__ import annotations

import json
import math
import os
import struct
from pathlib import Path
from typing import Any

import torch

from ..errors import CheckpointError

DTYPES: dict[str, torch.dtype] = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
}
CHUNK_BYTES = 16 << 20
MAX_HEADER_BYTES = 100 << 20


class SafetensorsFile:
    def __init__(self, path: Path):
        self.path = path
        self.fd = os.open(path, os.O_RDONLY)
        try:
            self.entries, self.data_start = self._read_header()
        except Exception:
            os.close(self.fd)
            raise

    def _damaged(self, why: str) -> CheckpointError:
        return CheckpointError(f"{self.path}: not a readable safetensors file (truncated or damaged?): {why}")

    def _read_header(self) -> tuple[dict[str, dict[str, Any]], int]:
        size = os.fstat(self.fd).st_size
        head = os.pread(self.fd, 8, 0)
        if len(head) < 8:
            raise self._damaged(f"{size} bytes, too short for a header")
        (length,) = struct.unpack("<Q", head)
        if length > min(MAX_HEADER_BYTES, size - 8):
            raise self._damaged(f"header length {length} does not fit in a file of {size} bytes")
        try:
            header = json.loads(os.pread(self.fd, length, 8))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise self._damaged(f"header is not JSON ({e})") from None
        header.pop("__metadata__", None)
        data_start = 8 + length
        for key, entry in header.items():
            dtype, shape, (begin, end) = (
                entry.get("dtype"),
                entry.get("shape"),
                entry.get("data_offsets", (0, -1)),
            )
            if dtype not in DTYPES:
                raise self._damaged(f"tensor {key!r} has unsupported dtype {dtype!r}")
            if end - begin != math.prod(shape) * DTYPES[dtype].itemsize:
                raise self._damaged(f"tensor {key!r}: {end - begin} bytes for shape {shape} of {dtype}")
            if data_start + end > size:
                raise self._damaged(f"tensor {key!r} ends at byte {data_start + end}, the file has {size}")
        return header, data_start

    def keys(self) -> list[str]:
        return list(self.entries)

    def get_slice(self, key: str) -> TensorSlice:
        entry = self.entries[key]
        return TensorSlice(
            self, self.data_start + entry["data_offsets"][0], tuple(entry["shape"]), DTYPES[entry["dtype"]]
        )

    def read_bytes(self, offset: int, nbytes: int) -> torch.Tensor:
        buffer = torch.empty(nbytes, dtype=torch.uint8)
        self.read_into(offset, buffer)
        return buffer

    def read_into(self, offset: int, out: torch.Tensor) -> None:
        """Fill the contiguous CPU tensor ``out`` with the file's bytes from ``offset`` on."""
        view = memoryview(out.view(torch.uint8).reshape(-1).numpy())
        nbytes, done = len(view), 0
        while done < nbytes:
            n = os.preadv(self.fd, [view[done:]], offset + done)
            if n == 0:
                raise self._damaged(f"unexpected end of file at byte {offset + done}")
            done += n

    def close(self) -> None:
        os.close(self.fd)


class TensorSlice:
    """One tensor of a file, indexed like a tensor with slices; each index reads only what it needs."""

    def __init__(self, file: SafetensorsFile, offset: int, shape: tuple[int, ...], dtype: torch.dtype):
        self.file, self.offset, self.shape, self.dtype = file, offset, shape, dtype

    def get_shape(self) -> list[int]:
        return list(self.shape)

    def read_rows_into(self, start: int, stop: int, out: torch.Tensor) -> None:
        """Rows ``[start, stop)`` straight into ``out`` (contiguous, this tensor's dtype and row shape):
        the one copy a plain read makes, with no temporary."""
        if (
            out.dtype != self.dtype
            or tuple(out.shape) != (stop - start, *self.shape[1:])
            or not out.is_contiguous()
        ):
            raise ValueError(
                f"rows {start}:{stop} of a {self.dtype} {list(self.shape)} tensor cannot fill a "
                f"{'' if out.is_contiguous() else 'non-contiguous '}{out.dtype} {list(out.shape)} tensor"
            )
        row_bytes = math.prod(self.shape[1:]) * self.dtype.itemsize
        self.file.read_into(self.offset + start * row_bytes, out)

    def _rows(self, start: int, stop: int) -> torch.Tensor:
        row_bytes = math.prod(self.shape[1:]) * self.dtype.itemsize
        raw = self.file.read_bytes(self.offset + start * row_bytes, (stop - start) * row_bytes)
        return raw.view(self.dtype).reshape(stop - start, *self.shape[1:])

    def __getitem__(self, index: Any) -> torch.Tensor:
        index = index if isinstance(index, tuple) else (index,)
        if not self.shape:
            return self._rows(0, 1).reshape(())
        rows = range(*index[0].indices(self.shape[0])) if index else range(self.shape[0])
        if rows.step != 1:
            raise IndexError("safetensors slices must be contiguous along dim 0")
        rest = index[1:]
        if all(s == slice(None) for s in rest):
            return self._rows(rows.start, max(rows.start, rows.stop))
        row_bytes = max(1, math.prod(self.shape[1:]) * self.dtype.itemsize)
        chunk = max(1, CHUNK_BYTES // row_bytes)
        parts = [
            self._rows(r, min(r + chunk, rows.stop))[(slice(None), *rest)].clone()
            for r in range(rows.start, rows.stop, chunk)
        ]
        return torch.cat(parts) if parts else self._rows(0, 0)[(slice(None), *rest)]
