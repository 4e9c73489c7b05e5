"""Bad input gets an error that names the problem."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from trnmodels.core.causal_lm import build_model
from trnmodels.core.errors import CheckpointError, ConfigError, ShardingError
from trnmodels.core.runtime_config import NeuronConfig
from trnmodels.gemma4.factory import validate

from .conftest import DENSE_K_EQ_V, FULL, MOE, SLIDING, hf_config

PREFIX = "model.language_model."


def edit_text_config(ckpt, **changes):
    path = ckpt / "config.json"
    data = json.loads(path.read_text())
    data["text_config"].update(changes)
    path.write_text(json.dumps(data))


def edit_weights(ckpt, drop=(), add=None):
    path = ckpt / "model.safetensors"
    tensors = load_file(path)
    for key in drop:
        del tensors[key]
    tensors.update(add or {})
    save_file(tensors, path, metadata={"format": "pt"})


def test_layer_types_length_differs_from_layer_count(make_checkpoint):
    ckpt, _ = make_checkpoint(**DENSE_K_EQ_V)
    edit_text_config(ckpt, layer_types=[SLIDING, FULL, FULL])
    with pytest.raises(ConfigError, match=r"num_hidden_layers.*\(4\).*layer_types.*\(3\)"):
        build_model(ckpt, NeuronConfig())


def test_unknown_layer_type(make_checkpoint):
    ckpt, _ = make_checkpoint()
    edit_text_config(ckpt, layer_types=[SLIDING, "chunked_attention", SLIDING, FULL])
    with pytest.raises(ConfigError, match=r"text_config\.layer_types.*'chunked_attention'"):
        build_model(ckpt, NeuronConfig())


def test_checkpoint_missing_a_full_attention_k_projection(make_checkpoint):
    """With k_eq_v the full layer's K projection is also its V: losing it must fail, naming the key."""
    ckpt, _ = make_checkpoint(**DENSE_K_EQ_V)
    key = f"{PREFIX}layers.1.self_attn.k_proj.weight"
    edit_weights(ckpt, drop=[key])
    with pytest.raises(CheckpointError, match=rf"missing keys: .*{key}"):
        build_model(ckpt, NeuronConfig())


def test_tower_keys_are_skipped_but_an_unknown_tower_key_fails(make_checkpoint):
    ckpt, _ = make_checkpoint(**DENSE_K_EQ_V)
    keys = load_file(ckpt / "model.safetensors").keys()
    assert any(k.startswith("model.vision_tower.") for k in keys)
    assert any(k.startswith("model.audio_tower.") for k in keys)
    build_model(ckpt, NeuronConfig(), progress=False)  # towers present: recognised and skipped

    edit_weights(ckpt, add={"model.video_tower.proj.weight": torch.zeros(2, 2)})
    with pytest.raises(CheckpointError, match=r"unexpected keys: .*model\.video_tower\.proj\.weight"):
        build_model(ckpt, NeuronConfig())


def test_kv_sharing_without_a_source_layer(make_checkpoint):
    ckpt, _ = make_checkpoint()
    # Layers 1..3 share; layer 1 is full attention and no earlier full layer exists to read from.
    edit_text_config(ckpt, num_kv_shared_layers=3)
    with pytest.raises(ConfigError, match=r"num_kv_shared_layers=3: layer 1 \(full_attention\)"):
        build_model(ckpt, NeuronConfig(), load=False)


def test_bidirectional_attention_is_refused(make_checkpoint):
    ckpt, _ = make_checkpoint()
    edit_text_config(ckpt, use_bidirectional_attention="all")
    with pytest.raises(ConfigError) as e:
        build_model(ckpt, NeuronConfig(), load=False)
    message = str(e.value)
    assert "text_config.use_bidirectional_attention='all' is not supported" in message, message
    assert "accepts null or 'vision'" in message, message


def test_vision_bidirectional_attention_is_accepted(make_checkpoint):
    """The published 26B-A4B and 31B-it set "vision": only image tokens attend both ways; text is causal."""
    ckpt, _ = make_checkpoint()
    edit_text_config(ckpt, use_bidirectional_attention="vision")
    build_model(ckpt, NeuronConfig(), load=False)


def test_expert_parallelism_must_divide_the_experts():
    with pytest.raises(ShardingError, match="ep_degree=3 does not divide num_local_experts=4"):
        validate(hf_config(**MOE), NeuronConfig(ep_degree=3))
    with pytest.raises(ConfigError, match="ep_degree=2: expert parallelism needs the MoE variant"):
        validate(hf_config(), NeuronConfig(ep_degree=2))


def test_tp_that_cannot_split_the_heads():
    with pytest.raises(ShardingError, match="num_attention_heads=4 is not divisible by tp_degree=3"):
        validate(hf_config(**DENSE_K_EQ_V), NeuronConfig(tp_degree=3))
