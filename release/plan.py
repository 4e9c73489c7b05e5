"""Which packages need a release: their own files changed since their recorded release, or core moved.

A package's CHANGELOG.md is release bookkeeping (the release dates its section), so a change there alone
is not a change of the package. A plugin whose own files did not change still needs a release when core
is being released outside its declared core range; inside the range it only needs the compatibility
check (its last release against the new core), which core's release runs.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from . import git, record
from .packages import Package, discover

Action = Literal["release", "check", "none"]


@dataclass(frozen=True)
class PlanEntry:
    package: str  # short name
    name: str  # distribution
    version: str  # at HEAD
    released: str | None  # the recorded release, if any
    commit: str | None  # the commit that release was cut from
    action: Action
    reason: str
    bumped: bool  # HEAD's version is newer than the recorded release
    changed: list[str] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def own_changes(root: Path, pkg: Package, since: str) -> list[str]:
    changelog = str(pkg.folder / "CHANGELOG.md")
    return [p for p in git.changed_paths(root, since, pkg.folder) if p != changelog]


def make_plan(root: Path) -> list[PlanEntry]:
    packages = discover(root)
    records = record.load(root)
    entries: dict[str, PlanEntry] = {}
    for short, pkg in packages.items():
        last = records.get(pkg.name)
        common = dict(package=short, name=pkg.name, version=str(pkg.version))
        if last is None:
            entries[short] = PlanEntry(
                **common, released=None, commit=None, action="release", reason="never released", bumped=True
            )
            continue
        changed = own_changes(root, pkg, last.commit)
        bumped = pkg.version > last.parsed_version
        if changed:
            action: Action = "release"
            reason = f"{len(changed)} file(s) changed since {last.version}"
        elif bumped:
            action, reason = "release", f"version bumped from {last.version}"
        else:
            action, reason = "none", "unchanged"
        entries[short] = PlanEntry(
            **common,
            released=last.version,
            commit=last.commit,
            action=action,
            reason=reason,
            bumped=bumped,
            changed=changed,
        )
    core = packages["core"]
    if entries["core"].action == "release":
        for short, pkg in packages.items():
            entry = entries[short]
            if short == "core" or entry.action == "release":
                continue
            core_range = pkg.core_range
            if core_range is not None and core_range.contains(core.version, prereleases=True):
                action, reason = "check", f"core changed; {core.version} is within its range {core_range}"
            else:
                action, reason = "release", f"core {core.version} is outside its range {core_range}"
            entries[short] = PlanEntry(**{**asdict(entry), "action": action, "reason": reason})
    return list(entries.values())


def format_plan(entries: list[PlanEntry]) -> str:
    rows = [("package", "distribution", "HEAD", "released", "action", "why")]
    for e in entries:
        head = e.version + (" (not bumped)" if e.action == "release" and not e.bumped else "")
        rows.append((e.package, e.name, head, e.released or "-", e.action, e.reason))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
