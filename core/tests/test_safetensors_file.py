"""Positioned safetensors reads equal safetensors' own, read only the slice, and name damaged files."""

from __future__ import annotations

import json
import struct

import pytest
import torch
from safetensors.torch import save_file

from trnmodels.core.errors import CheckpointError
from trnmodels.core.weights import safetensors_file
from trnmodels.core.weights.safetensors_file import SafetensorsFile

TENSORS = {
    "bf16": torch.randn(7, 9).bfloat16(),
    "scalar": torch.tensor(3.5),
    "ints": torch.arange(10, dtype=torch.int64),
    "half3d": torch.randn(4, 6, 5).half(),
    "empty": torch.zeros(0, 3),
}


@pytest.fixture
def file(tmp_path):
    path = tmp_path / "x.safetensors"
    save_file(TENSORS, str(path))
    handle = SafetensorsFile(path)
    yield handle
    handle.close()


@pytest.mark.parametrize(
    ("key", "index"),
    [
        ("bf16", slice(None)),
        ("bf16", slice(2, 5)),
        ("bf16", (slice(None), slice(3, 7))),
        ("scalar", slice(None)),
        ("ints", slice(3, 8)),
        ("half3d", (slice(1, 3), slice(None), slice(2, 4))),
        ("empty", slice(None)),
        ("bf16", slice(0, 0)),
    ],
)
def test_slices_equal_torch_indexing(file, monkeypatch, key, index):
    monkeypatch.setattr(safetensors_file, "CHUNK_BYTES", 64)  # many chunks for column slices
    got = file.get_slice(key)[index]
    want = TENSORS[key] if TENSORS[key].dim() == 0 else TENSORS[key][index]  # a 0-d tensor reads whole
    assert got.dtype == want.dtype and torch.equal(got, want)


def test_reads_only_the_rows_asked_for(file, monkeypatch):
    reads = []
    real = file.read_bytes
    monkeypatch.setattr(file, "read_bytes", lambda offset, n: reads.append(n) or real(offset, n))
    file.get_slice("bf16")[2:5]
    assert reads == [3 * 9 * 2]


def _write(path, header: bytes, data: bytes = b"") -> None:
    path.write_bytes(struct.pack("<Q", len(header)) + header + data)


@pytest.mark.parametrize(
    ("header", "data", "message"),
    [
        (b"{not json", b"", "header is not JSON"),
        (
            json.dumps({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}).encode(),
            b"\0" * 8,
            "ends at byte",
        ),
        (
            json.dumps({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 12]}}).encode(),
            b"\0" * 12,
            "12 bytes for shape",
        ),
        (
            json.dumps({"w": {"dtype": "Q4", "shape": [4], "data_offsets": [0, 4]}}).encode(),
            b"\0" * 4,
            "unsupported dtype",
        ),
    ],
)
def test_damaged_files_name_the_file(tmp_path, header, data, message):
    path = tmp_path / "bad.safetensors"
    _write(path, header, data)
    with pytest.raises(CheckpointError, match=rf"{path.name}: not a readable safetensors file.*{message}"):
        SafetensorsFile(path)


def test_header_longer_than_file(tmp_path):
    path = tmp_path / "short.safetensors"
    path.write_bytes(struct.pack("<Q", 1000) + b"{}")
    with pytest.raises(CheckpointError, match="header length 1000 does not fit"):
        SafetensorsFile(path)
