"""Tiny local checkpoints for tests, demos and benchmarks: no Hub, everything built on this machine."""

from .checkpoints import SAMPLE_TEXTS, save_checkpoint, save_random_checkpoint, train_tokenizer

__all__ = ["SAMPLE_TEXTS", "save_checkpoint", "save_random_checkpoint", "train_tokenizer"]
