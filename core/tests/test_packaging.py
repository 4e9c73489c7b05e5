"""Packaging: the built wheels install into a fresh venv and form one ``trnmodels`` namespace.

Builds every workspace member (``core`` and ``models/*``) with ``uv build``, installs the wheels
into a new venv and inspects them from there (clean cwd, no PYTHONPATH), so nothing can be
picked up from the source tree. Also checks what the sdists ship.
"""

import json
import os
import shutil
import subprocess
import sys
import tarfile
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MEMBERS = [ROOT / "core", *sorted(p.parent for p in ROOT.glob("models/*/pyproject.toml"))]
UV = os.environ.get("UV") or shutil.which("uv")

pytestmark = [
    pytest.mark.skipif(UV is None, reason="`uv` is not on PATH; it is needed to build the wheels"),
    pytest.mark.slow,  # wheel and sdist builds, a venv install
]


def _project(member: Path) -> dict:
    with open(member / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["project"]


def _build(member: Path, kind: str, out: Path) -> Path:
    name = _project(member)["name"]
    cmd = [UV, "build", "--package", name, f"--{kind}", "--out-dir", str(out)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, f"{' '.join(cmd)} failed:\n{proc.stderr}"
    pattern = "*.whl" if kind == "wheel" else "*.tar.gz"
    (artifact,) = out.glob(pattern)
    return artifact


# Runs inside the fresh venv; prints where everything was imported from, as JSON.
PROBE = """
import importlib, importlib.metadata as md, importlib.util, json, sys, sysconfig
import trnmodels
mods = {m: importlib.import_module(m).__file__ for m in sys.argv[1:]}
print(json.dumps({
    "site": sysconfig.get_paths()["purelib"],
    "namespace_file": getattr(trnmodels, "__file__", None),
    "namespace_path": list(trnmodels.__path__),
    "modules": mods,
    "entry_points": {ep.name: ep.value for ep in md.entry_points(group="trnmodels.models")},
    # cpu.extension builds from SOURCES = <its folder>/csrc/*.cpp (found without importing torch).
    "kernel_sources": importlib.util.find_spec("trnmodels.core.cpu").submodule_search_locations[0] + "/csrc",
}))
"""


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """Build all member wheels and install them into a fresh venv; return the probe's report."""
    tmp = tmp_path_factory.mktemp("packaging")
    wheels = [_build(m, "wheel", tmp / "wheels" / m.name) for m in MEMBERS]
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    # --no-deps: this checks the wheels themselves (files, metadata, namespace layout) quickly
    # and offline. Dependency resolution is exercised by uv.lock (`uv sync --locked` in nox).
    pip_install = [python, *"-m pip install -q --no-deps --no-index --disable-pip-version-check".split()]
    subprocess.run([*pip_install, *wheels], check=True)
    modules = [f"trnmodels.{p.parent.name}" for m in MEMBERS for p in m.glob("src/trnmodels/*/__init__.py")]
    env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "PYTHONHOME", "PYTHONSAFEPATH"}}
    cwd = tmp_path_factory.mktemp("clean_cwd")
    proc = subprocess.run([python, "-c", PROBE, *modules], cwd=cwd, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, f"importing {modules} in the fresh venv failed:\n{proc.stderr}"
    return json.loads(proc.stdout)


def test_members_share_one_namespace_in_site_packages(installed):
    site = Path(installed["site"]).resolve()
    assert installed["namespace_file"] is None, "trnmodels must be a namespace package (no __init__.py)"
    assert [Path(p).resolve() for p in installed["namespace_path"]] == [site / "trnmodels"]
    assert {"trnmodels.core", "trnmodels.llama3"} <= installed["modules"].keys()
    for module, file in installed["modules"].items():
        assert Path(file).resolve().is_relative_to(site / "trnmodels"), f"{module} imported from {file}"


def test_the_cpu_kernels_c_sources_ship_where_the_module_builds_them_from(installed):
    folder = Path(installed["kernel_sources"])
    assert folder.resolve().is_relative_to(Path(installed["site"]).resolve())
    sources = sorted((ROOT / "core/src/trnmodels/core/cpu/csrc").glob("*.cpp"))
    assert {s.name for s in sources} >= {"bf16_gemm.cpp", "decode_attention.cpp"}
    for source in sources:
        assert (folder / source.name).read_bytes() == source.read_bytes(), source.name


def test_entry_points(installed):
    eps = installed["entry_points"]
    assert eps.get("llama3") == "trnmodels.llama3:PLUGIN", eps
    for member in MEMBERS:
        declared = _project(member).get("entry-points", {}).get("trnmodels.models", {})
        assert declared.items() <= eps.items(), f"{member.name}: {declared} not in installed {eps}"


@pytest.mark.parametrize("member", MEMBERS, ids=lambda m: m.name)
def test_sdist_contents(member, tmp_path):
    sdist = _build(member, "sdist", tmp_path)
    with tarfile.open(sdist) as tar:
        # sdist members are "<name>-<version>/<path>"
        files = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    assert {"CHANGELOG.md", "pyproject.toml"} <= files, sorted(files)
