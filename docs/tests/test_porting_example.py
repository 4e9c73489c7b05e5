"""docs/porting.md's worked example (a Qwen 3 plugin) is real code: this test writes its files out and runs
its own tests, against transformers' ``Qwen3ForCausalLM``, in a fresh interpreter.

Every fenced block whose info string names a path (```` ```python models/qwen3/src/... ````) is one file
of the example. The plugin is made importable the way an install would: its ``src`` folder on the path,
beside a ``.dist-info`` whose entry points are the ones the example's ``pyproject.toml`` declares.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

PORTING = Path(__file__).resolve().parents[1] / "porting.md"
FILE_BLOCK = re.compile(r"^```\w+ (?P<path>\S+)\n(?P<body>.*?)^```$", re.MULTILINE | re.DOTALL)
PLUGIN = Path("models/qwen3")


def example_files() -> dict[Path, str]:
    files = {Path(m["path"]): m["body"] for m in FILE_BLOCK.finditer(PORTING.read_text())}
    assert files, f"{PORTING}: no file blocks (```python <path>) found"
    return files


def code_lines(text: str) -> int:
    """Lines that are neither blank nor a comment (imports and docstrings count)."""
    return sum(1 for line in text.splitlines() if line.strip() and not line.strip().startswith("#"))


def install(root: Path, files: dict[Path, str]) -> Path:
    """Write the example under ``root`` and make it importable; returns the folder to put on the path."""
    for path, body in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(body)
    project = tomllib.loads(files[PLUGIN / "pyproject.toml"])["project"]
    src = root / PLUGIN / "src"
    dist_info = src / f"{project['name'].replace('-', '_')}-{project['version']}.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n"
    )
    groups = project["entry-points"]
    (dist_info / "entry_points.txt").write_text(
        "".join(
            f"[{group}]\n" + "".join(f"{name} = {value}\n" for name, value in entries.items())
            for group, entries in groups.items()
        )
    )
    return src


def test_the_example_is_as_small_as_the_guide_says():
    files = example_files()
    python = {path: body for path, body in files.items() if path.suffix == ".py"}
    model = sum(code_lines(body) for path, body in python.items() if path.parts[:3] == (*PLUGIN.parts, "src"))
    tests = sum(
        code_lines(body) for path, body in python.items() if path.parts[:3] == (*PLUGIN.parts, "tests")
    )
    assert model < 60, f"the example's plugin source has {model} code lines (the guide promises under 60)"
    assert tests < 80, f"the example's tests have {tests} code lines (the guide promises under 80)"


@pytest.mark.parametrize(
    "tier", [pytest.param("not slow", id="fast"), pytest.param("slow", id="slow", marks=pytest.mark.slow)]
)
def test_the_example_plugin_passes_its_tests(tmp_path: Path, tier: str):
    src = install(tmp_path, example_files())
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(src), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", str(tmp_path / PLUGIN / "tests"), "-q", "-m", tier,
         "-p", "no:cacheprovider", "--rootdir", str(tmp_path)],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=3600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert re.search(r"\d+ passed", done.stdout), done.stdout[-2000:]
