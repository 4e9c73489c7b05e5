"""``trnmodels validate CHECKPOINT_DIR``: Stage 4 of onboarding, the three validation levels against the
transformers reference in one report (``accuracy.validate``), with the bisection when one fails."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ..argtypes import int_list, positive_int
from ..errors import ConfigError, InputError
from .flags import add_parallel_flags

DEFAULT_PROMPT = "The capital of France is"
# A pipeline's default prompt is a long one: its text-encoder stage is judged on the prompt's tokens, and a
# tiny test model's handful of tokens is too few values for the BF16 three-way's statistics.
DEFAULT_VIDEO_PROMPT = (
    "A red fox runs through fresh snow in a quiet pine forest at dawn, its breath visible in the cold air"
)
DEFAULT_NEW_TOKENS = 32
# A diffusion pipeline is validated on a small video: parity, not quality, is the question, and every
# stage runs four times (ours and the reference's, FP32 and BF16) on the CPU.
PIPELINE_DEFAULTS = {"num_frames": 5, "height": 32, "width": 32, "steps": 4, "max_sequence_length": 64}
PIPELINE_FLAGS = tuple(PIPELINE_DEFAULTS)
LLM_FLAGS = ("token_ids", "new_tokens", "prefill_len", "tasks", "limit")


def prompt_ids(args: argparse.Namespace) -> list[int]:
    """``--token-ids`` as given, or ``--prompt`` through the checkpoint's own tokenizer."""
    if args.token_ids is not None:
        return list(args.token_ids)
    from ..runner.generate import load_tokenizer

    try:
        tokenizer = load_tokenizer(args.checkpoint_dir)
    except ConfigError as e:
        raise InputError(f"{e} (give --token-ids instead of --prompt)") from None
    ids = tokenizer(args.prompt)["input_ids"]
    if not ids:
        raise InputError(f"--prompt: {args.prompt!r} encodes to no tokens")
    return ids


def cmd_validate(args: argparse.Namespace) -> dict[str, Any]:
    from ..accuracy.validate import validate_checkpoint
    from ..hf_config import CONFIG_NAME
    from ..omni.registry import refuse_pipeline_without_index

    checkpoint = Path(args.checkpoint_dir)
    if (checkpoint / "model_index.json").is_file() and not (checkpoint / CONFIG_NAME).is_file():
        return validate_pipeline_dir(args)
    refuse_pipeline_without_index(checkpoint)
    _refuse_flags(args, PIPELINE_FLAGS, "an LLM checkpoint")
    if args.prompt is None:
        args.prompt = DEFAULT_PROMPT
    if args.new_tokens is None:
        args.new_tokens = DEFAULT_NEW_TOKENS
    from ..causal_lm import check_model_config
    from ..runner.score import check_sequence_fits, check_token_ids
    from ..runtime_config import NeuronConfig

    # The config and the mesh first: a refusal costs no model load.
    hf_config = check_model_config(checkpoint, NeuronConfig(tp_degree=args.tp, ep_degree=args.ep))
    if args.tasks and args.ep > 1:
        raise InputError("--tasks: the L1 tasks run on tensor parallelism only; drop --ep or --tasks")
    ids = prompt_ids(args)
    if args.prefill_len is not None and args.prefill_len > len(ids):
        raise InputError(
            f"--prefill-len: expected at most {len(ids)} (the prompt's tokens), got {args.prefill_len}"
        )
    check_token_ids(ids, hf_config.get_text_config().vocab_size)
    try:
        check_sequence_fits(hf_config, len(ids) + args.new_tokens)
    except InputError as e:
        raise InputError(f"the prompt's {len(ids)} tokens and --new-tokens {args.new_tokens}: {e}") from None
    report = validate_checkpoint(
        checkpoint,
        ids,
        args.new_tokens,
        tp=args.tp,
        ep=args.ep,
        prefill_len=args.prefill_len,
        tasks=args.tasks,
        task_limit=args.limit,
        bisect=args.bisect,
    )
    result = report.to_dict()
    result["report"] = report.format()  # the human output, also in --json
    return result


def _refuse_flags(args: argparse.Namespace, names: tuple[str, ...], kind: str) -> None:
    given = [f"--{n.replace('_', '-')}" for n in names if getattr(args, n) not in (None, False)]
    if given:
        raise InputError(f"{', '.join(given)}: not an option for {kind} ({args.checkpoint_dir})")


def validate_pipeline_dir(args: argparse.Namespace) -> dict[str, Any]:
    """A diffusers pipeline folder: every stage of one generation against the diffusers reference."""
    from ..accuracy.pipeline_validate import ValidationRequest, validate_pipeline

    _refuse_flags(args, LLM_FLAGS, "a diffusion pipeline")
    if args.tp > 1 or args.ep > 1:
        raise InputError(
            "--tp/--ep: a diffusion pipeline is validated in this process at TP=1 (its TP, CP and CFG "
            "meshes are compared with one rank by the plugin's tests)"
        )
    values = {name: getattr(args, name) or default for name, default in PIPELINE_DEFAULTS.items()}
    prompt = DEFAULT_VIDEO_PROMPT if args.prompt is None else args.prompt
    report = validate_pipeline(args.checkpoint_dir, ValidationRequest(prompt=prompt, **values))
    result = report.to_dict()
    result["report"] = report.format()
    return result


def print_validate(result: dict[str, Any]) -> None:
    print(result["report"])


def exit_code(result: dict[str, Any]) -> int:
    return 0 if result["passed"] else 1


def add_validate_parser(sub: Any) -> None:
    """Register ``trnmodels validate`` on the CLI's subparsers."""
    validate = sub.add_parser(
        "validate",
        help="Stage 4: L3 modules, L2 logits (FP32, BF16 three-way, KV cache), L1 tasks against transformers",
        description="Validate a checkpoint a plugin serves against its transformers class: L3 (every decoder "
        "layer and its sub-modules inside HF BF16's own error, at TP=1), L2 (teacher-forced logits on HF's "
        "greedy continuation of the prompt: FP32 max abs error, BF16 three-way, KV-cache cosine), and L1 "
        "(lm-eval tasks, with --tasks). Exit 0 only if every level run passes; a failure prints the "
        "bisection naming the first layer and module that departs. On a diffusers pipeline folder "
        "(model_index.json): every stage of one generation (text encoder, each denoising step, VAE decode), "
        "teacher-forced against diffusers in FP32 and BF16, naming the first stage that drifts.",
    )
    validate.add_argument("checkpoint_dir", type=Path)
    validate.add_argument(
        "--prompt",
        default=None,
        help=f"encoded by the checkpoint's tokenizer (default {DEFAULT_PROMPT!r}; for a pipeline, a "
        "one-sentence scene description)",
    )
    validate.add_argument("--token-ids", type=int_list, default=None, help="the prompt as ids, e.g. 1,2,3")
    validate.add_argument(
        "--new-tokens",
        type=positive_int,
        default=None,
        help=f"HF greedy tokens fed to both models (default {DEFAULT_NEW_TOKENS})",
    )
    validate.add_argument(
        "--prefill-len", type=positive_int, default=None, help="ids run as one prefill (default: the prompt)"
    )
    add_parallel_flags(validate)
    validate.add_argument(
        "--bisect",
        action="store_true",
        help="bisect: hidden states after every layer, then within the first layer that departs, name the "
        "first module outside HF BF16's error",
    )
    validate.add_argument(
        "--tasks", action="store_true", help="also run L1, the shipped lm-eval tasks (minutes)"
    )
    validate.add_argument("--limit", type=positive_int, default=None, help="L1 documents per task")
    pipeline = validate.add_argument_group(
        "diffusion pipelines (a folder with model_index.json): every stage of one generation, teacher-forced "
        "against diffusers"
    )
    for name, default in PIPELINE_DEFAULTS.items():
        flag = "--" + name.replace("_", "-")
        pipeline.add_argument(flag, type=positive_int, default=None, metavar="N", help=f"default {default}")
    validate.add_argument("--json", action="store_true", help="machine-readable output (one JSON object)")
    validate.set_defaults(run=cmd_validate, print_human=print_validate, exit_code=exit_code)
