"""Drivers that run a model step by step over the paged KV cache."""
