"""Running the public ``trnmodels`` command in tests the way a user does: a fresh interpreter."""

from __future__ import annotations

import subprocess
import sys


def run_cli(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """Run ``trnmodels ARGS`` in a fresh interpreter; stdout and stderr are captured as text."""
    return subprocess.run(
        [sys.executable, "-m", "trnmodels.core.cli", *args], capture_output=True, text=True, timeout=timeout
    )
