"""The packages a release can cut: ``core`` and every ``models/<name>``, read from their pyproject."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

from .errors import ReleaseError

CORE = "trnmodels-core"
Kind = Literal["core", "llm", "diffusion"]


@dataclass(frozen=True)
class Package:
    short: str  # "core", "llama3", "gpt_oss": the nox session suffix and the import name
    folder: Path  # relative to the repository root
    name: str  # the distribution, e.g. "trnmodels-gpt-oss"
    version: Version
    dependencies: tuple[Requirement, ...]
    entry_points: dict[str, dict[str, str]]  # group -> name -> object reference (scripts included)

    @property
    def kind(self) -> Kind:
        if self.short == "core":
            return "core"
        return "diffusion" if "trnmodels.diffusion" in self.entry_points else "llm"

    @property
    def core_range(self) -> SpecifierSet | None:
        """The plugin's declared range of ``trnmodels-core`` (None for core, or a plugin without one)."""
        for req in self.dependencies:
            if canonicalize_name(req.name) == CORE:
                return req.specifier
        return None

    @property
    def module(self) -> str:
        return f"trnmodels.{self.short}"

    @property
    def tag(self) -> str:
        return f"{self.name}-v{self.version}"


def read_package(root: Path, folder: Path) -> Package:
    pyproject = root / folder / "pyproject.toml"
    try:
        project = tomllib.loads(pyproject.read_text())["project"]
        version = Version(project["version"])
    except (OSError, tomllib.TOMLDecodeError, KeyError, ValueError) as e:
        raise ReleaseError(f"{pyproject}: cannot read [project] name and version: {e}") from None
    entry_points = {group: dict(eps) for group, eps in project.get("entry-points", {}).items()}
    if project.get("scripts"):
        entry_points["console_scripts"] = dict(project["scripts"])
    return Package(
        short="core" if folder == Path("core") else folder.name,
        folder=folder,
        name=project["name"],
        version=version,
        dependencies=tuple(Requirement(r) for r in project.get("dependencies", [])),
        entry_points=entry_points,
    )


def discover(root: Path) -> dict[str, Package]:
    """Every releasable package of the checkout at ``root``, core first, by short name."""
    folders = [
        Path("core"),
        *(p.parent.relative_to(root) for p in sorted(root.glob("models/*/pyproject.toml"))),
    ]
    return {pkg.short: pkg for pkg in (read_package(root, f) for f in folders)}


def find(packages: dict[str, Package], which: str) -> Package:
    """A package by short name (``gpt_oss``) or distribution name (``trnmodels-gpt-oss``)."""
    for pkg in packages.values():
        if which in (pkg.short, pkg.name) or canonicalize_name(which) == canonicalize_name(pkg.name):
            return pkg
    known = ", ".join(packages)
    raise ReleaseError(f"no package {which!r}: the packages are {known}")
