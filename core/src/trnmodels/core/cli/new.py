"""``trnmodels new NAME --from TEMPLATE --architecture HF_ARCH``: Stages 1 and 2 of onboarding, the plugin
scaffold (``onboarding.scaffold``)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ..errors import InputError


def workspace_root(start: Path) -> Path:
    """The nearest folder at or above ``start`` whose pyproject.toml declares the uv workspace."""
    for folder in (start, *start.parents):
        pyproject = folder / "pyproject.toml"
        if pyproject.is_file() and "[tool.uv.workspace]" in pyproject.read_text():
            return folder
    raise InputError(f"{start}: not inside the trnmodels workspace (no pyproject.toml with [tool.uv.workspace]); "
                     "give --root")  # fmt: skip


def cmd_new(args: argparse.Namespace) -> dict[str, Any]:
    from ..onboarding.scaffold import scaffold

    root = Path(args.root) if args.root else workspace_root(Path.cwd().resolve())
    return scaffold(root, args.name, args.template, args.architecture, lock=not args.no_lock)


def print_new(result: dict[str, Any]) -> None:
    print(
        f"wrote {result['folder']}: {result['distribution']} serving {result['architecture']} "
        f"(model_type {result['model_type']!r}) from the {result['template']} template"
    )
    print(f"  tiny config from {result['tiny_config_from']}")
    for file in result["files"]:
        print(f"  {file}")
    print(
        "  workspace: added to pyproject.toml"
        + (" and uv.lock" if result["locked"] else " (uv.lock not refreshed)")
    )
    print(f"next: {result['next']}  (a failure names the key or layer the template does not cover)")


def add_new_parser(sub: Any) -> None:
    """Register ``trnmodels new`` on the CLI's subparsers."""
    new = sub.add_parser(
        "new",
        help="Stages 1-2 of a port: scaffold models/NAME from a template plugin",
        description="Write models/NAME from a template plugin (llama3: dense, gpt_oss: mixture of experts) for "
        "the transformers class HF_ARCH: the plugin, its model and factory, a tiny config shrunk from the "
        "architecture's published (or default) config, the conformance tests against HF_ARCH, pyproject, "
        "README, CHANGELOG and a model card stub; add it to the uv workspace and refresh uv.lock.",
    )
    new.add_argument(
        "name", metavar="NAME", help="the plugin: package trnmodels.NAME, distribution trnmodels-NAME"
    )
    new.add_argument("--from", dest="template", required=True, metavar="TEMPLATE", help="llama3 or gpt_oss")
    new.add_argument("--architecture", required=True, metavar="HF_ARCH", help="e.g. MistralForCausalLM")
    new.add_argument(
        "--root", default=None, help="the workspace (default: the one around the current folder)"
    )
    new.add_argument("--no-lock", action="store_true", help="do not run `uv lock` afterwards")
    new.add_argument("--json", action="store_true", help="machine-readable output (one JSON object)")
    new.set_defaults(run=cmd_new, print_human=print_new)
