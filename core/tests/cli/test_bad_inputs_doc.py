"""``docs/bad-inputs.md`` shows every tested CLI bad input: the table is rendered from each ``bad_inputs.py``
under ``core/tests`` and ``models/*/tests``. ``TRNMODELS_UPDATE_DOCS=1`` rewrites the page's table."""

from __future__ import annotations

import os
from pathlib import Path

from trnmodels.core.testing.bad_inputs import load_cases, render_table

ROOT = Path(__file__).resolve().parents[3]
PAGE = ROOT / "docs" / "bad-inputs.md"
BEGIN = "<!-- begin bad-inputs table (generated: TRNMODELS_UPDATE_DOCS=1 pytest core/tests/cli) -->"
END = "<!-- end bad-inputs table -->"


def case_files() -> list[Path]:
    return sorted({*ROOT.glob("core/tests/**/bad_inputs.py"), *ROOT.glob("models/*/tests/**/bad_inputs.py")})


def test_the_docs_table_lists_every_tested_bad_input():
    files = case_files()
    assert ROOT / "core" / "tests" / "cli" / "bad_inputs.py" in files
    block = f"{BEGIN}\n{render_table(load_cases(files))}{END}"
    text = PAGE.read_text()
    assert text.count(BEGIN) == 1 and text.count(END) == 1, f"{PAGE}: expected one pair of table markers"
    if os.environ.get("TRNMODELS_UPDATE_DOCS") == "1":
        start, stop = text.index(BEGIN), text.index(END) + len(END)
        text = text[:start] + block + text[stop:]
        PAGE.write_text(text)
    assert block in text, f"{PAGE} is out of date: rerun with TRNMODELS_UPDATE_DOCS=1"
