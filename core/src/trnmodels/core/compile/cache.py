"""The compiled-artifact cache: one directory per key, complete or absent.

An entry ``<root>/<key>/`` holds ``graph.pt2``, ``meta.json`` and the sentinel ``COMPLETE`` (the
artifact's sha256), written last. Builds happen in ``<key>.tmp-<pid>`` under a file lock and are moved
into place with one atomic rename, so:

- a second process asking for the same key waits on the lock and then finds the entry (one compile);
- a build killed midway leaves only a ``.tmp-`` directory, which never looks complete and is swept by
  the next build of that key;
- an entry whose artifact no longer matches its checksum (or fails to load) is reported with a warning,
  removed and rebuilt.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from filelock import FileLock

from ..errors import ConfigError

ENV_VAR = "TRNMODELS_CACHE_DIR"
ARTIFACT = "graph.pt2"
SENTINEL = "COMPLETE"


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


class ArtifactCache:
    def __init__(self, root: str | Path | None = None):
        self.root = Path(root or os.environ.get(ENV_VAR) or default_cache_dir()).expanduser()
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            tempfile.TemporaryFile(dir=self.root).close()
        except OSError as e:
            raise ConfigError(f"cache directory {self.root} is not writable: {e.strerror or e}") from None

    def entry(self, key: str) -> Path:
        return self.root / key

    def lookup(self, key: str) -> Path | None:
        """The artifact path if the entry is complete and intact; a damaged entry is removed."""
        entry = self.entry(key)
        sentinel = entry / SENTINEL
        if not sentinel.is_file():
            return None
        artifact = entry / ARTIFACT
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

    def lock(self, key: str) -> FileLock:
        return FileLock(str(self.root / f"{key}.lock"))

    def get_or_build(
        self, key: str, build: Callable[[Path], None], meta: dict[str, Any]
    ) -> tuple[Path, bool]:
        """``(artifact path, hit)``. ``build(path)`` writes the artifact; it runs at most once per key."""
        if (hit := self.lookup(key)) is not None:
            return hit, True
        with self.lock(key):
            if (hit := self.lookup(key)) is not None:
                return hit, True
            for stale in self.root.glob(f"{key}.tmp-*"):
                shutil.rmtree(stale, ignore_errors=True)
            shutil.rmtree(self.entry(key), ignore_errors=True)  # incomplete leftovers
            tmp = self.root / f"{key}.tmp-{os.getpid()}"
            tmp.mkdir()
            try:
                build(tmp / ARTIFACT)
                (tmp / "meta.json").write_text(json.dumps(meta, indent=2, sort_keys=True))
                (tmp / SENTINEL).write_text(sha256_file(tmp / ARTIFACT))
                os.replace(tmp, self.entry(key))
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
            return self.entry(key) / ARTIFACT, False
