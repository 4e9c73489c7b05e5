"""What the built files must hold before they may be published."""

from __future__ import annotations

import configparser
import subprocess
import sys
from email.parser import Parser
from typing import Any

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from .build import Artifacts, sha256, wheel_contents
from .errors import ReleaseError
from .packages import CORE, Package


def twine_check(artifacts: Artifacts) -> None:
    cmd = [sys.executable, "-m", "twine", "check", "--strict", *map(str, artifacts.files)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        report = " ".join((proc.stdout + proc.stderr).split())
        raise ReleaseError(f"twine check --strict refused: {report}")


def _dist_info(contents: dict[str, bytes]) -> str:
    (dist_info,) = {
        name.split("/", 1)[0] for name in contents if name.split("/", 1)[0].endswith(".dist-info")
    }
    return dist_info


def check_wheel(pkg: Package, artifacts: Artifacts) -> dict[str, Any]:
    """Only the package's own subpackage of the ``trnmodels`` namespace, no tests, the declared entry
    points, and (for a plugin) ``Requires-Dist: trnmodels-core`` with a range."""
    contents = wheel_contents(artifacts.wheel)
    dist_info = _dist_info(contents)
    own = f"trnmodels/{pkg.short}/"
    name = artifacts.wheel.name
    for path in contents:
        if path.startswith(f"{dist_info}/"):
            continue
        if path == "trnmodels/__init__.py":
            raise ReleaseError(f"{name}: holds trnmodels/__init__.py, which would break the shared namespace")
        if not path.startswith(own):
            raise ReleaseError(f"{name}: holds {path}, outside its own subpackage {own}")
        parts = path.split("/")
        if "tests" in parts or parts[-1].startswith("test_") or parts[-1] == "conftest.py":
            raise ReleaseError(f"{name}: holds a test file, {path}")
    metadata = Parser().parsestr(contents[f"{dist_info}/METADATA"].decode())
    if metadata["Name"] != pkg.name or metadata["Version"] != str(pkg.version):
        raise ReleaseError(
            f"{name}: METADATA says {metadata['Name']} {metadata['Version']}, expected {pkg.name} {pkg.version}"
        )
    requires = [Requirement(r) for r in metadata.get_all("Requires-Dist") or []]
    on_core = [r for r in requires if canonicalize_name(r.name) == CORE]
    if pkg.kind != "core" and (not on_core or not str(on_core[0].specifier)):
        raise ReleaseError(
            f"{name}: no Requires-Dist on {CORE} with a version range (got {on_core or 'none'})"
        )
    parser = configparser.ConfigParser(delimiters=("=",))
    parser.optionxform = str  # entry point names are case-sensitive
    parser.read_string(contents.get(f"{dist_info}/entry_points.txt", b"").decode())
    shipped = {group: {k: v.strip() for k, v in parser[group].items()} for group in parser.sections()}
    if shipped != pkg.entry_points:
        raise ReleaseError(f"{name}: entry points {shipped} differ from its pyproject's {pkg.entry_points}")
    return {
        "files": len(contents),
        "requires_core": str(on_core[0]) if on_core else None,
        "entry_points": shipped,
    }


def hashes(artifacts: Artifacts) -> dict[str, str]:
    return {path.name: sha256(path) for path in artifacts.files}
