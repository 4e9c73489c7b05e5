"""Reading ``config.json`` strictly, old- and new-style RoPE configs, and the runtime ``NeuronConfig``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from trnmodels.core.errors import ConfigError
from trnmodels.core.hf_config import load_hf_config, read_config_dict
from trnmodels.core.ops import RopeConfig, inv_freq
from trnmodels.core.runtime_config import NeuronConfig, parse_dtype

LLAMA_BASE = {
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "vocab_size": 100,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-5,
    "max_position_embeddings": 131072,
}
LLAMA3_SCALING = {
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}


def _write(d: Path, text: str) -> Path:
    (d / "config.json").write_text(text)
    return d


def _write_json(d: Path, data: object) -> Path:
    return _write(d, json.dumps(data, indent=2))


# --- read_config_dict / load_hf_config errors --------------------------------------------------------


def test_missing_config_json(tmp_path: Path):
    with pytest.raises(ConfigError, match=r"config\.json: no config\.json in checkpoint directory") as e:
        read_config_dict(tmp_path)
    assert str(tmp_path) in str(e.value)
    with pytest.raises(ConfigError, match=r"no config\.json"):
        load_hf_config(tmp_path)


def test_malformed_json_names_line_and_column(tmp_path: Path):
    _write(tmp_path, '{\n  "model_type": "llama",\n  "hidden_size": ,\n}')
    with pytest.raises(ConfigError, match=r"malformed JSON at line 3, column 18: Expecting value") as e:
        read_config_dict(tmp_path)
    assert str(tmp_path / "config.json") in str(e.value)


def test_non_utf8_config(tmp_path: Path):
    (tmp_path / "config.json").write_bytes(b'{"model_type": "\xff"}')
    with pytest.raises(ConfigError, match="not UTF-8"):
        read_config_dict(tmp_path)


@pytest.mark.parametrize(("text", "kind"), [("[1, 2]", "list"), ('"llama"', "str"), ("null", "NoneType")])
def test_non_object_json(tmp_path: Path, text: str, kind: str):
    _write(tmp_path, text)
    with pytest.raises(ConfigError, match=f"expected a JSON object, got {kind}"):
        read_config_dict(tmp_path)


def test_read_config_dict_returns_the_dict(tmp_path: Path):
    _write_json(tmp_path, LLAMA_BASE)
    assert read_config_dict(tmp_path) == LLAMA_BASE


def test_required_fields_missing_are_listed(tmp_path: Path):
    data = {k: v for k, v in LLAMA_BASE.items() if k not in ("hidden_size", "rms_norm_eps")}
    _write_json(tmp_path, data)
    required = ("vocab_size", "hidden_size", "num_attention_heads", "rms_norm_eps")
    with pytest.raises(ConfigError, match=r"missing required field\(s\): hidden_size, rms_norm_eps$"):
        load_hf_config(tmp_path, required)
    # Without the requirement transformers would silently default it.
    assert load_hf_config(tmp_path).hidden_size != LLAMA_BASE["hidden_size"]


def test_missing_model_type(tmp_path: Path):
    _write_json(tmp_path, {k: v for k, v in LLAMA_BASE.items() if k != "model_type"})
    with pytest.raises(ConfigError, match="missing required field 'model_type'"):
        load_hf_config(tmp_path)


def test_unknown_model_type(tmp_path: Path):
    _write_json(tmp_path, {**LLAMA_BASE, "model_type": "no-such-model-xyz"})
    with pytest.raises(ConfigError, match="transformers cannot build a config"):
        load_hf_config(tmp_path)


# --- old- and new-style RoPE ---------------------------------------------------------------------------


def test_old_and_new_style_llama3_rope_agree(tmp_path: Path):
    old_dir, new_dir = tmp_path / "old", tmp_path / "new"
    old_dir.mkdir()
    new_dir.mkdir()
    # Old style (Llama 3.1 checkpoints as published): top-level rope_theta, rope_scaling, torch_dtype.
    _write_json(
        old_dir,
        {
            **LLAMA_BASE,
            "rope_theta": 500000.0,
            "rope_scaling": {"rope_type": "llama3", **LLAMA3_SCALING},
            "torch_dtype": "bfloat16",
        },
    )
    # New style: everything in rope_parameters, dtype instead of torch_dtype.
    _write_json(
        new_dir,
        {
            **LLAMA_BASE,
            "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, **LLAMA3_SCALING},
            "dtype": "bfloat16",
        },
    )
    required = ("vocab_size", "hidden_size", "num_attention_heads", "rms_norm_eps")
    old, new = load_hf_config(old_dir, required), load_hf_config(new_dir, required)
    assert type(old).__name__ == type(new).__name__ == "LlamaConfig"
    assert old.dtype == new.dtype == torch.bfloat16

    head_dim = LLAMA_BASE["hidden_size"] // LLAMA_BASE["num_attention_heads"]
    rope_old, rope_new = RopeConfig.from_hf(old, head_dim), RopeConfig.from_hf(new, head_dim)
    assert rope_old == rope_new
    assert rope_old == RopeConfig(
        head_dim=16,
        theta=500000.0,
        rope_type="llama3",
        factor=8.0,
        low_freq_factor=1.0,
        high_freq_factor=4.0,
        original_max_position_embeddings=8192,
    )
    freqs_old, scale_old = inv_freq(rope_old)
    freqs_new, scale_new = inv_freq(rope_new)
    torch.testing.assert_close(freqs_old, freqs_new)
    assert scale_old == scale_new == 1.0


def test_old_style_plain_rope_theta(tmp_path: Path):
    _write_json(tmp_path, {**LLAMA_BASE, "rope_theta": 10000.0})
    rope = RopeConfig.from_hf(load_hf_config(tmp_path), 16)
    assert rope.rope_type == "default" and rope.theta == 10000.0 and rope.factor == 1.0


# --- NeuronConfig / parse_dtype --------------------------------------------------------------------------


def test_neuron_config_defaults_and_dtype_strings():
    cfg = NeuronConfig()
    assert cfg.tp_degree == 1 and cfg.dtype == torch.float32 and cfg.kernel_backend == "auto"
    assert NeuronConfig(dtype="bfloat16").dtype == torch.bfloat16
    assert NeuronConfig(tp_degree=2, dtype=torch.float16, kernel_backend="nki").dtype == torch.float16


@pytest.mark.parametrize(
    ("kwargs", "pattern"),
    [
        ({"tp_degree": 0}, r"tp_degree: expected a positive integer, got 0"),
        ({"tp_degree": -2}, r"tp_degree: expected a positive integer, got -2"),
        ({"block_size": 0}, r"block_size: expected a positive integer, got 0"),
        ({"dtype": "fp16"}, r"dtype: expected one of \['bfloat16', 'float16', 'float32'\], got 'fp16'"),
        ({"dtype": torch.int8}, r"dtype: expected one of .*got torch\.int8"),
        ({"kernel_backend": "cuda"}, r"kernel_backend: expected auto, torch or nki, got 'cuda'"),
    ],
)
def test_neuron_config_errors(kwargs, pattern):
    with pytest.raises(ConfigError, match=pattern):
        NeuronConfig(**kwargs)


def test_parse_dtype():
    assert parse_dtype("float32") is torch.float32
    assert parse_dtype("bfloat16") is torch.bfloat16
    assert parse_dtype("float16") is torch.float16
    assert parse_dtype(torch.bfloat16) is torch.bfloat16
    with pytest.raises(ConfigError, match="got 'bf16'"):
        parse_dtype("bf16")
    with pytest.raises(ConfigError, match=r"got torch\.float64"):
        parse_dtype(torch.float64)
    # A ConfigError is also a ValueError for callers that catch that.
    with pytest.raises(ValueError):
        parse_dtype("int4")


def test_wrongly_typed_field_is_a_config_error(tmp_path: Path):
    _write_json(tmp_path, {**LLAMA_BASE, "num_attention_heads": "four"})
    with pytest.raises(ConfigError, match="num_attention_heads") as e:
        load_hf_config(tmp_path)
    assert str(tmp_path / "config.json") in str(e.value)
