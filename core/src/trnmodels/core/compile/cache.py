"""The compiled-artifact cache: one directory per key, complete or absent.

An entry ``<root>/<key>/`` holds ``graph.pt2``, ``meta.json`` and the sentinel ``COMPLETE`` (the
artifact's sha256), written last. Builds happen in ``<key>.tmp-<pid>`` under a file lock and are moved
into place with one atomic rename, so:

- a second process asking for the same key waits on the lock and then finds the entry (one compile);
- a build killed midway leaves only a ``.tmp-`` directory, which never looks complete and is swept by
  the next build of that key;
- an entry whose artifact no longer matches its checksum (or fails to load) is reported with a warning,
  removed and rebuilt.

An artifact is native code this process loads, so the cache must be trusted, and the checksum cannot
establish that (whoever can write the artifact can write its checksum). The cache creates its folders
with mode 0700 and its files without group/other permissions, whatever the umask, and refuses (a
one-line ``ConfigError`` naming the folder, its mode and the ``chmod`` that fixes it) a root, entry or
entry file that other users can write, or a root or entry owned by another user, as ssh refuses a key
others can write. And it never answers one key with another's artifact: ``meta.json`` records the key
(and every field it was computed from), and an entry whose recorded key is not the one asked for (or
whose recorded fields differ from the caller's) is discarded and rebuilt like a corrupt one.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import stat
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from filelock import FileLock

from ..errors import ConfigError

ENV_VAR = "TRNMODELS_CACHE_DIR"
RECORDS = "records"  # small JSON notes beside the entries (compile manifests), one file per name
ARTIFACT = "graph.pt2"
SENTINEL = "COMPLETE"
META = "meta.json"
_KEY = re.compile(r"[A-Za-z0-9_-]+")  # a folder name: no separator, no "..", no ".tmp-"/".lock" suffix


class CorruptArtifactWarning(UserWarning):
    """A cache entry failed its checksum or could not be loaded; it is being rebuilt."""


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "trnmodels" / "compile"


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def make_private_dirs(path: Path) -> None:
    """``mkdir -p`` giving every folder it creates mode 0700 (``mkdir``'s mode is masked by the umask)."""
    missing = []
    while not path.exists():
        missing.append(path)
        path = path.parent
    for folder in reversed(missing):
        try:
            folder.mkdir(mode=0o700)
        except FileExistsError:  # another process made it first: it is checked like any existing folder
            continue
        os.chmod(folder, 0o700)


def make_private(tree: Path) -> None:
    """Take group and other permissions off a folder and everything in it (symlinks are left alone)."""
    for path in [tree, *tree.rglob("*")]:
        if not path.is_symlink():
            os.chmod(path, stat.S_IMODE(path.stat().st_mode) & 0o700)


def _json(value: Any) -> str:
    """``value`` as ``meta.json`` records it (tuples become lists, other objects their ``str``)."""
    return json.dumps(value, sort_keys=True, default=str)


class ArtifactCache:
    def __init__(self, root: str | Path | None = None):
        self.root = Path(root or os.environ.get(ENV_VAR) or default_cache_dir()).expanduser()
        try:
            make_private_dirs(self.root)
        except OSError as e:
            raise ConfigError(f"cache directory {self.root} is not writable: {e.strerror or e}") from None
        self.check_trusted(self.root)
        try:
            tempfile.TemporaryFile(dir=self.root).close()
        except OSError as e:
            raise ConfigError(f"cache directory {self.root} is not writable: {e.strerror or e}") from None

    def check_trusted(self, path: Path) -> None:
        """Refuse a cache folder or file that another user can write (or owns): it holds native code."""
        info = path.stat()
        mode = stat.S_IMODE(info.st_mode)
        what = "cache directory" if stat.S_ISDIR(info.st_mode) else "cache file"
        if mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise ConfigError(
                f"{what} {path} is writable by other users (mode {mode:o}), and compiled artifacts are "
                f"native code this process loads; make the cache yours alone: chmod -R go-w {self.root}"
            )
        if info.st_uid not in (os.geteuid(), 0):
            raise ConfigError(
                f"{what} {path} belongs to uid {info.st_uid}, not to you (uid {os.geteuid()}), and "
                "compiled artifacts are native code this process loads; use a cache directory of your own "
                f"(--cache-dir or ${ENV_VAR})"
            )

    def entry(self, key: str) -> Path:
        if not _KEY.fullmatch(key):
            raise ValueError(f"{key!r} is not a cache key (letters, digits, '_' and '-' only)")
        return self.root / key

    def lookup(self, key: str, meta: dict[str, Any] | None = None) -> Path | None:
        """The artifact path if the entry is complete, intact and built for ``key``; a damaged entry, or
        one whose ``meta.json`` records another key (or, for each item of ``meta``, another value), is
        removed. An entry other users can write is refused (``ConfigError``)."""
        entry = self.entry(key)
        sentinel = entry / SENTINEL
        if not sentinel.is_file():
            return None
        artifact, meta_file = entry / ARTIFACT, entry / META
        for path in (entry, sentinel, artifact, meta_file):
            if path.exists():
                self.check_trusted(path)
        try:
            recorded = json.loads(meta_file.read_text())
            recorded_key = recorded["key"]
        except (OSError, ValueError, TypeError, KeyError):
            self.discard(key, f"no readable {META} recording its key")
            return None
        if recorded_key != key or entry.name != key:
            self.discard(key, f"{META} records key {recorded_key!r}, not {key!r}")
            return None
        expected = json.loads(_json(meta or {}))
        differ = sorted(name for name, value in expected.items() if _json(recorded.get(name)) != _json(value))
        if differ:
            self.discard(key, f"{META} differs from this build in {', '.join(differ)}")
            return None
        if not artifact.is_file() or sha256_file(artifact) != sentinel.read_text().strip():
            self.discard(key, "checksum mismatch")
            return None
        return artifact

    def discard(self, key: str, reason: str) -> None:
        warnings.warn(
            f"compiled artifact {self.entry(key)} is corrupt ({reason}); rebuilding it",
            CorruptArtifactWarning,
            stacklevel=2,
        )
        shutil.rmtree(self.entry(key), ignore_errors=True)

    def read_record(self, name: str) -> dict[str, Any] | None:
        """The JSON object recorded under ``name``, or None if there is none (or it is unreadable: a
        record only ever saves work, so a damaged one is the same as none)."""
        path = self.root / RECORDS / f"{self.entry(name).name}.json"
        if not path.is_file():
            return None
        self.check_trusted(path.parent)
        self.check_trusted(path)
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            return None
        return record if isinstance(record, dict) else None

    def write_record(self, name: str, record: dict[str, Any]) -> None:
        """Record ``record`` under ``name``, replacing any previous one in one atomic rename."""
        folder = self.root / RECORDS
        make_private_dirs(folder)
        self.check_trusted(folder)
        path = folder / f"{self.entry(name).name}.json"
        tmp = folder / f"{path.name}.tmp-{os.getpid()}"
        try:
            tmp.write_text(json.dumps(record, sort_keys=True, default=str))
            os.chmod(tmp, 0o600)
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)

    def lock(self, key: str) -> FileLock:
        return FileLock(str(self.root / f"{key}.lock"))

    def get_or_build(
        self, key: str, build: Callable[[Path], None], meta: dict[str, Any]
    ) -> tuple[Path, bool]:
        """``(artifact path, hit)``. ``build(path)`` writes the artifact; it runs at most once per key.
        ``meta`` (the key's fields) is recorded in ``meta.json`` with the key, and an entry recording
        other values is rebuilt."""
        if (hit := self.lookup(key, meta)) is not None:
            return hit, True
        with self.lock(key):
            if (hit := self.lookup(key, meta)) is not None:
                return hit, True
            for stale in self.root.glob(f"{key}.tmp-*"):
                shutil.rmtree(stale, ignore_errors=True)
            shutil.rmtree(self.entry(key), ignore_errors=True)  # incomplete leftovers
            tmp = self.root / f"{key}.tmp-{os.getpid()}"
            tmp.mkdir(mode=0o700)
            try:
                build(tmp / ARTIFACT)
                record = {**meta, "key": key}
                (tmp / META).write_text(json.dumps(record, indent=2, sort_keys=True, default=str))
                (tmp / SENTINEL).write_text(sha256_file(tmp / ARTIFACT))
                make_private(tmp)
                os.replace(tmp, self.entry(key))
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
            return self.entry(key) / ARTIFACT, False
