"""``trnmodels diff A B``: Step 0 of onboarding a model, the architecture diff (``onboarding.diff``)."""

from __future__ import annotations

import argparse
import json
from typing import Any

VALUE_WIDTH = 70


def cmd_diff(args: argparse.Namespace) -> dict[str, Any]:
    from ..onboarding.diff import architecture_diff

    return architecture_diff(args.a, args.b)


def _value(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= VALUE_WIDTH else text[: VALUE_WIDTH - 3] + "..."


def print_diff(result: dict[str, Any]) -> None:
    config = result["config"]
    print(f"A: {config['a']}")
    print(f"B: {config['b']}")
    print("\nconfig")
    if not (config["different"] or config["only_in_a"] or config["only_in_b"]):
        print("  no differences")
    for name, values in config["different"].items():
        print(f"  {name}: {_value(values['a'])} -> {_value(values['b'])}")
    for side in ("a", "b"):
        for name, value in config[f"only_in_{side}"].items():
            print(f"  only in {side.upper()}: {name} = {_value(value)}")

    print("\nchecklist (what B needs, from A)")
    for item, entry in result["checklist"].items():
        print(f"  {item:<22} {entry['verdict']}")
        for f in entry["findings"]:
            if f["verdict"] == "option":
                where = f"{f['option']}  [{f['module']}]"
            else:
                where = f"code: {f['file']}" + (f" (as in {f['example']})" if f["example"] else "")
            print(f"      {f['what']}\n        -> {where}")
        if entry["findings"]:
            fields = ", ".join(
                f"{k}: {_value(v['a'])} -> {_value(v['b'])}"
                for k, v in entry["fields"].items()
                if v["a"] != v["b"]
            )
            if fields:
                print(f"      fields: {fields}")

    print("\nplugins (B as it is)")
    for p in result["plugins"]:
        print(f"  {p['plugin']:<12} " + ("accepts" if p["accepts"] else f"refuses: {p['reason']}"))

    modules = result["modules"]
    print("\nmodules (transformers, meta device)")
    for side in ("a", "b"):
        m = modules[side]
        if m["error"]:
            print(f"  {side.upper()}: not built: {m['error']}")
            continue
        print(f"  {side.upper()}: {m['class']}" + (f" ({m['note']})" if m["note"] else ""))
        for line in m["tree"]:
            print(f"    {line}")
    for side in ("a", "b"):
        types = modules[f"only_in_{side}"]
        print(f"  only in {side.upper()}: {', '.join(types) if types else 'none'}")


def add_diff_parser(sub: Any) -> None:
    """Register ``trnmodels diff`` on the CLI's subparsers."""
    diff = sub.add_parser(
        "diff",
        help="Step 0 of a port: the architecture diff of two configs",
        description="Compare B (the model to onboard) against A (one already served): the config, the "
        "porting checklist, which plugins accept B, and the module trees. A and B are each a checkpoint "
        "folder, a config.json path or a bundled published config's name. Offline; no weights.",
    )
    diff.add_argument("a", metavar="A", help="checkpoint folder, config.json path or bundled config name")
    diff.add_argument("b", metavar="B", help="checkpoint folder, config.json path or bundled config name")
    diff.add_argument("--json", action="store_true", help="machine-readable output (one JSON object)")
    diff.set_defaults(run=cmd_diff, print_human=print_diff)
