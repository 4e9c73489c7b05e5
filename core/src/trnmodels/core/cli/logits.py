"""``trnmodels logits``: teacher-forced logits at every position (prefill, then decode steps), written
as a ``.safetensors`` file (tensor ``logits``, ``[T, vocab]``, float32)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from ..argtypes import int_list, positive_int
from ..errors import InputError
from ..runtime_config import DTYPES
from .flags import add_parallel_flags
from .outputs import replace_output


def reserve_output(out: Path) -> Path:
    """Check that ``--out`` can be written before any work starts, by creating the temporary file the
    result is written to first (``os.access`` would say yes to root on a read-only directory)."""
    if out.is_dir():
        raise InputError(f"--out: {out} is a directory; expected a file path for the .safetensors output")
    if not out.parent.exists():
        raise InputError(f"--out: directory {out.parent} does not exist")
    if not out.parent.is_dir():
        raise InputError(f"--out: {out.parent} is not a directory")
    tmp = out.with_name(f"{out.name}.{os.getpid()}.partial")
    try:
        tmp.open("xb").close()
    except OSError as e:
        raise InputError(f"--out: cannot write in {out.parent}: {e.strerror or e}") from None
    return tmp


def cmd_logits(args: argparse.Namespace) -> dict[str, Any]:
    import torch
    from safetensors.torch import save_file

    from ..runner.score import score_checkpoint

    out = Path(args.out)
    # The result goes to a temporary file beside the target, renamed over it only on success: a failed
    # or interrupted run leaves neither a partial file nor a damaged previous result.
    tmp = reserve_output(out)
    try:
        logits = score_checkpoint(
            args.checkpoint_dir, args.token_ids, args.prefill_len, tp=args.tp, ep=args.ep, dtype=args.dtype
        )
        try:
            save_file({"logits": logits.to(torch.float32).contiguous()}, str(tmp))
            replace_output(tmp, out)
        except OSError as e:
            raise InputError(f"--out: cannot write {out}: {e.strerror or e}") from None
    finally:
        tmp.unlink(missing_ok=True)
    prefill = args.prefill_len or len(args.token_ids)
    return {
        "out": str(out),
        "shape": list(logits.shape),
        "prefill_len": prefill,
        "decode_steps": len(args.token_ids) - prefill,
        "tp": args.tp,
        "ep": args.ep,
        "dtype": args.dtype,
    }


def print_logits(result: dict[str, Any]) -> None:
    print(
        f"wrote logits {result['shape']} to {result['out']} "
        f"(prefill {result['prefill_len']}, decode steps {result['decode_steps']}, "
        f"tp {result['tp']}, ep {result['ep']}, {result['dtype']})"
    )


def add_logits_parser(sub: Any) -> None:
    """Register ``trnmodels logits`` on the CLI's subparsers."""
    logits = sub.add_parser(
        "logits", help="teacher-forced logits at every position (prefill, then decode steps)"
    )
    logits.add_argument("checkpoint_dir", type=Path)
    logits.add_argument("--token-ids", type=int_list, required=True, help="comma-separated ids, e.g. 1,2,3")
    logits.add_argument(
        "--prefill-len", type=positive_int, default=None, help="ids run as one prefill (default: all)"
    )
    add_parallel_flags(logits)
    logits.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    logits.add_argument("--out", required=True, help="output .safetensors file (tensor 'logits', [T, vocab])")
    logits.add_argument("--json", action="store_true", help="machine-readable output")
    logits.set_defaults(run=cmd_logits, print_human=print_logits)
