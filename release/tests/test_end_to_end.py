"""The whole release of one plugin, on a clone of this repository, against a real local index.

The index starts as a user sees it today: every recorded release, rebuilt from the commit the record
names (which also proves the builds reproduce the recorded sha256). Then one plugin changes: the plan
moves only it to `release`, its release is refused until its version and CHANGELOG are bumped, and then it is
released alone (fresh venv, pip from the index, smoke test, compatibility matrix) while the other
packages' records and index files stay as they were.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from release import record
from release.__main__ import resolve_tag
from release.errors import ReleaseError
from release.pipeline import Release, seed
from release.plan import make_plan

from .conftest import commit_all, git, lock, read_json, set_version

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow  # builds of every package, a pypiserver, a fresh venv with torch


@pytest.fixture
def clone(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(repo)], check=True)
    git(repo, "config", "user.email", "release-tests@example.com")
    git(repo, "config", "user.name", "release tests")
    return repo


def index_files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


def test_a_change_in_one_plugin_is_released_alone(clone: Path, tmp_path: Path):
    index = tmp_path / "index"
    before = record.load(clone)
    assert set(before) == {
        "trnmodels-core",
        "trnmodels-llama3",
        "trnmodels-gpt-oss",
        "trnmodels-gemma4",
        "trnmodels-wan22",
    }
    seed(clone, index, None, log=print)
    seeded = index_files(index)
    assert len(seeded) == 2 * len(before)

    # The repository may hold changes not released yet (core's, say): the llama3 change must move llama3
    # alone to "release" and leave every other package's action as it was.
    # llama3 itself may hold some too (a new test, say): the change adds its file to those.
    pending = {e.package: e for e in make_plan(clone)}
    unchanged = {k: e.action for k, e in pending.items() if k != "llama3"}
    module = clone / "models/llama3/src/trnmodels/llama3/__init__.py"
    module.write_text(module.read_text() + "\n# A change that ships in the wheel.\n")
    commit_all(clone, "llama3: a change")
    plan = {e.package: e for e in make_plan(clone)}
    assert {k: e.action for k, e in plan.items()} == {**unchanged, "llama3": "release"}
    changed = {*pending["llama3"].changed, "models/llama3/src/trnmodels/llama3/__init__.py"}
    assert sorted(plan["llama3"].changed) == sorted(changed)

    old = before["trnmodels-llama3"].version
    with pytest.raises(
        ReleaseError, match=re.escape(f"trnmodels-llama3 changed since {old} (e.g. models/llama3")
    ):
        Release(clone, "llama3", index, None).run()
    assert read_json(clone / "dist/release-llama3.json")["result"] == "refused"

    new = f"{old.rsplit('.', 1)[0]}.{int(old.rsplit('.', 1)[1]) + 1}"
    set_version(clone, "models/llama3", old, new)
    lock(clone)
    commit_all(clone, f"llama3 {new}")
    head = git(clone, "rev-parse", "HEAD").strip()
    report = Release(clone, "llama3", index, None).run()

    assert report["result"] == "released"
    steps = report["steps"]
    assert steps["install"]["installed"]["trnmodels-llama3"]["version"] == new
    assert steps["install"]["installed"]["trnmodels-llama3"]["from"].startswith(steps["publish"]["index"])
    assert steps["install"]["smoke"]["logits_max_abs_error"] <= 1e-4
    assert [c["passed"] for c in steps["matrix"]] == [True, True]
    after = record.load(clone)
    assert after["trnmodels-llama3"].version == new and after["trnmodels-llama3"].commit == head
    assert {k: v for k, v in after.items() if k != "trnmodels-llama3"} == {
        k: v for k, v in before.items() if k != "trnmodels-llama3"
    }
    published = index_files(index)
    assert {k: v for k, v in published.items() if k in seeded} == seeded  # nothing overwritten
    assert sorted(set(published) - set(seeded)) == [
        f"trnmodels_llama3-{new}-py3-none-any.whl",
        f"trnmodels_llama3-{new}.tar.gz",
    ]
    changelog = (clone / "models/llama3/CHANGELOG.md").read_text()
    assert re.search(rf"^## \[{re.escape(new)}\] - \d{{4}}-\d{{2}}-\d{{2}}$", changelog, re.MULTILINE)

    commit_all(clone, f"Release trnmodels-llama3 {new}")
    assert resolve_tag(clone, f"trnmodels-llama3-v{new}") == "llama3"
    # Refused either way: nothing changed since the release, or only core did (within llama3's range).
    again = {e.package: e.action for e in make_plan(clone)}["llama3"]
    assert again in ("none", "check")
    reason = (
        f"trnmodels-llama3 {re.escape(new)}: nothing changed since its release"
        if again == "none"
        else "trnmodels-llama3: core changed; .* it needs no release"
    )
    with pytest.raises(ReleaseError, match=reason):
        Release(clone, "llama3", index, None).run()
    assert index_files(index) == published
