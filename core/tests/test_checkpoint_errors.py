"""Weights that do not fit the model ``build_model`` builds (a missing, unexpected or misshapen tensor, a
truncated file, a missing shard) are refused naming the key or file; and the model built from a
checkpoint refuses token ids outside the vocab its ``config.json`` declares.

The checkpoint is the llama3 plugin's bundled tiny config (fixture ``llama_checkpoint``); every size is
read from its ``config.json``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from trnmodels.core.causal_lm import build_model
from trnmodels.core.errors import CheckpointError, InputError
from trnmodels.core.runner.score import teacher_forced_logits
from trnmodels.core.runtime_config import NeuronConfig
from trnmodels.core.testing import save_checkpoint


def config(ckpt: Path) -> dict:
    return json.loads((ckpt / "config.json").read_text())


def edit_tensors(ckpt: Path, change) -> None:
    """Rewrite ``model.safetensors`` with ``change(tensors)`` applied to its dict of tensors."""
    path = ckpt / "model.safetensors"
    tensors = load_file(path)
    change(tensors)
    save_file(tensors, path, metadata={"format": "pt"})


def test_checkpoint_missing_key(llama_checkpoint):
    key = f"model.layers.{config(llama_checkpoint)['num_hidden_layers'] - 1}.mlp.up_proj.weight"
    edit_tensors(llama_checkpoint, lambda t: t.pop(key))
    with pytest.raises(CheckpointError, match=rf"missing keys: {re.escape(key)}"):
        build_model(llama_checkpoint, NeuronConfig())


def test_checkpoint_unexpected_key(llama_checkpoint):
    key = "model.layers.0.self_attn.extra_proj.weight"
    edit_tensors(llama_checkpoint, lambda t: t.update({key: t["model.norm.weight"].clone()}))
    with pytest.raises(CheckpointError, match=rf"unexpected keys: {re.escape(key)}"):
        build_model(llama_checkpoint, NeuronConfig())


def test_checkpoint_wrong_shape(llama_checkpoint):
    key = "model.layers.0.self_attn.o_proj.weight"
    rows, cols = load_file(llama_checkpoint / "model.safetensors")[key].shape
    edit_tensors(llama_checkpoint, lambda t: t.update({key: t[key][:, : cols // 2].contiguous()}))
    with pytest.raises(
        CheckpointError, match=rf"o_proj\.weight \[{rows}, {cols // 2}\].*expects shape \[{rows}, {cols}\]"
    ):
        build_model(llama_checkpoint, NeuronConfig())


def test_checkpoint_truncated_file(llama_checkpoint):
    path = llama_checkpoint / "model.safetensors"
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(CheckpointError, match=r"model\.safetensors: not a readable safetensors file"):
        build_model(llama_checkpoint, NeuronConfig())


def test_sharded_checkpoint_loads(llama_checkpoint, tmp_path):
    """A sharded index loads the same weights as a single file (and a missing shard is named)."""
    from transformers import AutoModelForCausalLM

    single = load_file(llama_checkpoint / "model.safetensors")
    total_bytes = sum(t.numel() * t.element_size() for t in single.values())
    hf = AutoModelForCausalLM.from_pretrained(llama_checkpoint, dtype=torch.float32)
    ckpt = save_checkpoint(hf, tmp_path / "sharded", max_shard_size=total_bytes // 4)
    assert (ckpt / "model.safetensors.index.json").is_file()
    assert len(list(ckpt.glob("model-*.safetensors"))) > 1
    model = build_model(ckpt, NeuronConfig(), progress=False)
    last = config(ckpt)["num_hidden_layers"] - 1
    expected = single[f"model.layers.{last}.mlp.down_proj.weight"]
    assert (model.layers[last].mlp.down_proj.weight == expected).all()
    shard = sorted(ckpt.glob("model-*.safetensors"))[-1]
    shard.unlink()
    with pytest.raises(CheckpointError, match=f"not present: {shard.name}"):
        build_model(ckpt, NeuronConfig())


def test_token_ids_out_of_range(llama_checkpoint):
    vocab = config(llama_checkpoint)["vocab_size"]
    model = build_model(llama_checkpoint, NeuronConfig(), progress=False)
    with pytest.raises(InputError, match=rf"id {vocab} at position 2 is out of range for vocab size {vocab}"):
        teacher_forced_logits(model, [1, 2, vocab, 3])
    with pytest.raises(InputError, match=r"id -1 at position 0"):
        teacher_forced_logits(model, [-1])
