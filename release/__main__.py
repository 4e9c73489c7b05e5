"""``python -m release``: plan, run, seed, notes, resolve-tag (see docs/releasing.md)."""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from . import changelog, record
from .errors import ReleaseError
from .packages import discover, find
from .pipeline import Release, seed
from .plan import format_plan, make_plan

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_INDEX = ROOT / "dist" / "index"
TAG = re.compile(r"^(?P<name>trnmodels-[a-z0-9-]+?)-v(?P<version>\d[^-]*)$")


def _port(text: str) -> int:
    port = int(text)
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"a TCP port is 1..65535, got {port}")
    return port


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m release", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    plan = sub.add_parser("plan", help="which packages changed since their recorded release")
    plan.add_argument("--json", action="store_true")
    for name, help_ in (("run", "release one package"), ("seed", "publish every recorded release")):
        cmd = sub.add_parser(name, help=help_)
        if name == "run":
            cmd.add_argument("package", help="core, llama3, gpt_oss, ... (or the distribution name)")
            cmd.add_argument(
                "--recorded",
                action="store_true",
                help="re-cut the recorded release from its commit (tag workflow)",
            )
        cmd.add_argument("--index-dir", type=Path, default=DEFAULT_INDEX, help=f"default: {DEFAULT_INDEX}")
        cmd.add_argument("--port", type=_port, default=None, help="default: a free port on 127.0.0.1")
    notes = sub.add_parser("notes", help="the CHANGELOG section of a package's recorded release")
    notes.add_argument("package")
    tag = sub.add_parser("resolve-tag", help="the package a release tag names (trnmodels-<package>-vX.Y.Z)")
    tag.add_argument("tag")
    args = parser.parse_args(argv)
    try:
        if args.command == "plan":
            entries = make_plan(ROOT)
            print(json.dumps([e.as_json() for e in entries], indent=2) if args.json else format_plan(entries))
        elif args.command == "run":
            Release(ROOT, args.package, args.index_dir, args.port).run(recorded=args.recorded)
        elif args.command == "seed":
            seed(ROOT, args.index_dir, args.port)
        elif args.command == "notes":
            print(recorded_notes(ROOT, args.package))
        else:
            print(resolve_tag(ROOT, args.tag))
    except ReleaseError as e:
        print(f"release refused: {e}", file=sys.stderr)
        return 1
    return 0


def recorded_notes(root: Path, which: str) -> str:
    pkg = find(discover(root), which)
    last = record.load(root).get(pkg.name)
    if last is None:
        raise ReleaseError(f"{pkg.name} has no recorded release in {record.RECORD}")
    return changelog.section(root / pkg.folder / "CHANGELOG.md", last.version).body


def resolve_tag(root: Path, tag: str) -> str:
    match = TAG.match(tag)
    if not match:
        raise ReleaseError(f"tag {tag!r} is not of the form trnmodels-<package>-vX.Y.Z")
    by_name = {pkg.name: pkg for pkg in discover(root).values()}
    pkg = by_name.get(match["name"])
    if pkg is None:
        raise ReleaseError(f"tag {tag!r} names no package (the packages are {', '.join(by_name)})")
    last = record.load(root).get(pkg.name)
    if last is None or last.version != match["version"]:
        recorded = last.version if last else "none"
        raise ReleaseError(
            f"tag {tag!r}: the recorded release of {pkg.name} is {recorded}, not {match['version']}"
        )
    return pkg.short


if __name__ == "__main__":
    sys.exit(main())
