"""What a built wheel must and must not hold, checked on real builds of the test workspace."""

from __future__ import annotations

import re
import zipfile

import pytest

from release.build import Artifacts
from release.errors import ReleaseError
from release.packages import discover
from release.verify import check_wheel, twine_check

from .conftest import build_toy


def with_extra_file(wheel, tmp_path, name, data=b""):
    """A copy of ``wheel`` with one more file (RECORD is not updated: check_wheel reads the files)."""
    out = tmp_path / "tampered" / wheel.name
    out.parent.mkdir()
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(out, "w") as dst:
        for item in src.infolist():
            dst.writestr(item, src.read(item))
        dst.writestr(name, data)
    return out


def test_a_good_plugin_wheel(workspace, tmp_path):
    toy = build_toy(workspace, tmp_path / "build")
    twine_check(toy)
    found = check_wheel(discover(workspace)["toy"], toy)
    assert found["requires_core"] == "trnmodels-core<0.2,>=0.1"
    assert found["entry_points"] == {"trnmodels.models": {"toy": "trnmodels.toy:PLUGIN"}}


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ("trnmodels/__init__.py", "holds trnmodels/__init__.py, which would break the shared namespace"),
        ("trnmodels/core/ops.py", "holds trnmodels/core/ops.py, outside its own subpackage trnmodels/toy/"),
        ("trnmodels/toy/tests/test_toy.py", "holds a test file, trnmodels/toy/tests/test_toy.py"),
    ],
)
def test_a_wheel_that_holds_too_much(workspace, tmp_path, extra, message):
    toy = build_toy(workspace, tmp_path / "build")
    tampered = Artifacts(with_extra_file(toy.wheel, tmp_path, extra), toy.sdist)
    with pytest.raises(ReleaseError, match=re.escape(message)):
        check_wheel(discover(workspace)["toy"], tampered)


def test_entry_points_and_core_range_must_match_the_pyproject(workspace, tmp_path):
    toy = build_toy(workspace, tmp_path / "build")
    pkg = discover(workspace)["toy"]
    moved = type(pkg)(
        **{**pkg.__dict__, "entry_points": {"trnmodels.models": {"toy": "trnmodels.toy:OTHER"}}}
    )
    with pytest.raises(ReleaseError, match=r"entry points .* differ from its pyproject's"):
        check_wheel(moved, toy)
    pyproject = workspace / "models/toy/pyproject.toml"
    pyproject.write_text(
        pyproject.read_text().replace('dependencies = ["trnmodels-core>=0.1,<0.2"]', "dependencies = []")
    )
    unpinned = build_toy(workspace, tmp_path / "unpinned")
    with pytest.raises(ReleaseError, match="no Requires-Dist on trnmodels-core with a version range"):
        check_wheel(discover(workspace)["toy"], unpinned)


def test_twine_refuses_a_broken_readme(workspace, tmp_path):
    pyproject = workspace / "models/toy/pyproject.toml"
    pyproject.write_text(
        pyproject.read_text().replace(
            'readme = "README.md"', 'readme = {text = "`unclosed", content-type = "text/x-rst"}'
        )
    )
    broken = build_toy(workspace, tmp_path / "build")
    with pytest.raises(ReleaseError, match="twine check --strict refused"):
        twine_check(broken)
