"""The few git questions a release asks, answered by the git command line."""

from __future__ import annotations

import subprocess
import tarfile
import tempfile
from pathlib import Path

from .errors import ReleaseError


def git(root: Path, *args: str) -> str:
    proc = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True)
    if proc.returncode != 0:
        raise ReleaseError(f"git {' '.join(args)} failed in {root}: {proc.stderr.strip()}")
    return proc.stdout


def head(root: Path) -> str:
    return git(root, "rev-parse", "HEAD").strip()


def dirty_paths(root: Path) -> list[str]:
    """Tracked files changed and untracked files not ignored."""
    return [line[3:] for line in git(root, "status", "--porcelain").splitlines()]


def has_commit(root: Path, commit: str) -> bool:
    return subprocess.run(["git", "cat-file", "-e", f"{commit}^{{commit}}"], cwd=root).returncode == 0


def changed_paths(root: Path, since: str, folder: Path) -> list[str]:
    """Files under ``folder`` that differ between ``since`` and HEAD."""
    if not has_commit(root, since):
        raise ReleaseError(
            f"the release record names commit {since[:12]}, which this clone does not have "
            "(a shallow clone? fetch the full history)"
        )
    return git(root, "diff", "--name-only", since, "HEAD", "--", str(folder)).splitlines()


def export(root: Path, commit: str, dest: Path) -> Path:
    """The tree of ``commit`` written to ``dest`` (no .git), as ``git archive`` gives it."""
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryFile() as archive:
        proc = subprocess.run(["git", "archive", "--format=tar", commit], cwd=root, stdout=archive)
        if proc.returncode != 0:
            raise ReleaseError(f"git archive {commit[:12]} failed in {root}")
        archive.seek(0)
        with tarfile.open(fileobj=archive) as tar:
            tar.extractall(dest, filter="data")
    return dest
