"""A small workspace shaped like the monorepo (core plus one plugin, ``toy``) in a git repository of its
own, so the release pipeline's plan, gates and builds run on real files, commits and builds."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from release import record
from release.build import Artifacts, build
from release.packages import discover

HATCH = """
[build-system]
requires = ["hatchling>=1.26"]
build-backend = "hatchling.build"

[tool.hatch.build.targets.wheel]
packages = ["src/trnmodels"]

[tool.hatch.build.targets.sdist]
include = ["src", "README.md", "CHANGELOG.md"]
"""

CHANGELOG = "# Changelog\n\n## [{version}] - Unreleased\n\n### Added\n- {what}\n"


def write_package(folder: Path, name: str, module: str, version: str, extra: str = "") -> None:
    (folder / "src" / "trnmodels" / module).mkdir(parents=True, exist_ok=True)
    (folder / "src" / "trnmodels" / module / "__init__.py").write_text(f'"""{name}."""\n')
    (folder / "README.md").write_text(f"# {name}\n\nA package of the test workspace.\n")
    (folder / "CHANGELOG.md").write_text(CHANGELOG.format(version=version, what=f"{name} itself."))
    (folder / "pyproject.toml").write_text(
        f'[project]\nname = "{name}"\nversion = "{version}"\ndescription = "{name} for tests."\n'
        f'readme = "README.md"\nrequires-python = ">=3.11"\nlicense = "Apache-2.0"\n{extra}{HATCH}'
    )


def git(root: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=root, check=True, capture_output=True, text=True).stdout


def commit_all(root: Path, message: str) -> str:
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", message)
    return git(root, "rev-parse", "HEAD").strip()


def set_version(root: Path, folder: str, old: str, new: str, changelog: bool = True) -> None:
    pyproject = root / folder / "pyproject.toml"
    pyproject.write_text(pyproject.read_text().replace(f'version = "{old}"', f'version = "{new}"'))
    if changelog:
        path = root / folder / "CHANGELOG.md"
        section = CHANGELOG.format(version=new, what="a change").split("\n", 2)[2]
        path.write_text(path.read_text().replace("## [", section + "\n## [", 1))


def lock(root: Path) -> None:
    subprocess.run(["uv", "lock", "-q"], cwd=root, check=True)


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    root.mkdir()
    (root / "pyproject.toml").write_text(
        '[project]\nname = "toy-workspace"\nversion = "0"\nrequires-python = ">=3.11"\n\n'
        '[tool.uv]\npackage = false\n\n[tool.uv.workspace]\nmembers = ["core", "models/*"]\n\n'
        "[tool.uv.sources]\ntrnmodels-core = { workspace = true }\n"
    )
    (root / ".gitignore").write_text("dist/\n")
    write_package(root / "core", "trnmodels-core", "core", "0.1.0")
    write_package(
        root / "models" / "toy",
        "trnmodels-toy",
        "toy",
        "0.1.0",
        'dependencies = ["trnmodels-core>=0.1,<0.2"]\n\n'
        '[project.entry-points."trnmodels.models"]\ntoy = "trnmodels.toy:PLUGIN"\n',
    )
    (root / "release").mkdir()
    lock(root)
    git(root, "init", "-q", "-b", "main")
    git(root, "config", "user.email", "release-tests@example.com")
    git(root, "config", "user.name", "release tests")
    commit_all(root, "the test workspace")
    return root


def record_releases(root: Path, **versions: str) -> str:
    """Record ``name=version`` releases cut from HEAD (sha256 left empty) and commit the record."""
    head = git(root, "rev-parse", "HEAD").strip()
    records = record.load(root)
    for short, version in versions.items():
        name = discover(root)[short].name
        records[name] = record.Released(version, head, "2026-12-01", {})
    record.save(root, records)
    commit_all(root, "record releases")
    return head


def build_toy(root: Path, out: Path) -> Artifacts:
    return build(root, discover(root)["toy"], out)


def read_json(path: Path) -> dict:
    return json.loads(path.read_text())
