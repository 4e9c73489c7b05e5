"""Bad input gets an error that names the problem."""

from __future__ import annotations

import json

import pytest

from trnmodels.core.causal_lm import build_model
from trnmodels.core.errors import ConfigError, ShardingError
from trnmodels.core.runtime_config import NeuronConfig
from trnmodels.core.testing import run_cli
from trnmodels.gpt_oss.factory import validate

from .conftest import hf_config


def test_ep_degree_must_divide_the_experts():
    with pytest.raises(
        ShardingError, match=r"ep_degree=4 does not divide num_local_experts=6.*\[1, 2, 3, 6\]"
    ):
        validate(hf_config(num_local_experts=6), NeuronConfig(ep_degree=4))


def test_experts_per_token_larger_than_the_experts():
    with pytest.raises(ConfigError, match=r"num_experts_per_tok=5 must be between 1 and num_local_experts=4"):
        validate(hf_config(num_experts_per_tok=5), NeuronConfig())


def test_tp_must_divide_heads_and_intermediate():
    with pytest.raises(ShardingError, match=r"num_attention_heads=6 is not divisible by tp_degree=4"):
        validate(hf_config(num_attention_heads=6, num_key_value_heads=2), NeuronConfig(tp_degree=4))
    with pytest.raises(ShardingError, match=r"intermediate_size=66 is not divisible by tp_degree=4"):
        validate(hf_config(intermediate_size=66), NeuronConfig(tp_degree=4))


def test_layer_types_must_match_the_layer_count():
    config = hf_config()
    config.layer_types = ["sliding_attention"] * 3
    with pytest.raises(ConfigError, match=r"layer_types has 3 entries, expected num_hidden_layers=2"):
        validate(config, NeuronConfig())


@pytest.mark.parametrize("method", ["fp8", "awq"])
def test_unsupported_quantization_is_refused(method):
    config = hf_config()
    config.quantization_config = {"quant_method": method}
    with pytest.raises(ConfigError, match=f"quant_method='{method}' is not supported"):
        validate(config, NeuronConfig())


@pytest.mark.slow  # a fresh `trnmodels` process; core/tests/cli runs the --ep bad inputs in-process
def test_cli_reports_a_bad_ep_degree_in_one_line(make_checkpoint):
    ckpt, _ = make_checkpoint()
    done = run_cli(
        "logits", str(ckpt), "--token-ids", "1,2,3", "--ep", "3", "--out", str(ckpt / "x.safetensors")
    )
    assert done.returncode == 2
    assert "ep_degree=3 does not divide num_local_experts=4" in done.stderr
    assert "Traceback" not in done.stderr and not (ckpt / "x.safetensors").exists()


def test_missing_expert_tensor_names_the_key(make_checkpoint):
    from safetensors.torch import load_file, save_file

    ckpt, _ = make_checkpoint()
    tensors = load_file(ckpt / "model.safetensors")
    del tensors["model.layers.1.mlp.experts.down_proj_bias"]
    save_file(tensors, str(ckpt / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(Exception, match=r"model\.layers\.1\.mlp\.experts\.down_proj_bias"):
        build_model(ckpt, NeuronConfig(), progress=False)
    assert json.loads((ckpt / "config.json").read_text())["num_local_experts"] == 4
