"""Tiny local checkpoints for tests, demos and benchmarks: no Hub, everything built on this machine."""

from .checkpoints import SAMPLE_TEXTS, save_checkpoint, save_random_checkpoint, train_tokenizer
from .cli import run_cli

__all__ = ["SAMPLE_TEXTS", "run_cli", "save_checkpoint", "save_random_checkpoint", "train_tokenizer"]
