"""Writing a benchmark page: its Markdown and, beside it, the run's raw figures as JSON.

Each file is written whole to a temporary file in the same folder, then renamed over the old one, so a
run that fails while writing leaves the previous page and figures as they were, never half of either.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from trnmodels.core.cli.outputs import replace_output


def save_page(out: Path, lines: list[str], results: dict[str, Any]) -> None:
    """Write ``lines`` to the page ``out`` and ``results`` to ``out`` with the suffix ``.json``."""
    out.parent.mkdir(parents=True, exist_ok=True)
    figures = json.dumps(results, indent=2) + "\n"  # first: figures that cannot be written change nothing
    for path, text in ((out.with_suffix(".json"), figures), (out, "\n".join(lines))):
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            tmp.write_text(text)
            replace_output(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
