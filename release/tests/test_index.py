"""The local index is a real pypiserver: what it lists, uploads that resume after a failure, and a
published file that is never overwritten."""

from __future__ import annotations

import socket

import pytest
from packaging.version import Version

from release.build import sha256
from release.errors import ReleaseError
from release.index import LocalIndex

from .conftest import build_toy


@pytest.fixture
def toy(workspace, tmp_path):
    return build_toy(workspace, tmp_path / "build")


def test_upload_list_and_resume(toy, tmp_path):
    folder = tmp_path / "index"
    with LocalIndex(folder) as index:
        assert index.versions("trnmodels-toy") == []
        # An interrupted release: the wheel went up, then the server died before the sdist.
        assert index.upload([toy.wheel]) == [toy.wheel.name]
        index.stop()
        with pytest.raises(
            ReleaseError,
            match=r"upload to http://127.0.0.1:\d+/ failed: .*Connection refused.*run the release again",
        ):
            index.upload([toy.sdist])
    with LocalIndex(folder) as index:
        assert index.upload(list(toy.files)) == [toy.sdist.name]  # the wheel is not uploaded twice
        assert index.versions("trnmodels-toy") == [Version("0.1.0")]
        assert index.versions("trnmodels-core") == []
        assert index.held(toy.wheel.name) == sha256(toy.wheel)
    assert not (index.process and index.process.poll() is None), "the server must stop with the block"


def test_a_published_file_is_never_overwritten(toy, tmp_path):
    folder = tmp_path / "index"
    folder.mkdir()
    (folder / toy.wheel.name).write_bytes(b"other bytes")
    with (
        LocalIndex(folder) as index,
        pytest.raises(ReleaseError, match=r"already holds .* with other content"),
    ):
        index.upload(list(toy.files))
    assert (folder / toy.wheel.name).read_bytes() == b"other bytes"
    assert not (folder / toy.sdist.name).exists()


def test_a_port_already_taken(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(ReleaseError, match=f"port {port} on 127.0.0.1 is already in use"):
            LocalIndex(tmp_path / "index", port).__enter__()


def test_an_index_folder_that_is_a_file(tmp_path):
    path = tmp_path / "index"
    path.write_text("not a folder")
    with pytest.raises(ReleaseError, match=f"--index-dir: {path} is a file"):
        LocalIndex(path).__enter__()
    assert path.read_text() == "not a folder"
