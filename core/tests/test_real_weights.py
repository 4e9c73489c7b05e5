"""``trnmodels real-weights``: the checkpoint is built once, atomically, and bad input is one line.

The conversion itself (transformers dequantizing SmolLM2's GGUF) is exercised by the llama3 plugin's
real-weights tests; here ``_load_dequantized`` is swapped for a tiny model so every path runs in seconds.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import transformers

from trnmodels.core import cli, real_weights
from trnmodels.core.errors import CheckpointError, ConfigError
from trnmodels.core.testing import train_tokenizer

NAME = real_weights.DEFAULT_SOURCE


@pytest.fixture
def fake_gguf(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A stand-in GGUF file and a tiny 'dequantized' model behind it; returns the file."""
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF" + b"\0" * 64)
    monkeypatch.setattr(real_weights, "gguf_path", lambda src: gguf)
    monkeypatch.setattr(real_weights.metadata, "version", lambda dist: "0.1.2")

    def load(path: Path):
        torch.manual_seed(0)
        config = transformers.LlamaConfig(
            vocab_size=320, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
            num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True,
            bos_token_id=0, eos_token_id=1, pad_token_id=2,
        )  # fmt: skip
        return transformers.LlamaForCausalLM(config).eval(), train_tokenizer(vocab_size=320)

    monkeypatch.setattr(real_weights, "_load_dequantized", load)
    return gguf


def test_builds_once_then_reuses(fake_gguf: Path, tmp_path: Path):
    out = tmp_path / "ckpt"
    path, built = real_weights.real_checkpoint(NAME, out)
    assert (path, built) == (out, True)
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and "quantization_config" not in config
    record = json.loads((out / real_weights.SOURCE_RECORD).read_text())
    assert record["gguf_sha256"] == real_weights.sha256_file(fake_gguf)
    # A tied head is the embedding: written once, as save_pretrained does.
    from safetensors import safe_open

    with safe_open(out / "model.safetensors", "pt") as f:
        assert "lm_head.weight" not in f.keys() and "model.embed_tokens.weight" in f.keys()
    assert real_weights.real_checkpoint(NAME, out) == (out, False)
    # A changed source file is a new model: rebuilt.
    fake_gguf.write_bytes(b"GGUF" + b"\1" * 64)
    assert real_weights.real_checkpoint(NAME, out) == (out, True)


def test_loads_in_transformers(fake_gguf: Path, tmp_path: Path):
    out, _ = real_weights.real_checkpoint(NAME, tmp_path / "ckpt")
    model = transformers.AutoModelForCausalLM.from_pretrained(out)
    assert model.config.tie_word_embeddings and model.lm_head.weight is model.model.embed_tokens.weight


def test_full_disk_keeps_the_existing_checkpoint(fake_gguf: Path, tmp_path: Path, monkeypatch):
    out, _ = real_weights.real_checkpoint(NAME, tmp_path / "ckpt")
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    usage = real_weights.shutil.disk_usage(tmp_path)
    monkeypatch.setattr(real_weights.shutil, "disk_usage", lambda p: usage._replace(free=1000))
    with pytest.raises(CheckpointError, match=r"not enough free disk in .*needs \d+ MB, 0 MB are free"):
        real_weights.real_checkpoint(NAME, out, rebuild=True)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([".ckpt.lock", "ckpt", "model.gguf"])


def test_corrupt_gguf_is_one_error(tmp_path: Path):
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"not a gguf at all")
    with pytest.raises(CheckpointError, match=r"broken\.gguf: not a GGUF file \(starts with b'not '"):
        real_weights._load_dequantized(bad)
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(b"GGUF\x03\x00")
    with pytest.raises(CheckpointError, match=r"truncated\.gguf: damaged or unreadable GGUF file"):
        real_weights._load_dequantized(truncated)


def test_missing_package_names_the_install(monkeypatch):
    src = real_weights.GGUFSource("Nothing", "no-such-dist", "no_such_package_xyz", "x.gguf", "none")
    with pytest.raises(ConfigError, match=r"package no-such-dist is not installed; install it with uv sync"):
        real_weights.gguf_path(src)


def test_a_foreign_folder_is_never_overwritten(fake_gguf: Path, tmp_path: Path):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    with pytest.raises(ConfigError, match="is not a checkpoint this command built"):
        real_weights.real_checkpoint(NAME, out)
    assert (out / "notes.txt").read_text() == "keep me"


def test_cli_out_is_a_file(fake_gguf: Path, tmp_path: Path, capsys):
    target = tmp_path / "a-file"
    target.write_text("x")
    assert cli.main(["real-weights", "--out", str(target)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"trnmodels real-weights: error: --out: {target} exists and is not a directory"]
