"""Wheel and sdist built as a user's resolver will see them, and a wheel rebuilt from the sdist.

``--no-sources`` drops the workspace's ``tool.uv.sources``, so a plugin's dependency on core is the
declared range a user's installer resolves, not the local folder.
"""

from __future__ import annotations

import hashlib
import subprocess
import zipfile
from dataclasses import dataclass
from pathlib import Path

from .errors import ReleaseError
from .packages import Package


@dataclass(frozen=True)
class Artifacts:
    wheel: Path
    sdist: Path

    @property
    def files(self) -> tuple[Path, Path]:
        return (self.wheel, self.sdist)


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _uv_build(cwd: Path, args: list[str], out: Path) -> None:
    cmd = ["uv", "build", "--no-sources", "--quiet", *args, "--out-dir", str(out)]
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.strip().splitlines()[-5:])
        raise ReleaseError(f"`{' '.join(cmd)}` failed in {cwd}:\n{tail}")


def _only(folder: Path, pattern: str) -> Path:
    found = sorted(folder.glob(pattern))
    if len(found) != 1:
        raise ReleaseError(f"expected one {pattern} in {folder}, found {[p.name for p in found]}")
    return found[0]


def wheel_contents(wheel: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(wheel) as zf:
        return {name: zf.read(name) for name in zf.namelist()}


def build(source_root: Path, pkg: Package, out: Path) -> Artifacts:
    """Build ``pkg`` from the checkout at ``source_root`` into ``out``; fail unless the wheel rebuilt from
    the sdist holds the same files with the same bytes as the wheel built from the tree."""
    out.mkdir(parents=True, exist_ok=True)
    _uv_build(source_root, ["--package", pkg.name, "--sdist", "--wheel"], out)
    artifacts = Artifacts(_only(out, "*.whl"), _only(out, "*.tar.gz"))
    rebuilt_dir = out / "from-sdist"
    _uv_build(source_root, [str(artifacts.sdist), "--wheel"], rebuilt_dir)
    rebuilt = _only(rebuilt_dir, "*.whl")
    first, second = wheel_contents(artifacts.wheel), wheel_contents(rebuilt)
    differ = sorted(n for n in first.keys() | second.keys() if first.get(n) != second.get(n))
    if differ:
        raise ReleaseError(
            f"the wheel rebuilt from {artifacts.sdist.name} differs from {artifacts.wheel.name} in "
            f"{len(differ)} file(s), e.g. {differ[:3]}: the sdist is missing what the wheel needs"
        )
    return artifacts
