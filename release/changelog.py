"""A package's CHANGELOG.md (Keep a Changelog): one ``## [X.Y.Z] - DATE`` section per version."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from .errors import ReleaseError

# [ \t]*, not \s*: the heading's span must stop at its own line end, or dating it eats the blank line.
HEADING = re.compile(r"^## \[(?P<version>[^\]]+)\](?: - (?P<date>.*?))?[ \t]*$", re.MULTILINE)
UNRELEASED = "Unreleased"


@dataclass(frozen=True)
class Section:
    version: str
    date: str  # "Unreleased" or an ISO date
    heading_span: tuple[int, int]
    body: str


def sections(text: str) -> list[Section]:
    matches = list(HEADING.finditer(text))
    found = []
    for match, following in zip(matches, [*matches[1:], None], strict=True):
        end = following.start() if following else len(text)
        body = text[match.end() : end].strip()
        found.append(Section(match["version"], match["date"] or UNRELEASED, match.span(), body))
    return found


def section(path: Path, version: str) -> Section:
    """The section of ``version``, which must exist and say something."""
    try:
        text = path.read_text()
    except OSError as e:
        raise ReleaseError(f"{path}: cannot read: {e.strerror or e}") from None
    for sec in sections(text):
        if sec.version == version:
            if not sec.body:
                raise ReleaseError(f"{path}: the section [{version}] is empty: say what changed")
            return sec
    have = ", ".join(s.version for s in sections(text)) or "none"
    raise ReleaseError(
        f"{path}: no section for {version} (sections: {have}): add `## [{version}] - Unreleased`"
    )


def date_section(path: Path, version: str, date: str) -> None:
    """Replace the section's ``Unreleased`` (or a date) with ``date``, writing the file atomically."""
    sec = section(path, version)
    text = path.read_text()
    start, end = sec.heading_span
    updated = f"{text[:start]}## [{version}] - {date}{text[end:]}"
    tmp = path.with_name(f"{path.name}.{os.getpid()}.partial")
    tmp.write_text(updated)
    tmp.replace(path)
