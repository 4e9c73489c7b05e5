"""Bad input gets an error that names the problem, and nothing half-written is left behind."""

from __future__ import annotations

import json

import pytest
from safetensors.torch import load_file, save_file

from trnmodels.core.causal_lm import build_model
from trnmodels.core.errors import CheckpointError, ConfigError, InputError, ShardingError
from trnmodels.core.parallel import init_parallel_state
from trnmodels.core.runner.score import teacher_forced_logits
from trnmodels.core.runtime_config import NeuronConfig


def edit_config(ckpt, **changes):
    path = ckpt / "config.json"
    data = json.loads(path.read_text())
    for key, value in changes.items():
        if value is None:
            data.pop(key, None)
        else:
            data[key] = value
    path.write_text(json.dumps(data))


def test_malformed_config_json(make_checkpoint):
    ckpt, _ = make_checkpoint()
    (ckpt / "config.json").write_text('{"architectures": ["LlamaForCausalLM"], "hidden_size": 48,,}')
    with pytest.raises(ConfigError, match=r"config\.json: malformed JSON at line 1, column"):
        build_model(ckpt, NeuronConfig())


@pytest.mark.parametrize("field", ["hidden_size", "num_attention_heads", "vocab_size"])
def test_config_missing_required_field(make_checkpoint, field):
    ckpt, _ = make_checkpoint()
    edit_config(ckpt, **{field: None})
    with pytest.raises(ConfigError, match=f"missing required field.*{field}"):
        build_model(ckpt, NeuronConfig())


def test_config_missing_architectures(make_checkpoint):
    ckpt, _ = make_checkpoint()
    edit_config(ckpt, architectures=None)
    with pytest.raises(ConfigError, match="architectures"):
        build_model(ckpt, NeuronConfig())


def test_unknown_architecture_names_installed_plugins(make_checkpoint):
    ckpt, _ = make_checkpoint()
    edit_config(ckpt, architectures=["MysteryForCausalLM"])
    with pytest.raises(ConfigError, match=r"'MysteryForCausalLM'.*LlamaForCausalLM"):
        build_model(ckpt, NeuronConfig())


@pytest.mark.parametrize(
    "quant", [{"quant_method": "fp8", "activation_scheme": "dynamic"}, {"quant_method": "awq", "bits": 4}]
)
def test_unsupported_quantization_is_refused(make_checkpoint, quant):
    ckpt, _ = make_checkpoint()
    edit_config(ckpt, quantization_config=quant)
    with pytest.raises(ConfigError, match=f"quant_method='{quant['quant_method']}' is not supported"):
        build_model(ckpt, NeuronConfig(), load=False)


def test_tp_must_divide_attention_heads(make_checkpoint, monkeypatch):
    """6 heads cannot split over 4 ranks: the error names both numbers."""
    from trnmodels.llama3.factory import validate

    _, hf = make_checkpoint(num_attention_heads=6, num_key_value_heads=6, hidden_size=48)
    with pytest.raises(ShardingError, match=r"num_attention_heads=6 is not divisible by tp_degree=4"):
        validate(hf.config, NeuronConfig(tp_degree=4))


def test_tp_must_divide_kv_heads_when_not_replicated(make_checkpoint):
    from trnmodels.llama3.factory import validate

    _, hf = make_checkpoint(num_attention_heads=12, num_key_value_heads=3, hidden_size=48)
    with pytest.raises(ShardingError, match=r"num_key_value_heads=3 is not divisible by tp_degree=2"):
        validate(hf.config, NeuronConfig(tp_degree=2))
    with pytest.raises(ShardingError, match=r"tp_degree=4 exceeds num_key_value_heads=3"):
        validate(hf.config, NeuronConfig(tp_degree=4))


def test_tp_degree_must_match_parallel_state(make_checkpoint):
    ckpt, _ = make_checkpoint()
    init_parallel_state(1)
    with pytest.raises(
        ShardingError, match=r"tp_degree=2, ep_degree=1 but the parallel state is tp_degree=1"
    ):
        build_model(ckpt, NeuronConfig(tp_degree=2))


def test_checkpoint_missing_key(make_checkpoint):
    ckpt, _ = make_checkpoint()
    tensors = load_file(ckpt / "model.safetensors")
    del tensors["model.layers.1.mlp.up_proj.weight"]
    save_file(tensors, ckpt / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match=r"missing keys: model\.layers\.1\.mlp\.up_proj\.weight"):
        build_model(ckpt, NeuronConfig())


def test_checkpoint_unexpected_key(make_checkpoint):
    ckpt, _ = make_checkpoint()
    tensors = load_file(ckpt / "model.safetensors")
    tensors["model.layers.0.self_attn.extra_proj.weight"] = tensors["model.norm.weight"].clone()
    save_file(tensors, ckpt / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(
        CheckpointError, match=r"unexpected keys: model\.layers\.0\.self_attn\.extra_proj\.weight"
    ):
        build_model(ckpt, NeuronConfig())


def test_checkpoint_wrong_shape(make_checkpoint):
    ckpt, _ = make_checkpoint()
    tensors = load_file(ckpt / "model.safetensors")
    key = "model.layers.0.self_attn.o_proj.weight"
    tensors[key] = tensors[key][:, :40].contiguous()
    save_file(tensors, ckpt / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match=r"o_proj\.weight \[48, 40\].*expects shape \[48, 48\]"):
        build_model(ckpt, NeuronConfig())


def test_checkpoint_truncated_file(make_checkpoint):
    ckpt, _ = make_checkpoint()
    path = ckpt / "model.safetensors"
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(CheckpointError, match=r"model\.safetensors: not a readable safetensors file"):
        build_model(ckpt, NeuronConfig())


def test_sharded_checkpoint_loads(make_checkpoint):
    """A sharded index loads the same weights as a single file (and a missing shard is named)."""
    ckpt, hf = make_checkpoint(max_shard_size="20KB")
    assert (ckpt / "model.safetensors.index.json").is_file()
    model = build_model(ckpt, NeuronConfig(), progress=False)
    torch_sd = hf.state_dict()
    assert (model.layers[1].mlp.down_proj.weight == torch_sd["model.layers.1.mlp.down_proj.weight"]).all()
    shard = sorted(ckpt.glob("model-*.safetensors"))[-1]
    shard.unlink()
    with pytest.raises(CheckpointError, match=f"not present: {shard.name}"):
        build_model(ckpt, NeuronConfig())


def test_token_ids_out_of_range(make_checkpoint):
    ckpt, _ = make_checkpoint()
    model = build_model(ckpt, NeuronConfig(), progress=False)
    with pytest.raises(InputError, match=r"id 97 at position 2 is out of range for vocab size 97"):
        teacher_forced_logits(model, [1, 2, 97, 3])
    with pytest.raises(InputError, match=r"id -1 at position 0"):
        teacher_forced_logits(model, [-1])


# The CLI's bad inputs (token ids out of range, --out, --tp/--ep, NaN weights, ...) are the table in
# core/tests/cli/bad_inputs.py, run by core/tests/cli/test_cli_bad_inputs.py.


def test_model_type_must_match_the_architecture(make_checkpoint):
    ckpt, _ = make_checkpoint()
    edit_config(ckpt, model_type="gemma4")
    with pytest.raises(
        ConfigError, match=r"model_type 'gemma4' contradicts architectures\[0\] 'LlamaForCausalLM'"
    ):
        build_model(ckpt, NeuronConfig(), load=False)


def test_every_plugin_declares_the_model_type_of_each_architecture():
    from trnmodels.core.plugins import discover_plugins

    for plugin in discover_plugins().values():
        assert set(plugin.model_types) == set(plugin.architectures), plugin.name


def test_dense_llama_refuses_expert_parallelism(make_checkpoint):
    from trnmodels.llama3.factory import validate

    _, hf = make_checkpoint()
    with pytest.raises(ConfigError, match="ep_degree=2: expert parallelism needs a mixture-of-experts model"):
        validate(hf.config, NeuronConfig(tp_degree=2, ep_degree=2))


def test_a_mesh_the_model_refuses_is_refused_before_ranks_start(make_checkpoint, monkeypatch):
    import torch.multiprocessing

    from trnmodels.core.runner.config import RunnerConfig, SamplingParams
    from trnmodels.core.runner.generate import GenerateJob, generate_token_ids
    from trnmodels.core.runner.score import score_checkpoint

    monkeypatch.setattr(
        torch.multiprocessing, "start_processes", lambda *a, **k: pytest.fail("ranks started")
    )
    ckpt, _ = make_checkpoint()
    with pytest.raises(ShardingError, match="num_attention_heads=4 is not divisible by tp_degree=3"):
        score_checkpoint(ckpt, [1, 2, 3], tp=3)
    job = GenerateJob(str(ckpt), ((1, 2),), SamplingParams(max_new_tokens=2), RunnerConfig(max_model_len=64))
    with pytest.raises(ConfigError, match="ep_degree=2: expert parallelism needs a mixture-of-experts"):
        generate_token_ids(job, tp=1, ep=2)
