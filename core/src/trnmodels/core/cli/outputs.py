"""Output files written beside their target, then renamed over it, with the permissions the target
would have had: a result replacing a file keeps that file's mode, and a new one gets the usual
``0o666 & ~umask``. (safetensors creates its files ``0o600`` whatever the umask, so a replaced result
would otherwise turn unreadable to the group and others that could read it before.)"""

from __future__ import annotations

import os
from pathlib import Path


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def replace_output(tmp: Path, out: Path) -> None:
    """Rename the finished ``tmp`` over ``out``, with ``out``'s mode if it exists, else the umask's."""
    try:
        mode = out.stat().st_mode & 0o7777
    except FileNotFoundError:
        mode = 0o666 & ~_umask()
    os.chmod(tmp, mode)
    os.replace(tmp, out)
