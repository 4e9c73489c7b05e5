"""The artifact cache: one build per key, nothing half-written ever looks complete, damage is rebuilt."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from trnmodels.core.compile.cache import ARTIFACT, SENTINEL, ArtifactCache, CorruptArtifactWarning
from trnmodels.core.errors import ConfigError


def writer(content: bytes, calls: list[Path]):
    def build(path: Path) -> None:
        calls.append(path)
        path.write_bytes(content)

    return build


def test_miss_then_hit_builds_once(tmp_path):
    cache, calls = ArtifactCache(tmp_path), []
    path, hit = cache.get_or_build("k1", writer(b"graph", calls), {"graph": "prefill"})
    assert not hit and path.read_bytes() == b"graph" and len(calls) == 1
    path2, hit2 = cache.get_or_build("k1", writer(b"other", calls), {})
    assert hit2 and path2 == path and path.read_bytes() == b"graph" and len(calls) == 1
    assert (path.parent / "meta.json").is_file() and (path.parent / SENTINEL).is_file()


def test_corrupted_artifact_is_reported_and_rebuilt(tmp_path):
    cache, calls = ArtifactCache(tmp_path), []
    path, _ = cache.get_or_build("k1", writer(b"graph", calls), {})
    path.write_bytes(b"grapH")
    with pytest.warns(CorruptArtifactWarning, match="checksum mismatch"):
        path2, hit = cache.get_or_build("k1", writer(b"graph", calls), {})
    assert not hit and len(calls) == 2 and path2.read_bytes() == b"graph"


def test_a_build_killed_midway_leaves_nothing_that_looks_complete(tmp_path):
    cache = ArtifactCache(tmp_path)

    def dies(path: Path) -> None:
        path.write_bytes(b"half")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        cache.get_or_build("k1", dies, {})
    assert cache.lookup("k1") is None
    assert not (tmp_path / "k1").exists() and not list(tmp_path.glob("k1.tmp-*"))


def test_stale_temp_dir_of_a_dead_process_is_swept(tmp_path):
    cache, calls = ArtifactCache(tmp_path), []
    stale = tmp_path / "k1.tmp-999999"
    stale.mkdir()
    (stale / ARTIFACT).write_bytes(b"half")
    assert cache.lookup("k1") is None
    cache.get_or_build("k1", writer(b"graph", calls), {})
    assert not stale.exists() and cache.lookup("k1") is not None


SLOW_BUILD = """
import os, sys, time
from pathlib import Path
from trnmodels.core.compile.cache import ArtifactCache

root, counter = sys.argv[1], sys.argv[2]

def build(path: Path) -> None:
    with open(counter, "a") as f:
        f.write(f"{os.getpid()}\\n")
    time.sleep(1.0)
    path.write_bytes(b"graph")

print("hit" if ArtifactCache(root).get_or_build("shared", build, {})[1] else "miss")
"""


def test_two_processes_compiling_one_key_compile_once(tmp_path):
    counter = tmp_path / "builds.txt"
    cmd = [sys.executable, "-c", SLOW_BUILD, str(tmp_path / "cache"), str(counter)]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True) for _ in range(2)]
    outcomes = sorted(p.communicate(timeout=120)[0].strip() for p in procs)
    assert outcomes == ["hit", "miss"]
    assert len(counter.read_text().splitlines()) == 1


def test_unwritable_cache_dir_is_a_named_error(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    with pytest.raises(ConfigError, match=f"cache directory {blocker / 'cache'} is not writable"):
        ArtifactCache(blocker / "cache")


def test_cache_dir_from_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("TRNMODELS_CACHE_DIR", str(tmp_path / "from-env"))
    assert ArtifactCache().root == tmp_path / "from-env"
