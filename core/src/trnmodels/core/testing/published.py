"""The published configs bundled with core (``trnmodels/core/published/``), shrunk in size only.

A test that loads a published config must keep every field a user's checkpoint carries; only the fields
that set sizes (widths, depths, counts, vocabulary, windows and the token ids that must fit the smaller
vocabulary) may change. ``shrink`` refuses anything else, so a test cannot quietly drop the field that a
plugin would refuse.

The logits check every LLM plugin runs on its published configs lives here too: a plugin's
``test_published_configs.py`` defines a ``case`` fixture (a ``LogitsCase`` per published config: the
checkpoint written with the shrunk published ``config.json`` verbatim, built by ``logits_case``) and
imports ``test_published_config_logits_match_hf``, which pytest then collects in that module: ``trnmodels
logits`` at TP=1, and TP=2 (slow), against the reference's FP32 logits to ``FP32_ATOL``.
"""

from __future__ import annotations

import copy
import json
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

from ..accuracy import hf_logits
from ..published import published_config

FP32_ATOL = 1e-4  # max abs error of teacher-forced FP32 logits against the reference

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


def write_config(config: Mapping[str, Any], folder: str | Path) -> Path:
    """Write ``config`` as ``folder/config.json`` (creating ``folder``) and return ``folder``."""
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(dict(config), indent=2))
    return out


def save_published(name: str, sizes: Mapping[str, Any], out_dir: str | Path) -> Path:
    """Write the shrunk published config as ``out_dir/config.json`` and return it."""
    return write_config(shrink(published_config(name), sizes), out_dir) / "config.json"


def as_hf_config(config: Mapping[str, Any], folder: str | Path) -> Any:
    """transformers' reading of ``config``, written as ``folder/config.json`` and read back as
    ``AutoConfig`` reads a user's checkpoint."""
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(write_config(config, folder))


@dataclass(frozen=True)
class LogitsCase:
    """A published config's checkpoint, the ids to run through it and the reference's logits of them."""

    name: str  # the published config, named in failure messages
    checkpoint: Path
    token_ids: list[int]
    prefill_len: int  # the rest of ``token_ids`` are decode steps
    expected: torch.Tensor  # the reference's FP32 logits, ``[len(token_ids), vocab]``


def logits_case(
    name: str,
    checkpoint: str | Path,
    config: Mapping[str, Any],
    load_reference: Callable[[Path], Any],
    choices: Sequence[int],
    length: int,
    prefill_len: int,
) -> LogitsCase:
    """The ``LogitsCase`` of the random weights saved to ``checkpoint`` under the published ``config``.

    ``config`` (the shrunk published one) is written verbatim over the ``config.json`` that saving the
    weights wrote, so both sides read the same files; ``length`` token ids are drawn from ``choices``,
    seeded by ``name`` (each published config its own sequence); and the reference, loaded from
    ``checkpoint`` by ``load_reference``, gives its logits of them."""
    ckpt = write_config(config, checkpoint)
    rng = random.Random(name)
    token_ids = [rng.choice(choices) for _ in range(length)]
    reference = load_reference(ckpt).eval()
    with torch.no_grad():
        expected = hf_logits(reference, token_ids)
    return LogitsCase(name, ckpt, token_ids, prefill_len, expected)


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


@pytest.mark.parametrize("tp", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_published_config_logits_match_hf(case: LogitsCase, tp: int, tmp_path: Path) -> None:
    """Imported by each LLM plugin's ``test_published_configs.py`` beside its ``case`` fixture."""
    out = tmp_path / "logits.safetensors"
    err = cli_logits_max_error(case.checkpoint, case.token_ids, case.prefill_len, tp, case.expected, out)
    assert err <= FP32_ATOL, f"{case.name} tp={tp}: max abs error {err:.3g}"
