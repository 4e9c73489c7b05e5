"""``trnmodels compile``: compile every bucket graph of an LLM checkpoint ahead of time into the cache."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ..argtypes import positive_int
from .flags import add_runtime_flags, runner_config


def cmd_compile(args: argparse.Namespace) -> dict[str, Any]:
    from tqdm.auto import tqdm

    from ..compile import CompileTarget, GraphResult, compile_all
    from ..runner.graphs import all_graph_specs

    target = CompileTarget(
        str(args.checkpoint_dir), runner_config(args), tp=args.tp, dtype=args.dtype, ep=args.ep
    )
    specs = all_graph_specs(target.runner)
    with tqdm(total=len(specs), desc="compiling graphs", unit="graph", disable=None) as bar:

        def done(result: GraphResult) -> None:
            bar.set_postfix_str(f"{result.name} {result.cache}")
            bar.update()

        results = compile_all(target, args.cache_dir, jobs=args.jobs, specs=specs, on_result=done)
    return {
        "graphs": [
            {"name": r.name, "bucket": r.bucket, "seconds": round(r.seconds, 3), "cache": r.cache}
            for r in results
        ],
        "cache_dir": str(Path(results[0].path).parents[1]) if results else args.cache_dir,
    }


def print_compile(result: dict[str, Any]) -> None:
    for g in result["graphs"]:
        print(f"  {g['name']:<20} {g['cache']:<5} {g['seconds']:8.2f} s")
    hits = sum(g["cache"] == "hit" for g in result["graphs"])
    print(f"{len(result['graphs'])} graphs, {hits} cache hits, cache at {result['cache_dir']}")


def add_compile_parser(sub: Any) -> None:
    """Register ``trnmodels compile`` on the CLI's subparsers."""
    compile_ = sub.add_parser(
        "compile",
        help="compile every bucket graph ahead of time into the cache",
        description="Compile every bucket graph ahead of time into the artifact cache. The artifacts are "
        "native code that later runs load into their process, so the cache folder must be trusted: it is "
        "created private (0700), and a cache folder, entry or artifact that other users can write (or "
        "that another user owns) is refused: fix it with chmod -R go-w CACHE_DIR, and do not share one "
        "cache folder between users.",
    )
    compile_.add_argument("checkpoint_dir", type=Path, help="a checkpoint (only config.json is read)")
    compile_.add_argument(
        "--jobs",
        type=positive_int,
        default=1,
        help="graphs compiled at a time: this process and J-1 worker processes",
    )
    add_runtime_flags(compile_)
    compile_.set_defaults(run=cmd_compile, print_human=print_compile)
