"""``trnmodels info``: the installed plugins, their versions and architectures."""

from __future__ import annotations

import argparse
from typing import Any


def cmd_info(args: argparse.Namespace) -> dict[str, Any]:
    from .. import __version__, neuron
    from ..omni.registry import diffusion_plugins
    from ..plugins import discover_plugins

    plugins = discover_plugins()
    return {
        "core_version": __version__,
        "neuron_sdk": neuron.sdk_available(),
        "plugins": [
            {
                "name": p.name,
                "version": p.version,
                "distribution": p.distribution,
                "architectures": list(p.architectures),
                "kind": "llm",
            }
            for p in plugins.values()
        ]
        + [{**p, "kind": "diffusion"} for p in diffusion_plugins()],
    }


def print_info(result: dict[str, Any]) -> None:
    print(
        f"trnmodels-core {result['core_version']}  (Neuron SDK: {'yes' if result['neuron_sdk'] else 'no, CPU mode'})"
    )
    if not result["plugins"]:
        print("no model plugins installed")
    for p in result["plugins"]:
        print(f"  {p['name']:<12} {p['version']:<10} {', '.join(p['architectures'])}")


def add_info_parser(sub: Any) -> None:
    """Register ``trnmodels info`` on the CLI's subparsers."""
    info = sub.add_parser("info", help="installed plugins, their versions and architectures")
    info.add_argument("--json", action="store_true", help="machine-readable output")
    info.set_defaults(run=cmd_info, print_human=print_info)
