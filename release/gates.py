"""The checks a release must pass before anything is built; each refuses with one line."""

from __future__ import annotations

import subprocess
from collections.abc import Iterable
from pathlib import Path

from packaging.version import Version

from . import changelog, git
from .errors import ReleaseError
from .packages import Package
from .plan import PlanEntry


def clean_tree(root: Path) -> None:
    dirty = git.dirty_paths(root)
    if dirty:
        shown = ", ".join(dirty[:5]) + (f" and {len(dirty) - 5} more" if len(dirty) > 5 else "")
        raise ReleaseError(f"the working tree is not clean ({shown}): commit or stash first")


def needs_release(pkg: Package, entry: PlanEntry) -> None:
    if entry.action == "none":
        raise ReleaseError(
            f"{pkg.name} {pkg.version}: nothing changed since its release from {entry.commit[:12]}; "
            "nothing to release"
        )
    if entry.action == "check":
        raise ReleaseError(f"{pkg.name}: {entry.reason}: it needs no release (core's release checks it)")


def version_bumped(pkg: Package, entry: PlanEntry) -> None:
    if entry.released is not None and pkg.version <= Version(entry.released):
        example = f" (e.g. {entry.changed[0]})" if entry.changed else ""
        raise ReleaseError(
            f"{pkg.name} changed since {entry.released}{example} but its version is {pkg.version}: "
            f"bump it in {pkg.folder / 'pyproject.toml'}"
        )


def changelog_entry(root: Path, pkg: Package) -> None:
    changelog.section(root / pkg.folder / "CHANGELOG.md", str(pkg.version))


def newer_than_index(pkg: Package, index_versions: Iterable[Version], resuming: bool) -> None:
    """The version must be newer than every one the index has; the same version is allowed only to
    resume an interrupted upload of identical files (``resuming``, decided by the caller)."""
    newest = max(index_versions, default=None)
    if newest is None or pkg.version > newest or (pkg.version == newest and resuming):
        return
    raise ReleaseError(f"the index already has {pkg.name} {newest}: {pkg.version} is not newer")


def no_prerelease_dependencies(pkg: Package) -> None:
    if pkg.version.is_prerelease:
        return
    for req in pkg.dependencies:
        pre = [str(s) for s in req.specifier if Version(s.version.rstrip(".*")).is_prerelease]
        if pre:
            raise ReleaseError(
                f"{pkg.name} {pkg.version} is a stable release but depends on a prerelease: {req} ({', '.join(pre)})"
            )


def core_in_range(pkg: Package, core: Package) -> None:
    if pkg.kind == "core":
        return
    core_range = pkg.core_range
    if core_range is None or not str(core_range):
        raise ReleaseError(
            f"{pkg.name} must depend on {core.name} with a version range (got {core_range or 'none'})"
        )
    if not core_range.contains(core.version, prereleases=True):
        raise ReleaseError(
            f"{pkg.name} declares {core.name}{core_range}, which excludes core {core.version} released with it: "
            f"widen the range in {pkg.folder / 'pyproject.toml'}"
        )


def lock_in_sync(root: Path) -> None:
    proc = subprocess.run(["uv", "lock", "--check"], cwd=root, capture_output=True, text=True)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["uv lock --check failed"])[-1]
        raise ReleaseError(f"uv.lock is not in sync with the pyproject files: run `uv lock` ({last})")
