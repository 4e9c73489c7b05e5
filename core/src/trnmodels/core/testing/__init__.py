"""Tiny local checkpoints for tests, demos and benchmarks: no Hub, everything built on this machine."""

from .checkpoints import (
    SAMPLE_TEXTS,
    quantize_checkpoint_mxfp4,
    save_checkpoint,
    save_random_checkpoint,
    train_tokenizer,
)
from .cli import run_cli

__all__ = [
    "SAMPLE_TEXTS",
    "quantize_checkpoint_mxfp4",
    "run_cli",
    "save_checkpoint",
    "save_random_checkpoint",
    "train_tokenizer",
]
