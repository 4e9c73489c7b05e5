"""Flags shared by the LLM subcommands (``logits``, ``generate``, ``compile``) and the runner config
they describe."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from ..argtypes import int_list, positive_int
from ..runtime_config import DTYPES

if TYPE_CHECKING:
    from ..runner.config import RunnerConfig


def add_parallel_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--tp", type=positive_int, default=1, help="tensor-parallel degree (local gloo ranks)"
    )
    parser.add_argument(
        "--ep", type=positive_int, default=1, help="expert-parallel degree for MoE models; ranks = tp * ep"
    )


def add_runtime_flags(parser: argparse.ArgumentParser) -> None:
    """Flags that shape the graphs: generate and compile must agree on them to share artifacts."""
    add_parallel_flags(parser)
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    parser.add_argument("--max-num-seqs", type=positive_int, default=8)
    parser.add_argument(
        "--max-model-len", type=positive_int, default=None, help="default: the model's, capped at 512"
    )
    parser.add_argument("--block-size", type=positive_int, default=32)
    for name in ("num-batched-tokens", "num-seqs", "context-len"):
        parser.add_argument(
            f"--{name}-buckets",
            type=int_list,
            default=None,
            help="comma-separated, ascending (default: powers of two)",
        )
    parser.add_argument(
        "--cache-dir", default=None, help="compiled artifacts (default: $TRNMODELS_CACHE_DIR or ~/.cache)"
    )
    parser.add_argument("--json", action="store_true", help="machine-readable output")


def runner_config(args: argparse.Namespace) -> RunnerConfig:
    """The runner config the runtime flags describe, for the checkpoint in ``args``."""
    from ..runner.generate import runner_config_for

    return runner_config_for(
        args.checkpoint_dir,
        max_num_seqs=args.max_num_seqs,
        max_model_len=args.max_model_len,
        block_size=args.block_size,
        num_batched_tokens_buckets=args.num_batched_tokens_buckets,
        num_seqs_buckets=args.num_seqs_buckets,
        context_len_buckets=args.context_len_buckets,
    )
