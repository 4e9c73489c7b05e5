"""The ``trnmodels`` command line.

- ``trnmodels logits CHECKPOINT_DIR --token-ids 1,2,3 [--prefill-len K] [--tp N] [--dtype D] --out F``
- ``trnmodels info``

Every command takes ``--json``. Errors a user can cause print one line naming the problem and exit 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from .errors import TrnModelsError
from .runtime_config import DTYPES


def _token_ids(text: str) -> list[int]:
    try:
        ids = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not ids:
        raise argparse.ArgumentTypeError("expected at least one token id")
    return ids


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def cmd_logits(args: argparse.Namespace) -> dict:
    import torch
    from safetensors.torch import save_file

    from .runner.score import score_checkpoint

    out = Path(args.out)
    if not out.parent.exists():
        raise TrnModelsError(f"--out: directory {out.parent} does not exist")
    logits = score_checkpoint(
        args.checkpoint_dir, args.token_ids, args.prefill_len, tp=args.tp, dtype=args.dtype
    )
    # Write beside the target and rename, so an interrupted run never leaves a partial file.
    tmp = out.with_name(out.name + ".partial")
    save_file({"logits": logits.to(torch.float32).contiguous()}, str(tmp))
    tmp.replace(out)
    prefill = args.prefill_len or len(args.token_ids)
    return {
        "out": str(out),
        "shape": list(logits.shape),
        "prefill_len": prefill,
        "decode_steps": len(args.token_ids) - prefill,
        "tp": args.tp,
        "dtype": args.dtype,
    }


def cmd_info(args: argparse.Namespace) -> dict:
    from . import __version__, neuron
    from .plugins import discover_plugins

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
            }
            for p in plugins.values()
        ],
    }


def _print_human(command: str, result: dict) -> None:
    if command == "info":
        print(
            f"trnmodels-core {result['core_version']}  (Neuron SDK: {'yes' if result['neuron_sdk'] else 'no, CPU mode'})"
        )
        if not result["plugins"]:
            print("no model plugins installed")
        for p in result["plugins"]:
            print(f"  {p['name']:<12} {p['version']:<10} {', '.join(p['architectures'])}")
    elif command == "logits":
        print(
            f"wrote logits {result['shape']} to {result['out']} "
            f"(prefill {result['prefill_len']}, decode steps {result['decode_steps']}, tp {result['tp']}, {result['dtype']})"
        )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="trnmodels", description="Model plugins for vLLM on AWS Trainium.")
    sub = parser.add_subparsers(dest="command", required=True)

    logits = sub.add_parser(
        "logits", help="teacher-forced logits at every position (prefill, then decode steps)"
    )
    logits.add_argument("checkpoint_dir", type=Path)
    logits.add_argument("--token-ids", type=_token_ids, required=True, help="comma-separated ids, e.g. 1,2,3")
    logits.add_argument(
        "--prefill-len", type=_positive, default=None, help="ids run as one prefill (default: all)"
    )
    logits.add_argument("--tp", type=_positive, default=1, help="tensor-parallel degree (local gloo ranks)")
    logits.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    logits.add_argument("--out", required=True, help="output .safetensors file (tensor 'logits', [T, vocab])")
    logits.add_argument("--json", action="store_true", help="machine-readable output")
    logits.set_defaults(run=cmd_logits)

    info = sub.add_parser("info", help="installed plugins, their versions and architectures")
    info.add_argument("--json", action="store_true", help="machine-readable output")
    info.set_defaults(run=cmd_info)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        result = args.run(args)
    except TrnModelsError as e:
        print(f"trnmodels {args.command}: error: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(result))
    else:
        _print_human(args.command, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
