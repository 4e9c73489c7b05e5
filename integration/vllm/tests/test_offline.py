"""``vllm.LLM`` serves our plugin's model, and with the plugin disabled, vLLM's own: both equal transformers'
greedy ``generate`` token for token."""

from __future__ import annotations

import pytest
import transformers
from vllm_harness import BRIDGE, CHATS, PLUGINS, PROMPTS, TinyCheckpoint, run_offline


def assert_matches_hf(tiny: TinyCheckpoint, result: dict) -> None:
    tokenizer = transformers.AutoTokenizer.from_pretrained(tiny.path)
    expected_prompts = [tokenizer(p)["input_ids"] for p in PROMPTS] + [
        tokenizer.apply_chat_template(c, add_generation_prompt=True, tokenize=True, return_dict=False)
        for c in CHATS
    ]
    outputs = result["completions"] + result["chats"]
    assert [o["prompt_token_ids"] for o in outputs] == expected_prompts
    for out in outputs:
        assert out["token_ids"] == tiny.hf_greedy(out["prompt_token_ids"]), out["prompt_token_ids"]


def test_plugin_serves_and_matches_transformers(tiny: TinyCheckpoint, offline):
    result = offline
    assert result["model"]["class"] == BRIDGE
    assert result["model"]["inner"] == tiny.case.plugin_model
    assert f"is served by plugin {tiny.plugin}" in result["log"]
    assert_matches_hf(tiny, result)


def test_plugin_under_vllm_compile_matches_transformers(tiny: TinyCheckpoint, tmp_path):
    """With vLLM's default flags the bridge is compiled (vLLM's torch.compile, traced once with a symbolic
    token count) and still equals transformers' greedy output, prompts of several lengths and chats alike."""
    result = run_offline(tiny.path, tmp_path, enforce_eager=False)
    assert result["model"]["class"] == BRIDGE
    assert result["model"]["compiled"], "vLLM ran the bridge without compiling it"
    assert_matches_hf(tiny, result)


def test_disabled_plugin_falls_back_to_vllm(tiny: TinyCheckpoint, tmp_path):
    if tiny.case.fallback_build is not None:  # vLLM's own class for tiny's architecture cannot load here
        tiny = TinyCheckpoint(tiny.plugin, tiny.case.fallback_build(tmp_path / "fallback"), tiny.case)
    result = run_offline(tiny.path, tmp_path, TRNMODELS_VLLM_DISABLE=tiny.plugin)
    assert result["model"]["class"] == tiny.case.vllm_class
    assert "is served by plugin" not in result["log"]
    assert_matches_hf(tiny, result)


@pytest.mark.parametrize("plugin", [name for name, case in PLUGINS.items() if case.fallback_build])
def test_plugin_serves_its_other_architecture(plugin: str, tmp_path):
    """The fallback checkpoint's architecture (Gemma 4: text-only Gemma4ForCausalLM) is the plugin's too."""
    case = PLUGINS[plugin]
    tiny = TinyCheckpoint(plugin, case.fallback_build(tmp_path / "fallback"), case)
    result = run_offline(tiny.path, tmp_path)
    assert result["model"]["class"] == BRIDGE
    assert result["model"]["inner"] == case.plugin_model
    assert_matches_hf(tiny, result)


def test_checkpoint_the_plugin_rejects_fails_startup_with_our_error(tmp_path):
    """An llama3 checkpoint with a quantization the plugin does not serve: vLLM's start-up fails with the
    plugin's own one-line reason, before any engine is built (nothing is served silently by vLLM's class)."""
    import json
    import shutil

    checkpoint = PLUGINS["llama3"].build(tmp_path / "tiny")
    rejected = tmp_path / "fp8"
    shutil.copytree(checkpoint, rejected)
    config = json.loads((rejected / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "fp8", "activation_scheme": "dynamic"}
    (rejected / "config.json").write_text(json.dumps(config))
    try:
        run_offline(rejected, tmp_path)
    except AssertionError as e:
        message = str(e)
    else:
        raise AssertionError("vLLM started on a checkpoint the plugin rejects")
    assert "quantization_config with quant_method='fp8' is not supported by trnmodels-llama3" in message
    assert "is served by plugin" not in message


def test_bridge_binds_the_configured_nki_adapters(tmp_path):
    """The bridge builds our model the way build_model does, after the NKI adapters TRNMODELS_NKI_ADAPTERS
    names (none bind without the Neuron SDK): a name that is no adapter fails vLLM's start-up with our error."""
    checkpoint = PLUGINS["llama3"].build(tmp_path / "tiny")
    try:
        run_offline(checkpoint, tmp_path, TRNMODELS_NKI_ADAPTERS="attention_tce")
    except AssertionError as e:
        message = str(e)
    else:
        raise AssertionError("vLLM built our model without reading TRNMODELS_NKI_ADAPTERS")
    assert "TRNMODELS_NKI_ADAPTERS: unknown NKI adapters ['attention_tce']" in message
