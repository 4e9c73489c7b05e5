"""A benchmark page and its JSON are written whole or not at all."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.pages import save_page


def test_the_page_and_its_figures_replace_the_old_ones_keeping_their_mode(tmp_path: Path) -> None:
    out = tmp_path / "docs" / "page.md"
    save_page(out, ["# old"], {"x": 1})
    out.chmod(0o644)
    save_page(out, ["# new", "", "body"], {"x": 2})
    assert out.read_text() == "# new\n\nbody"
    assert json.loads(out.with_suffix(".json").read_text()) == {"x": 2}
    assert out.stat().st_mode & 0o777 == 0o644
    assert sorted(p.name for p in out.parent.iterdir()) == ["page.json", "page.md"]


def test_figures_that_cannot_be_written_leave_the_old_page_and_figures(tmp_path: Path) -> None:
    out = tmp_path / "page.md"
    save_page(out, ["# old"], {"x": 1})
    with pytest.raises(TypeError):
        save_page(out, ["# new"], {"x": object()})
    assert out.read_text() == "# old" and json.loads(out.with_suffix(".json").read_text()) == {"x": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["page.json", "page.md"]
