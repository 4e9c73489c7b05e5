"""One package's release, step by step (the numbers are the steps of docs/releasing.md).

Every step's findings go to ``dist/release-<package>.json``, written also when a step refuses. Nothing
is recorded (CHANGELOG date, ``release/record.json``) until every step has passed; a release that
stopped after publishing resumes on the next run without uploading a file twice.
"""

from __future__ import annotations

import datetime
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from packaging.version import Version

from . import build, changelog, gates, git, record, verify
from .errors import ReleaseError
from .index import LocalIndex
from .install import UserEnv, torch_pin
from .packages import Package, discover, find
from .plan import make_plan

Log = Callable[[str], None]


def _today() -> str:
    return datetime.datetime.now(datetime.UTC).date().isoformat()


class Release:
    def __init__(self, root: Path, which: str, index_dir: Path, port: int | None, log: Log = print) -> None:
        self.root = root
        self.packages = discover(root)
        self.pkg: Package = find(self.packages, which)
        self.core: Package = self.packages["core"]
        self.index_dir = index_dir
        self.port = port
        self.log = log
        self.dist = root / "dist"
        self.report: dict[str, Any] = {"package": self.pkg.short, "name": self.pkg.name, "steps": {}}
        self.work = Path(tempfile.mkdtemp(prefix=f"release-{self.pkg.short}-"))  # outside the repository

    def step(self, name: str, findings: Any) -> None:
        self.report["steps"][name] = findings
        self.log(f"[release] {name}: ok")

    # 1-2
    def plan_and_gates(self) -> None:
        plan = {e.package: e for e in make_plan(self.root)}
        entry = plan[self.pkg.short]
        self.step("plan", {"this": entry.as_json(), "all": [e.as_json() for e in plan.values()]})
        gates.clean_tree(self.root)
        gates.needs_release(self.pkg, entry)
        gates.version_bumped(self.pkg, entry)
        gates.changelog_entry(self.root, self.pkg)
        gates.no_prerelease_dependencies(self.pkg)
        gates.core_in_range(self.pkg, self.core)
        gates.lock_in_sync(self.root)
        self.step(
            "gates",
            [
                "clean tree",
                "changed and bumped",
                "changelog entry",
                "no prerelease dependency",
                "core in range",
                "uv.lock in sync",
            ],
        )

    # 3-4
    def build_and_verify(self, source_root: Path, expected: dict[str, str] | None = None) -> build.Artifacts:
        artifacts = build.build(source_root, self.pkg, self.work / "build")
        self.step(
            "build",
            {"wheel": artifacts.wheel.name, "sdist": artifacts.sdist.name, "rebuilt_wheel_equal": True},
        )
        verify.twine_check(artifacts)
        contents = verify.check_wheel(self.pkg, artifacts)
        hashes = verify.hashes(artifacts)
        if expected is not None and hashes != expected:
            raise ReleaseError(
                f"rebuilt {self.pkg.name} {self.pkg.version} from its recorded commit, but the files differ "
                f"from the record: {hashes} != {expected}"
            )
        self.step("verify", {"twine_check": "passed", **contents, "sha256": hashes})
        return artifacts

    # 5
    def publish(self, index: LocalIndex, artifacts: build.Artifacts) -> None:
        held = {f: index.held(f) for f in (p.name for p in artifacts.files)}
        ours = verify.hashes(artifacts)
        resuming = any(held.values()) and all(h in (None, ours[f]) for f, h in held.items())
        gates.newer_than_index(self.pkg, index.versions(self.pkg.name), resuming)
        uploaded = index.upload(list(artifacts.files))
        out = self.dist / "release" / f"{self.pkg.name}-{self.pkg.version}"
        out.mkdir(parents=True, exist_ok=True)
        for path in artifacts.files:
            shutil.copy2(path, out / path.name)
        skipped = sorted(set(ours) - set(uploaded))
        self.step(
            "publish", {"index": index.url, "uploaded": uploaded, "already_held": skipped, "dist": str(out)}
        )

    # 6-7
    def install_and_matrix(self, index: LocalIndex) -> None:
        env = UserEnv.create(self.work / "venv", torch_pin(self.root))
        report = self.work / "pip-report.json"
        taken = env.install(index, [f"{self.pkg.name}=={self.pkg.version}"], report)
        core_version = taken["trnmodels-core"]["version"]
        smoke = env.smoke(self.pkg, str(self.pkg.version), core_version, self.work / "smoke")
        self.step("install", {"environment": str(env.path), "installed": taken, "smoke": smoke})
        cells = self.matrix_cells(index)
        if not cells:
            self.log("[release] matrix: no plugin has a recorded release to check against this core")
        results = []
        for plugin, version, core, head_wheel in cells:
            pins = [f"{plugin.name}=={version}"] + ([] if head_wheel else [f"{self.core.name}=={core}"])
            label = f"{plugin.short} {version} x core {core}{' (HEAD)' if head_wheel else ''}"
            try:
                env.install(index, pins, report, (head_wheel,) if head_wheel else ())
                found = env.smoke(plugin, version, core, self.work / "smoke")
                results.append({"cell": label, "passed": True, **found})
            except ReleaseError as e:
                results.append({"cell": label, "passed": False, "error": str(e)})
            self.log(f"[release] matrix {label}: {'pass' if results[-1]['passed'] else 'FAIL'}")
        self.report["steps"]["matrix"] = results
        failed = [r["cell"] for r in results if not r["passed"]]
        if failed:
            raise ReleaseError(
                f"compatibility matrix: {'; '.join(failed)} failed (see dist/release-{self.pkg.short}.json)"
            )
        self.log("[release] matrix: ok")

    def matrix_cells(self, index: LocalIndex) -> list[tuple[Package, str, str, Path | None]]:
        """(plugin, its version, core version, core wheel built from HEAD or None) per cell."""
        head_core = build.build(self.root, self.core, self.work / "core-head").wheel
        head = str(self.core.version)
        if self.pkg.kind != "core":
            allowed = [
                v for v in index.versions(self.core.name) if self.pkg.core_range.contains(v, prereleases=True)
            ]
            lowest = str(min(allowed))
            return [
                (self.pkg, str(self.pkg.version), lowest, None),
                (self.pkg, str(self.pkg.version), head, head_core),
            ]
        records = record.load(self.root)
        cells = []
        for plugin in self.packages.values():
            if plugin.kind != "core" and plugin.name in records:
                cells.append((plugin, records[plugin.name].version, head, head_core))
        return cells

    # 8
    def record(self, commit: str) -> None:
        date = _today()
        records = record.load(self.root)
        hashes = self.report["steps"]["verify"]["sha256"]
        records[self.pkg.name] = record.Released(str(self.pkg.version), commit, date, hashes)
        changelog.date_section(self.root / self.pkg.folder / "CHANGELOG.md", str(self.pkg.version), date)
        record.save(self.root, records)
        self.step(
            "record", {"date": date, "commit": commit, "tag": self.pkg.tag, "record": str(record.RECORD)}
        )
        self.log(
            f"[release] {self.pkg.name} {self.pkg.version} released; commit the record and tag it: "
            f"git tag {self.pkg.tag}"
        )

    def ensure_core_installable(self, index: LocalIndex) -> None:
        """A plugin's users need a core in its range from the same index (else pip's fallback to PyPI
        would supply one: the name would come from two places)."""
        if self.pkg.kind == "core":
            return
        allowed = [
            v for v in index.versions(self.core.name) if self.pkg.core_range.contains(v, prereleases=True)
        ]
        if not allowed:
            raise ReleaseError(
                f"the index holds no {self.core.name} in {self.pkg.name}'s range {self.pkg.core_range}: "
                "release core first"
            )

    def run(self, recorded: bool = False) -> dict[str, Any]:
        """The whole release (``recorded``: re-cut the recorded release from its commit instead, for the
        tag workflow: nothing is gated on changes and nothing is recorded)."""
        self.report["version"] = str(self.pkg.version)
        self.report["mode"] = "recorded" if recorded else "release"
        try:
            if recorded:
                last = self.recorded_release()
                source = git.export(self.root, last.commit, self.work / "source")
                artifacts = self.build_and_verify(source, expected=last.files)
            else:
                self.plan_and_gates()
                commit = git.head(self.root)
                artifacts = self.build_and_verify(self.root)
            with LocalIndex(self.index_dir, self.port) as index:
                self.ensure_core_installable(index)
                self.publish(index, artifacts)
                self.install_and_matrix(index)
            if not recorded:
                self.record(commit)
            self.report["result"] = "released" if not recorded else "re-cut"
            return self.report
        except ReleaseError as e:
            self.report["result"] = "refused"
            self.report["error"] = str(e)
            raise
        finally:
            self.write_report()
            shutil.rmtree(self.work, ignore_errors=True)

    def recorded_release(self) -> record.Released:
        records = record.load(self.root)
        last = records.get(self.pkg.name)
        if last is None:
            raise ReleaseError(f"{self.pkg.name} has no recorded release in {record.RECORD}")
        if Version(last.version) != self.pkg.version:
            raise ReleaseError(
                f"{self.pkg.name}: HEAD is version {self.pkg.version} but the record's release is {last.version}"
            )
        return last

    def write_report(self) -> None:
        self.dist.mkdir(exist_ok=True)
        path = self.dist / f"release-{self.pkg.short}.json"
        tmp = path.with_name(f"{path.name}.{os.getpid()}.partial")
        tmp.write_text(json.dumps(self.report, indent=2) + "\n")
        tmp.replace(path)


def seed(root: Path, index_dir: Path, port: int | None, log: Log = print) -> dict[str, list[str]]:
    """Publish every recorded release, rebuilt from the commit the record names and checked against the
    record's sha256, to the index at ``index_dir``: the index a user sees, recreated (CI's fresh index,
    or a maintainer's lost one). Files the index already holds with the same bytes are skipped."""
    records = record.load(root)
    published: dict[str, list[str]] = {}
    with tempfile.TemporaryDirectory(prefix="release-seed-") as tmp, LocalIndex(index_dir, port) as index:
        sources: dict[str, Path] = {}
        for short, pkg in discover(root).items():
            last = records.get(pkg.name)
            if last is None:
                continue
            if last.commit not in sources:
                sources[last.commit] = git.export(root, last.commit, Path(tmp) / last.commit)
            released = discover(sources[last.commit])[short]
            artifacts = build.build(sources[last.commit], released, Path(tmp) / "build" / short)
            hashes = verify.hashes(artifacts)
            if hashes != last.files:
                raise ReleaseError(
                    f"{pkg.name} {last.version} rebuilt from {last.commit[:12]} differs from the record: "
                    f"{hashes} != {last.files}"
                )
            published[pkg.name] = index.upload(list(artifacts.files))
            log(f"[release] seeded {pkg.name} {last.version} ({len(published[pkg.name])} file(s) uploaded)")
    return published
