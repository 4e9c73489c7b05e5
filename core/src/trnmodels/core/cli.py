"""The ``trnmodels`` command line.

- ``trnmodels logits CHECKPOINT_DIR --token-ids 1,2,3 [--prefill-len K] [--tp N] [--ep N] [--dtype D] --out F``
- ``trnmodels generate CHECKPOINT_DIR --prompt TEXT [--prompt TEXT ...] --max-new-tokens N [--tp N]
  [--ep N] [--dtype D] [--temperature T --top-k K --top-p P --seed S] [--eager]``
- ``trnmodels compile CHECKPOINT_DIR [--tp N] [--ep N] [--cache-dir D] [--jobs J]``
- ``trnmodels info``

``--ep`` splits MoE experts over ranks; a run uses ``tp * ep`` local ranks.

Every command takes ``--json``. Errors a user can cause print one line naming the problem and exit 2.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from . import argtypes
from .errors import InputError, TrnModelsError
from .runtime_config import DTYPES

_token_ids = argtypes.int_list
_int_list = argtypes.int_list
_positive = argtypes.positive_int


def _reserve_output(out: Path) -> Path:
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


def cmd_logits(args: argparse.Namespace) -> dict:
    import torch
    from safetensors.torch import save_file

    from .runner.score import score_checkpoint

    out = Path(args.out)
    # The result goes to a temporary file beside the target, renamed over it only on success: a failed
    # or interrupted run leaves neither a partial file nor a damaged previous result.
    tmp = _reserve_output(out)
    try:
        logits = score_checkpoint(
            args.checkpoint_dir, args.token_ids, args.prefill_len, tp=args.tp, ep=args.ep, dtype=args.dtype
        )
        try:
            save_file({"logits": logits.to(torch.float32).contiguous()}, str(tmp))
            tmp.replace(out)
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


def _runner_config(args: argparse.Namespace):
    from .runner.generate import runner_config_for

    return runner_config_for(
        args.checkpoint_dir,
        max_num_seqs=args.max_num_seqs,
        max_model_len=args.max_model_len,
        block_size=args.block_size,
        num_batched_tokens_buckets=args.num_batched_tokens_buckets,
        num_seqs_buckets=args.num_seqs_buckets,
        context_len_buckets=args.context_len_buckets,
    )


def cmd_generate(args: argparse.Namespace) -> dict:
    from .runner.config import SamplingParams
    from .runner.generate import generate_texts

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
        runner=_runner_config(args),
        tp=args.tp,
        ep=args.ep,
        dtype=args.dtype,
        cache_dir=args.cache_dir,
        eager=args.eager,
    )
    return {"outputs": outputs, "compiled_graphs": stats["compiled_graphs"]}


def cmd_compile(args: argparse.Namespace) -> dict:
    from tqdm.auto import tqdm

    from .causal_lm import check_model_config
    from .compile import CompileTarget, compile_all
    from .runner.graphs import all_graph_specs

    target = CompileTarget(
        str(args.checkpoint_dir), _runner_config(args), tp=args.tp, dtype=args.dtype, ep=args.ep
    )
    # A mesh or config the model refuses fails here, not in every compile worker.
    check_model_config(args.checkpoint_dir, target.neuron_config())
    specs = all_graph_specs(target.runner)
    with tqdm(total=len(specs), desc="compiling graphs", unit="graph", disable=None) as bar:

        def done(result) -> None:
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
    elif command == "generate":
        for out in result["outputs"]:
            print(
                f"{out['prompt']!r} -> {out['text']!r}  ({len(out['token_ids'])} tokens, {out['finish_reason']})"
            )
    elif command == "compile":
        for g in result["graphs"]:
            print(f"  {g['name']:<20} {g['cache']:<5} {g['seconds']:8.2f} s")
        hits = sum(g["cache"] == "hit" for g in result["graphs"])
        print(f"{len(result['graphs'])} graphs, {hits} cache hits, cache at {result['cache_dir']}")
    elif command == "logits":
        print(
            f"wrote logits {result['shape']} to {result['out']} "
            f"(prefill {result['prefill_len']}, decode steps {result['decode_steps']}, "
            f"tp {result['tp']}, ep {result['ep']}, {result['dtype']})"
        )


def _add_parallel_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tp", type=_positive, default=1, help="tensor-parallel degree (local gloo ranks)")
    parser.add_argument(
        "--ep", type=_positive, default=1, help="expert-parallel degree for MoE models; ranks = tp * ep"
    )


def _add_runtime_flags(parser: argparse.ArgumentParser) -> None:
    """Flags that shape the graphs: generate and compile must agree on them to share artifacts."""
    _add_parallel_flags(parser)
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    parser.add_argument("--max-num-seqs", type=_positive, default=8)
    parser.add_argument(
        "--max-model-len", type=_positive, default=None, help="default: the model's, capped at 512"
    )
    parser.add_argument("--block-size", type=_positive, default=32)
    for name in ("num-batched-tokens", "num-seqs", "context-len"):
        parser.add_argument(
            f"--{name}-buckets",
            type=_int_list,
            default=None,
            help="comma-separated, ascending (default: powers of two)",
        )
    parser.add_argument(
        "--cache-dir", default=None, help="compiled artifacts (default: $TRNMODELS_CACHE_DIR or ~/.cache)"
    )
    parser.add_argument("--json", action="store_true", help="machine-readable output")


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
    _add_parallel_flags(logits)
    logits.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    logits.add_argument("--out", required=True, help="output .safetensors file (tensor 'logits', [T, vocab])")
    logits.add_argument("--json", action="store_true", help="machine-readable output")
    logits.set_defaults(run=cmd_logits)

    generate = sub.add_parser(
        "generate", help="generate text through the runner (compiled graphs when cached)"
    )
    generate.add_argument("checkpoint_dir", type=Path)
    generate.add_argument("--prompt", action="append", required=True, help="a prompt; repeat for a batch")
    generate.add_argument("--max-new-tokens", type=_positive, required=True)
    generate.add_argument(
        "--temperature", type=argtypes.finite_float(0), default=0.0, help=">= 0; 0 is greedy (default)"
    )
    generate.add_argument("--top-k", type=argtypes.nonnegative_int, default=0, help="0 keeps every token")
    generate.add_argument(
        "--top-p", type=argtypes.finite_float(0, 1, low_open=True), default=1.0, help="in (0, 1]"
    )
    generate.add_argument(
        "--seed", type=argtypes.seed, default=None, help="in [0, 2**64 - 1] (default: a random seed)"
    )
    generate.add_argument("--ignore-eos", action="store_true", help="always generate --max-new-tokens")
    generate.add_argument("--eager", action="store_true", help="skip compiled artifacts")
    _add_runtime_flags(generate)
    generate.set_defaults(run=cmd_generate)

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
    compile_.add_argument("--jobs", type=_positive, default=1, help="graphs compiled in parallel processes")
    _add_runtime_flags(compile_)
    compile_.set_defaults(run=cmd_compile)

    from .diffusion.video_cli import add_video_parser  # `trnmodels video` (prints its own human output)

    add_video_parser(sub)

    from .real_weights_cli import add_real_weights_parser  # `trnmodels real-weights`

    add_real_weights_parser(sub)

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
        getattr(args, "print_human", lambda r: _print_human(args.command, r))(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
