"""Reading and dating a CHANGELOG section."""

from __future__ import annotations

import pytest

from release.changelog import date_section, section
from release.errors import ReleaseError

TEXT = """# Changelog

## [0.2.0] - Unreleased

### Fixed
- a bug.

## [0.1.0] - 2026-11-01

### Added
- everything.
"""


def test_dating_a_section_changes_its_heading_only(tmp_path):
    path = tmp_path / "CHANGELOG.md"
    path.write_text(TEXT)
    date_section(path, "0.2.0", "2026-12-01")
    assert path.read_text() == TEXT.replace("[0.2.0] - Unreleased", "[0.2.0] - 2026-12-01")
    assert section(path, "0.2.0").body == "### Fixed\n- a bug."
    assert section(path, "0.1.0").date == "2026-11-01"


def test_a_missing_or_empty_section(tmp_path):
    path = tmp_path / "CHANGELOG.md"
    path.write_text(TEXT.replace("### Fixed\n- a bug.\n", ""))
    with pytest.raises(ReleaseError, match=r"the section \[0.2.0\] is empty"):
        section(path, "0.2.0")
    with pytest.raises(ReleaseError, match=r"no section for 0.3.0 \(sections: 0.2.0, 0.1.0\)"):
        section(path, "0.3.0")
