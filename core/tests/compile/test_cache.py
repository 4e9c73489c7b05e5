"""The artifact cache: one build per key, nothing half-written ever looks complete, damage is rebuilt."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from trnmodels.core.cli import main
from trnmodels.core.compile import driver
from trnmodels.core.compile.cache import ARTIFACT, SENTINEL, ArtifactCache, CorruptArtifactWarning
from trnmodels.core.errors import ConfigError
from trnmodels.core.testing.bad_inputs import BadInput, check_one_line_error


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


@pytest.mark.slow  # two fresh interpreters racing for one key
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


# --- trust: compiled artifacts are native code, so the folder they come from must be the user's alone ---


def mode_of(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_cache_creates_private_folders_whatever_the_umask(tmp_path):
    old = os.umask(0o002)  # a umask that would leave new folders group-writable
    try:
        cache = ArtifactCache(tmp_path / "new" / "cache")
        path, _ = cache.get_or_build("k1", writer(b"graph", []), {})
    finally:
        os.umask(old)
    assert mode_of(tmp_path / "new") == 0o700 and mode_of(cache.root) == 0o700
    assert mode_of(path.parent) == 0o700
    for file in path.parent.iterdir():
        assert mode_of(file) & 0o077 == 0, f"{file.name}: mode {mode_of(file):o}"
    assert cache.lookup("k1") == path  # its own entries pass its checks


@pytest.mark.parametrize("mode", [0o777, 0o775, 0o757], ids=oct)
def test_a_cache_folder_writable_by_others_is_refused(tmp_path, mode):
    root = tmp_path / "cache"
    root.mkdir()
    root.chmod(mode)
    with pytest.raises(ConfigError) as raised:
        ArtifactCache(root)
    message = str(raised.value)
    assert "\n" not in message
    assert f"cache directory {root} is writable by other users (mode {mode:o})" in message
    assert f"chmod -R go-w {root}" in message


@pytest.mark.parametrize("which", ["entry", ARTIFACT, SENTINEL, "meta.json"])
def test_an_entry_or_artifact_writable_by_others_is_refused(tmp_path, which):
    cache = ArtifactCache(tmp_path)
    path, _ = cache.get_or_build("k1", writer(b"graph", []), {})
    target = path.parent if which == "entry" else path.parent / which
    target.chmod(mode_of(target) | 0o020)  # group-writable
    with pytest.raises(ConfigError, match=f"{target} is writable by other users .* chmod -R go-w {tmp_path}"):
        cache.lookup("k1")
    with pytest.raises(ConfigError, match="writable by other users"):
        cache.get_or_build("k1", writer(b"graph", []), {})


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a folder to another user needs root")
def test_a_cache_folder_owned_by_another_user_is_refused(tmp_path):
    root = tmp_path / "cache"
    root.mkdir(mode=0o700)
    os.chown(root, 12345, 12345)
    with pytest.raises(ConfigError, match=f"cache directory {root} belongs to uid 12345, not to you"):
        ArtifactCache(root)
    os.chown(root, os.geteuid(), os.getegid())
    cache = ArtifactCache(root)
    path, _ = cache.get_or_build("k1", writer(b"graph", []), {})
    os.chown(path, 12345, 12345)  # an artifact another user can rewrite
    with pytest.raises(ConfigError, match=f"cache file {path} belongs to uid 12345"):
        cache.lookup("k1")


def test_an_entry_recorded_under_another_key_is_discarded_and_rebuilt(tmp_path):
    cache, calls = ArtifactCache(tmp_path), []
    path, _ = cache.get_or_build("k1", writer(b"graph", calls), {"graph": "prefill"})
    shutil.copytree(path.parent, tmp_path / "k2")  # an entry moved to another key's folder: its meta says k1
    with pytest.warns(CorruptArtifactWarning, match="meta.json records key 'k1', not 'k2'"):
        assert cache.lookup("k2") is None
    assert not (tmp_path / "k2").exists()
    meta = json.loads((path.parent / "meta.json").read_text())
    assert meta["key"] == "k1" and meta["graph"] == "prefill"
    (path.parent / "meta.json").write_text(json.dumps({**meta, "key": "k0"}))
    with pytest.warns(CorruptArtifactWarning, match="meta.json records key 'k0', not 'k1'"):
        _, hit = cache.get_or_build("k1", writer(b"graph", calls), {"graph": "prefill"})
    assert not hit and len(calls) == 2


def test_an_entry_whose_recorded_fields_differ_is_discarded_and_rebuilt(tmp_path):
    cache, calls = ArtifactCache(tmp_path), []
    cache.get_or_build("k1", writer(b"graph", calls), {"graph": "prefill", "bucket": [32]})
    assert cache.lookup("k1", {"graph": "prefill", "bucket": (32,)}) is not None  # as JSON records it
    with pytest.warns(CorruptArtifactWarning, match="meta.json differs from this build in bucket"):
        _, hit = cache.get_or_build("k1", writer(b"graph", calls), {"graph": "prefill", "bucket": [64]})
    assert not hit and len(calls) == 2


def test_an_entry_without_meta_is_discarded_and_rebuilt(tmp_path):
    cache, calls = ArtifactCache(tmp_path), []
    path, _ = cache.get_or_build("k1", writer(b"graph", calls), {})
    (path.parent / "meta.json").unlink()
    with pytest.warns(CorruptArtifactWarning, match="no readable meta.json"):
        assert cache.lookup("k1") is None


def test_a_key_that_is_not_a_plain_name_is_refused(tmp_path):
    with pytest.raises(ValueError, match="not a cache key"):
        ArtifactCache(tmp_path / "cache").lookup("../outside")


def test_cli_compile_refuses_a_world_writable_cache_dir_in_one_line(tmp_path, capsys, monkeypatch):
    def compiles(*args, **kwargs):
        raise AssertionError("a graph was compiled into a cache folder other users can write")

    monkeypatch.setattr(driver, "compile_graph", compiles)
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    config = dict(
        model_type="llama",
        architectures=["LlamaForCausalLM"],
        max_position_embeddings=64,
        vocab_size=64,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        rms_norm_eps=1e-6,
    )
    (ckpt / "config.json").write_text(json.dumps(config))
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    case = BadInput("compile", "--cache-dir shared  # mode 777", "writable by other users (mode 777)")
    try:
        code = main(["compile", str(ckpt), "--cache-dir", str(shared)])
    except SystemExit as e:
        code = e.code
    check_one_line_error(code, capsys.readouterr().err, case)
    assert list(shared.iterdir()) == []  # nothing written into the refused folder
