"""The plan: what changed since each package's recorded release, and what core's change means for the
plugins, on a real git history."""

from __future__ import annotations

from pathlib import Path

from release.__main__ import main
from release.plan import make_plan

from .conftest import commit_all, record_releases, set_version


def actions(root: Path) -> dict[str, tuple[str, str]]:
    return {e.package: (e.action, e.reason) for e in make_plan(root)}


def test_nothing_recorded_means_every_package_is_released(workspace):
    assert actions(workspace) == {"core": ("release", "never released"), "toy": ("release", "never released")}


def test_a_change_in_one_plugin_lists_only_that_plugin(workspace):
    record_releases(workspace, core="0.1.0", toy="0.1.0")
    assert {k: v[0] for k, v in actions(workspace).items()} == {"core": "none", "toy": "none"}
    module = workspace / "models/toy/src/trnmodels/toy/__init__.py"
    module.write_text(module.read_text() + "PLUGIN = None\n")
    commit_all(workspace, "toy: a change")
    (entry,) = [e for e in make_plan(workspace) if e.action != "none"]
    assert (entry.package, entry.action, entry.bumped) == ("toy", "release", False)
    assert entry.changed == ["models/toy/src/trnmodels/toy/__init__.py"]


def test_a_changelog_edit_alone_is_not_a_change(workspace):
    record_releases(workspace, core="0.1.0", toy="0.1.0")
    changelog = workspace / "core/CHANGELOG.md"
    changelog.write_text(changelog.read_text().replace("Unreleased", "2026-12-01"))
    commit_all(workspace, "date the changelog")
    assert actions(workspace)["core"] == ("none", "unchanged")


def test_core_changes_within_and_outside_a_plugins_range(workspace):
    record_releases(workspace, core="0.1.0", toy="0.1.0")
    set_version(workspace, "core", "0.1.0", "0.1.1")
    commit_all(workspace, "core 0.1.1")
    plan = actions(workspace)
    assert plan["core"][0] == "release"
    assert plan["toy"] == ("check", "core changed; 0.1.1 is within its range <0.2,>=0.1")
    set_version(workspace, "core", "0.1.1", "0.2.0")
    commit_all(workspace, "core 0.2.0")
    assert actions(workspace)["toy"] == ("release", "core 0.2.0 is outside its range <0.2,>=0.1")


def test_plan_json_and_table(workspace, monkeypatch, capsys):
    import json

    import release.__main__ as cli

    monkeypatch.setattr(cli, "ROOT", workspace)
    assert main(["plan", "--json"]) == 0
    assert [e["package"] for e in json.loads(capsys.readouterr().out)] == ["core", "toy"]
    assert main(["plan"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split() == ["package", "distribution", "HEAD", "released", "action", "why"]
    assert table[2].split()[:5] == ["core", "trnmodels-core", "0.1.0", "-", "release"]


def test_the_command_line_refuses_in_one_line(workspace, monkeypatch, capsys):
    import release.__main__ as cli

    monkeypatch.setattr(cli, "ROOT", workspace)
    assert main(["run", "mixtral"]) == 1
    assert capsys.readouterr().err == "release refused: no package 'mixtral': the packages are core, toy\n"
    assert main(["resolve-tag", "trnmodels-toy-v0.1.0"]) == 1
    assert "the recorded release of trnmodels-toy is none, not 0.1.0" in capsys.readouterr().err
    assert main(["resolve-tag", "llama3-0.1.0"]) == 1
    assert "is not of the form trnmodels-<package>-vX.Y.Z" in capsys.readouterr().err
    record_releases(workspace, core="0.1.0", toy="0.1.0")
    assert main(["resolve-tag", "trnmodels-toy-v0.1.0"]) == 0
    assert capsys.readouterr().out == "toy\n"
    assert main(["notes", "toy"]) == 0
    assert capsys.readouterr().out == "### Added\n- trnmodels-toy itself.\n"
