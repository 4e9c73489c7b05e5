"""The tensor-parallel degree a benchmark runs a checkpoint at."""

from __future__ import annotations

from pathlib import Path


def tp_degree(checkpoint: str | Path) -> int:
    """2 if the attention heads split over two ranks, else the smallest degree up to 8 that splits them
    (KV heads split too, or are replicated: the degree a multiple of their count). SmolLM2-135M's 9 query
    and 3 KV heads give 3."""
    from trnmodels.core.hf_config import read_config_dict

    raw = read_config_dict(checkpoint)
    raw = raw.get("text_config", raw)
    heads = raw.get("num_attention_heads", 2)
    kv = raw.get("num_key_value_heads") or heads
    for tp in range(2, 9):
        if heads % tp == 0 and (kv % tp == 0 or tp % kv == 0):
            return tp
    return 2
