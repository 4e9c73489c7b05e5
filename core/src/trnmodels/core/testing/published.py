"""The published configs bundled with core (``trnmodels/core/published/``), shrunk in size only.

A test that loads a published config must keep every field a user's checkpoint carries; only the fields
that set sizes (widths, depths, counts, vocabulary, windows and the token ids that must fit the smaller
vocabulary) may change. ``shrink`` refuses anything else, so a test cannot quietly drop the field that a
plugin would refuse.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

PUBLISHED_DIR = Path(__file__).resolve().parents[1] / "published"

# Fields that only set a size. Anything else must stay as published.
SIZE_FIELDS = frozenset(
    {
        # transformer LLMs
        "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
        "num_key_value_heads", "head_dim", "vocab_size", "max_position_embeddings", "sliding_window",
        "layer_types", "global_head_dim", "num_global_key_value_heads", "moe_intermediate_size",
        "num_experts", "top_k_experts", "num_local_experts", "num_experts_per_tok", "experts_per_token",
        "vocab_size_per_layer_input", "hidden_size_per_layer_input", "num_kv_shared_layers",
        "initial_context_length", "expert_intermediate_size",
        # token ids, which must fall inside the shrunk vocabulary
        "bos_token_id", "eos_token_id", "pad_token_id", "image_token_id", "audio_token_id",
        "video_token_id", "boi_token_id", "eoi_token_id", "boa_token_id", "eoa_token_id",
        "eoa_token_index",
        # diffusion components
        "num_layers", "ffn_dim", "attention_head_dim", "text_dim", "freq_dim", "rope_max_seq_len",
        "base_dim", "dim_mult", "num_res_blocks", "d_model", "d_ff", "d_kv", "num_heads",
    }
)  # fmt: skip


def published_names() -> list[str]:
    """The bundled checkpoints, e.g. ``Llama-3.1-8B`` (a component folder is ``name/component``)."""
    return sorted(str(p.parent.relative_to(PUBLISHED_DIR)) for p in PUBLISHED_DIR.rglob("config.json"))


def published_config(name: str) -> dict[str, Any]:
    """The ``config.json`` of a bundled published checkpoint (or ``name/component``), verbatim."""
    path = PUBLISHED_DIR / name / "config.json"
    if not path.is_file():
        raise KeyError(f"no published config {name!r}; bundled: {', '.join(published_names())}")
    return json.loads(path.read_text())


def _set(config: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, field = dotted.split(".")
    node = config
    for part in parents:
        node = node[part]
    if field not in SIZE_FIELDS:
        raise ValueError(f"{dotted}: not a size field; a published config may be shrunk in size only")
    old = node.get(field)
    if isinstance(value, list) and isinstance(old, list) and field == "layer_types":
        unknown = set(value) - set(old)
        if unknown:
            raise ValueError(f"{dotted}: {sorted(unknown)} are not layer types of the published config")
    node[field] = value


def shrink(config: Mapping[str, Any], sizes: Mapping[str, Any]) -> dict[str, Any]:
    """A deep copy of ``config`` with the size fields in ``sizes`` replaced (``"text_config.hidden_size"``
    addresses a nested field). Any other field raises, so everything else stays as published."""
    out = copy.deepcopy(dict(config))
    for dotted, value in sizes.items():
        _set(out, dotted, value)
    return out


def save_published(name: str, sizes: Mapping[str, Any], out_dir: str | Path) -> Path:
    """Write the shrunk published config as ``out_dir/config.json`` and return it."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "config.json"
    path.write_text(json.dumps(shrink(published_config(name), sizes), indent=2))
    return path


def cli_logits_max_error(
    checkpoint: str | Path, token_ids: list[int], prefill_len: int, tp: int, expected: Any, out: str | Path
) -> float:
    """Run ``trnmodels logits`` (prefill, then decode steps) at ``tp`` as a user would, and return the max
    abs error of its logits against ``expected`` (``[T, vocab]``, the reference's FP32 logits)."""
    from safetensors.torch import load_file

    from ..cli import main

    ids = ",".join(map(str, token_ids))
    argv = ["logits", str(checkpoint), "--token-ids", ids, "--prefill-len", str(prefill_len)]
    code = main([*argv, "--tp", str(tp), "--out", str(out)])
    assert code == 0, f"trnmodels logits exited {code}"
    logits = load_file(str(out))["logits"]
    assert logits.shape == expected.shape, f"logits {list(logits.shape)}, expected {list(expected.shape)}"
    return (logits - expected).abs().max().item()
