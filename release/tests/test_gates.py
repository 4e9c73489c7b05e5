"""Each gate refuses with one line that names the problem, before anything is built."""

from __future__ import annotations

import re

import pytest

from release.errors import ReleaseError
from release.pipeline import Release

from .conftest import commit_all, lock, record_releases, set_version


def gates(root, which="toy"):
    release = Release(root, which, root / "dist" / "index", None, log=lambda _: None)
    try:
        release.plan_and_gates()
    finally:
        release.work.rmdir()


def refused(root, pattern, which="toy"):
    with pytest.raises(ReleaseError, match=pattern) as info:
        gates(root, which)
    assert "\n" not in str(info.value)


def change_toy(root):
    module = root / "models/toy/src/trnmodels/toy/__init__.py"
    module.write_text(module.read_text() + "PLUGIN = None\n")


def test_unknown_package(workspace):
    refused(workspace, re.escape("no package 'mixtral': the packages are core, toy"), "mixtral")


def test_a_first_release_passes_every_gate(workspace):
    gates(workspace)


def test_dirty_tree(workspace):
    change_toy(workspace)
    refused(workspace, r"working tree is not clean \(models/toy/src/trnmodels/toy/__init__.py\)")


def test_unchanged_package_has_nothing_to_release(workspace):
    record_releases(workspace, core="0.1.0", toy="0.1.0")
    refused(workspace, r"trnmodels-toy 0.1.0: nothing changed since its release from [0-9a-f]{12}")


def test_changed_but_not_bumped_then_no_changelog_then_released(workspace):
    record_releases(workspace, core="0.1.0", toy="0.1.0")
    change_toy(workspace)
    commit_all(workspace, "toy: a change")
    refused(
        workspace,
        re.escape(
            "trnmodels-toy changed since 0.1.0 (e.g. models/toy/src/trnmodels/toy/__init__.py) but its version is 0.1.0"
        ),
    )
    set_version(workspace, "models/toy", "0.1.0", "0.1.1", changelog=False)
    lock(workspace)
    commit_all(workspace, "toy 0.1.1 without a changelog entry")
    refused(workspace, re.escape("CHANGELOG.md: no section for 0.1.1 (sections: 0.1.0)"))
    set_version(workspace, "models/toy", "0.1.1", "0.1.1")
    commit_all(workspace, "toy 0.1.1 changelog")
    gates(workspace)


def test_lock_out_of_sync(workspace):
    set_version(workspace, "models/toy", "0.1.0", "0.1.1")
    commit_all(workspace, "bump without uv lock")
    refused(workspace, r"uv.lock is not in sync with the pyproject files: run `uv lock`")


def test_prerelease_dependency_in_a_stable_release(workspace):
    pyproject = workspace / "models/toy/pyproject.toml"
    pyproject.write_text(pyproject.read_text().replace(">=0.1,<0.2", ">=0.1.0rc1,<0.2"))
    lock(workspace)
    commit_all(workspace, "a prerelease floor")
    refused(workspace, re.escape("trnmodels-toy 0.1.0 is a stable release but depends on a prerelease"))


def test_core_range_must_include_the_core_released_with_it(workspace):
    set_version(workspace, "core", "0.1.0", "0.2.0")
    lock(workspace)
    commit_all(workspace, "core 0.2.0")
    refused(
        workspace, re.escape("trnmodels-toy declares trnmodels-core<0.2,>=0.1, which excludes core 0.2.0")
    )


def test_a_plugin_that_only_needs_the_compatibility_check(workspace):
    record_releases(workspace, core="0.1.0", toy="0.1.0")
    set_version(workspace, "core", "0.1.0", "0.1.1")
    lock(workspace)
    commit_all(workspace, "core 0.1.1")
    refused(workspace, r"trnmodels-toy: core changed; 0.1.1 is within its range .*: it needs no release")
    gates(workspace, "core")
