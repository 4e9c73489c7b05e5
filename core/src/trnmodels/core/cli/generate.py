"""``trnmodels generate``: generate text through the runner (compiled graphs when cached)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ..argtypes import finite_float, nonnegative_int, positive_int, seed
from .flags import add_runtime_flags, runner_config


def cmd_generate(args: argparse.Namespace) -> dict[str, Any]:
    from ..runner.config import SamplingParams
    from ..runner.generate import generate_texts

    params = SamplingParams(
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        seed=args.seed,
        ignore_eos=args.ignore_eos,
    )
    outputs, stats = generate_texts(
        args.checkpoint_dir,
        args.prompt,
        params,
        runner=runner_config(args),
        tp=args.tp,
        ep=args.ep,
        dtype=args.dtype,
        cache_dir=args.cache_dir,
        eager=args.eager,
    )
    return {"outputs": outputs, "compiled_graphs": stats["compiled_graphs"]}


def print_generate(result: dict[str, Any]) -> None:
    for out in result["outputs"]:
        print(
            f"{out['prompt']!r} -> {out['text']!r}  ({len(out['token_ids'])} tokens, {out['finish_reason']})"
        )


def add_generate_parser(sub: Any) -> None:
    """Register ``trnmodels generate`` on the CLI's subparsers."""
    generate = sub.add_parser(
        "generate", help="generate text through the runner (compiled graphs when cached)"
    )
    generate.add_argument("checkpoint_dir", type=Path)
    generate.add_argument("--prompt", action="append", required=True, help="a prompt; repeat for a batch")
    generate.add_argument("--max-new-tokens", type=positive_int, required=True)
    generate.add_argument(
        "--temperature", type=finite_float(0), default=0.0, help=">= 0; 0 is greedy (default)"
    )
    generate.add_argument("--top-k", type=nonnegative_int, default=0, help="0 keeps every token")
    generate.add_argument("--top-p", type=finite_float(0, 1, low_open=True), default=1.0, help="in (0, 1]")
    generate.add_argument(
        "--seed", type=seed, default=None, help="in [0, 2**64 - 1] (default: a random seed)"
    )
    generate.add_argument("--ignore-eos", action="store_true", help="always generate --max-new-tokens")
    generate.add_argument("--eager", action="store_true", help="skip compiled artifacts")
    add_runtime_flags(generate)
    generate.set_defaults(run=cmd_generate, print_human=print_generate)
