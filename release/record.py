"""The repository's record of each package's last release: ``release/record.json``.

Git tags are not carried by every clone or archive, so the version, the commit it was cut from, the day
and the sha256 of each published file live in the tree. ``git log release/record.json`` is the history.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from packaging.version import InvalidVersion, Version

from .errors import ReleaseError

RECORD = Path("release/record.json")


@dataclass(frozen=True)
class Released:
    version: str
    commit: str  # the commit the artifacts were built from
    date: str
    files: dict[str, str] = field(default_factory=dict)  # file name -> sha256

    @property
    def parsed_version(self) -> Version:
        return Version(self.version)


def load(root: Path) -> dict[str, Released]:
    """Distribution name -> its last release (missing file: nothing released yet)."""
    path = root / RECORD
    if not path.exists():
        return {}
    try:
        raw = json.loads(path.read_text())
        records = {name: Released(**entry) for name, entry in raw.items()}
        for name, entry in records.items():
            entry.parsed_version  # noqa: B018 (validates)
            if len(entry.commit) != 40:
                raise ValueError(f"{name}: commit {entry.commit!r} is not a full sha")
    except (OSError, json.JSONDecodeError, TypeError, ValueError, InvalidVersion) as e:
        raise ReleaseError(f"{path}: malformed release record: {e}") from None
    return records


def save(root: Path, records: dict[str, Released]) -> None:
    path = root / RECORD
    text = json.dumps({name: asdict(records[name]) for name in sorted(records)}, indent=2) + "\n"
    tmp = path.with_name(f"{path.name}.{os.getpid()}.partial")
    tmp.write_text(text)
    tmp.replace(path)
