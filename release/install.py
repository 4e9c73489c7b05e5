"""A user's installation: a fresh virtual environment outside the repository, ``pip install`` from the
local index, and the smoke test (``smoke.py``) run there."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.utils import canonicalize_name

from .errors import ReleaseError
from .index import LocalIndex
from .packages import Package

SMOKE = Path(__file__).with_name("smoke.py")


def torch_pin(root: Path) -> str:
    """The workspace's one torch (``tool.uv.constraint-dependencies``): a user on CPU installs the build
    of torch they want before the plugin, or pip would pick the newest build the range admits."""
    uv = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["uv"]
    (pin,) = [
        c for c in uv.get("constraint-dependencies", []) if canonicalize_name(c.split("=")[0]) == "torch"
    ]
    return pin


def _clean_env() -> dict[str, str]:
    """The environment without the repository's or nox's Python settings (a user's shell)."""
    drop = {"PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "UV_PROJECT_ENVIRONMENT", "PYTHONSAFEPATH"}
    return {k: v for k, v in os.environ.items() if k not in drop}


def _run(cmd: list[str], cwd: Path, what: str) -> str:
    proc = subprocess.run(cmd, cwd=cwd, env=_clean_env(), capture_output=True, text=True)
    if proc.returncode != 0:
        detail = (proc.stderr.strip() or proc.stdout.strip())[-2000:]
        raise ReleaseError(f"{what} failed: {detail}")
    return proc.stdout


@dataclass(frozen=True)
class UserEnv:
    path: Path

    @property
    def python(self) -> Path:
        return self.path / "bin" / "python"

    @classmethod
    def create(cls, path: Path, torch: str) -> UserEnv:
        if (path / "bin" / "python").exists():
            raise ReleaseError(f"{path} already holds an environment: a user's install starts fresh")
        subprocess.run([sys.executable, "-m", "venv", str(path)], check=True, env=_clean_env())
        env = cls(path)
        _run([str(env.python), "-m", "pip", "install", "-q", torch], path, f"pip install {torch}")
        return env

    def install(
        self, index: LocalIndex, requirements: list[str], report: Path, head_wheels: tuple[Path, ...] = ()
    ) -> dict[str, dict[str, str]]:
        """``pip install`` with the local index as the only index (``--isolated``: no pip configuration
        adds another); returns name -> version and where pip took it, after checking that every
        ``trnmodels-*`` name came from the local index and no other name did."""
        cmd = [str(self.python), "-m", "pip", "install", "--isolated", "-q", "--disable-pip-version-check"]
        cmd += ["--index-url", index.simple_url, "--report", str(report), *requirements]
        _run(cmd, self.path, f"pip install {' '.join(requirements)} from {index.simple_url}")
        taken = {}
        for item in json.loads(report.read_text())["install"]:
            name, url = canonicalize_name(item["metadata"]["name"]), item["download_info"]["url"]
            local = url.startswith(index.url) or url.startswith("file:")
            if name.startswith("trnmodels-") != local:
                where = "the local index" if name.startswith("trnmodels-") else "PyPI (pypiserver's fallback)"
                raise ReleaseError(f"pip took {name} from {url}; it must come from {where} only")
            taken[str(name)] = {"version": item["metadata"]["version"], "from": url}
        if head_wheels:  # built from HEAD, perhaps with a released version number: replace what pip kept
            cmd = [
                str(self.python),
                "-m",
                "pip",
                "install",
                "--isolated",
                "-q",
                "--no-deps",
                "--force-reinstall",
            ]
            _run([*cmd, *map(str, head_wheels)], self.path, f"pip install {[w.name for w in head_wheels]}")
            for wheel in head_wheels:
                name, version = wheel.name.split("-")[:2]
                taken[str(canonicalize_name(name))] = {"version": version, "from": wheel.as_uri()}
        return taken

    def smoke(self, pkg: Package, version: str, core_version: str, work: Path) -> dict[str, Any]:
        """Run ``smoke.py`` for ``pkg`` at ``version`` from ``work`` (outside the repository)."""
        work.mkdir(parents=True, exist_ok=True)
        cmd = [str(self.python), str(SMOKE), pkg.short, pkg.kind, version, core_version, str(work)]
        out = _run(cmd, work, f"the smoke test of {pkg.name} {version} with core {core_version}")
        return json.loads(out.strip().splitlines()[-1])
