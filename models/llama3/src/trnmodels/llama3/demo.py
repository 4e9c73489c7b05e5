"""The main job on an embedded default: build a tiny random Llama 3 checkpoint, load it through the
plugin, and print its validation report against transformers.

    python -m trnmodels.llama3.demo [--tp 2] [--out DIR] [--prompt TEXT] [--new-tokens N]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch
import transformers

from trnmodels.core.accuracy import validate_checkpoint
from trnmodels.core.testing import save_checkpoint, train_tokenizer

# A Llama 3.1-shaped config at toy scale: GQA, llama3 rope scaling, an explicit head_dim, untied head.
DEMO_CONFIG = dict(
    hidden_size=64,
    intermediate_size=160,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=512,
    rms_norm_eps=1e-5,
    rope_parameters={
        "rope_type": "llama3",
        "rope_theta": 500000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64,
    },
    tie_word_embeddings=False,
)


def build_demo_checkpoint(out_dir: Path, seed: int = 0) -> transformers.PreTrainedTokenizerFast:
    tokenizer = train_tokenizer()
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **DEMO_CONFIG,
    )
    save_checkpoint(transformers.LlamaForCausalLM(config), out_dir, tokenizer)
    return tokenizer


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tp", type=int, default=1, help="tensor-parallel degree (local gloo ranks)")
    parser.add_argument("--out", type=Path, help="keep the checkpoint here (default: a temporary directory)")
    parser.add_argument("--prompt", default="Hello, my name is")
    parser.add_argument("--new-tokens", type=int, default=12, help="teacher-forced decode steps")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="trnmodels-demo-") as tmp:
        checkpoint = args.out or Path(tmp) / "tiny-llama3"
        tokenizer = build_demo_checkpoint(checkpoint)
        prompt_ids = tokenizer(args.prompt)["input_ids"]
        print(f"tiny Llama 3 checkpoint: {checkpoint}")
        print(f"prompt: {args.prompt!r} -> {len(prompt_ids)} tokens\n")
        report = validate_checkpoint(checkpoint, prompt_ids, args.new_tokens, tp=args.tp)
        continuation = tokenizer.decode(report.token_ids[len(prompt_ids) :])
        print(report.format())
        print(f"\ngreedy continuation (random weights, so noise): {continuation!r}")
    return 0 if report.passed else 1


if __name__ == "__main__":
    sys.exit(main())
