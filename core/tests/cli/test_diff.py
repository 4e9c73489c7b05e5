"""``trnmodels diff A B`` (Step 0 of a port) on the bundled published configs, against hand-checked
expectations: the config differences, the checklist verdicts, which plugins accept B, the module trees."""

from __future__ import annotations

import json
import shutil
from functools import cache

import pytest

from trnmodels.core.cli import main
from trnmodels.core.onboarding.diff import CHECKLIST_ITEMS, architecture_diff
from trnmodels.core.published import PUBLISHED_DIR, published_names


@cache
def diff(a: str, b: str) -> dict:
    return architecture_diff(a, b)


def plugin(result: dict, name: str) -> dict:
    (entry,) = [p for p in result["plugins"] if p["plugin"] == name]
    return entry


def options(result: dict, item: str) -> list[str]:
    return [f["option"] for f in result["checklist"][item]["findings"] if f["verdict"] == "option"]


def test_the_bundled_configs_include_the_onboarding_references():
    names = published_names()
    for name in ("Llama-3.1-8B", "gpt-oss-20b", "Qwen3-8B", "Mistral-7B-v0.1", "Mixtral-8x7B-v0.1"):
        assert name in names
    readme = (PUBLISHED_DIR / "README.md").read_text()
    for name in names:  # each bundled config's source is noted
        assert name.split("/")[0] in readme, name


def test_llama_3_1_against_3_2_differs_in_sizes_and_tying_only():
    r = diff("Llama-3.1-8B", "Llama-3.2-1B")
    assert {"hidden_size", "tie_word_embeddings"} <= set(r["config"]["different"])
    assert r["config"]["different"]["tie_word_embeddings"] == {"a": False, "b": True}
    verdicts = {item: entry["verdict"] for item, entry in r["checklist"].items()}
    assert list(verdicts) == list(CHECKLIST_ITEMS)
    assert verdicts["attention"] == "same"
    assert verdicts["embedding"] == "option"
    assert all(v == "same" for item, v in verdicts.items() if item != "embedding")
    assert plugin(r, "llama3") == {"plugin": "llama3", "accepts": True, "reason": None}
    assert not plugin(r, "gpt_oss")["accepts"]
    assert r["modules"]["only_in_a"] == r["modules"]["only_in_b"] == []
    assert any("32 x LlamaDecoderLayer" in line for line in r["modules"]["a"]["tree"])
    assert any("16 x LlamaDecoderLayer" in line for line in r["modules"]["b"]["tree"])


def test_gpt_oss_needs_experts_and_sinks_which_core_has():
    r = diff("Llama-3.1-8B", "gpt-oss-20b")
    mlp = r["checklist"]["mlp_activation"]
    assert mlp["verdict"] == "option"
    moe = [f for f in mlp["findings"] if f["module"] == "trnmodels.core.modules.moe"]
    assert any("MoEExperts" in f["option"] for f in moe)
    assert "num_local_experts" in mlp["fields"]
    attention = r["checklist"]["attention"]
    assert attention["verdict"] == "option"
    assert "SelfAttention(sinks=True)" in options(r, "attention")
    assert r["checklist"]["heterogeneous_layers"]["verdict"] == "option"  # sliding and full layers
    llama3 = plugin(r, "llama3")
    assert not llama3["accepts"] and "GptOssForCausalLM" in llama3["reason"]
    assert "quantization_config" in llama3["reason"]  # validate_dense refuses the MXFP4 checkpoint
    assert plugin(r, "gpt_oss")["accepts"]
    assert "GptOssExperts" in r["modules"]["only_in_b"]


def test_qwen2_points_at_qkv_bias_without_o_bias():
    r = diff("Llama-3.1-8B", "Qwen2.5-7B-Instruct")
    attention = r["checklist"]["attention"]
    assert attention["verdict"] == "option"
    assert attention["b"]["qkv_bias"] is True and attention["b"]["o_bias"] is False
    assert "SelfAttention(qkv_bias=True, o_bias=False)" in options(r, "attention")
    # use_sliding_window is false: the window field is not a sliding window
    assert attention["b"]["sliding_window"] is None
    llama3 = plugin(r, "llama3")
    assert not llama3["accepts"] and "its config validation alone passes" in llama3["reason"]


def test_mistral_sliding_window():
    v01 = diff("Llama-3.1-8B", "Mistral-7B-v0.1")
    assert "SelfAttention(sliding_window=4096)" in options(v01, "attention")
    v03 = diff("Llama-3.1-8B", "Mistral-7B-Instruct-v0.3")  # sliding_window null: full attention
    assert v03["checklist"]["attention"]["verdict"] == "same"
    assert v03["checklist"]["attention"]["fields"]["sliding_window"] == {"a": None, "b": None}


def test_mixtral_experts_are_stored_per_expert():
    r = diff("Mistral-7B-Instruct-v0.3", "Mixtral-8x7B-v0.1")
    (moe,) = [f for f in r["checklist"]["mlp_activation"]["findings"] if "MoEExperts" in f.get("option", "")]
    assert "per_expert=True" in moe["what"]
    assert r["checklist"]["attention"]["verdict"] == "same"


def test_qwen3_needs_qk_norm():
    r = diff("Llama-3.1-8B", "Qwen3-8B")
    assert "SelfAttention(qk_norm=...)" in options(r, "attention")


def test_a_plugin_reading_a_field_another_model_lacks_says_which_field():
    # Gemma 4's multimodal config keeps its sizes in text_config; llama3's validation reads them at the top.
    llama3 = plugin(diff("Llama-3.1-8B", "gemma-4-31B-it"), "llama3")
    assert "the config has no field 'num_attention_heads', which it reads" in llama3["reason"]
    assert "AttributeError" not in llama3["reason"]


def test_a_non_finite_number_is_one_line_naming_the_field(tmp_path, capsys):
    config = json.loads((PUBLISHED_DIR / "Llama-3.1-8B" / "config.json").read_text())
    config["rms_norm_eps"] = float("nan")
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert main(["diff", "Llama-3.1-8B", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert (
        err
        == f"trnmodels diff: error: {tmp_path / 'config.json'}: rms_norm_eps: expected a finite number, got nan"
    )


def test_inputs_may_be_a_checkpoint_folder_or_a_config_json_path(tmp_path):
    folder = tmp_path / "ckpt"
    folder.mkdir()
    shutil.copy(PUBLISHED_DIR / "Llama-3.2-1B" / "config.json", folder / "config.json")
    file = tmp_path / "other.json"
    shutil.copy(PUBLISHED_DIR / "Llama-3.1-8B" / "config.json", file)
    r = architecture_diff(str(file), str(folder))
    assert r["config"]["different"]["tie_word_embeddings"] == {"a": False, "b": True}
    assert "(folder:" in r["config"]["b"] and "(file:" in r["config"]["a"]


def test_json_is_one_object_with_the_four_parts(capsys):
    assert main(["diff", "Llama-3.1-8B", "Llama-3.2-1B", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {"config", "checklist", "plugins", "modules"}
    assert out["checklist"]["attention"]["verdict"] == "same"


def test_human_output_names_each_part(capsys):
    assert main(["diff", "Llama-3.1-8B", "Qwen2.5-7B-Instruct"]) == 0
    out = capsys.readouterr().out
    for heading in ("config", "checklist", "plugins", "modules"):
        assert f"\n{heading}" in out
    assert "SelfAttention(qkv_bias=True, o_bias=False)" in out


def test_an_unknown_name_lists_the_bundled_names(capsys):
    assert main(["diff", "Llama-3.1-8B", "no-such-model"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1
    assert "no-such-model" in err and "Llama-3.2-1B" in err and "Mixtral-8x7B-v0.1" in err


@pytest.mark.parametrize("where", ["folder", "file"])
def test_an_unreadable_config_is_one_line(tmp_path, capsys, where):
    bad = tmp_path / "config.json"
    bad.write_text('{"model_type": "llama",')
    assert main(["diff", "Llama-3.1-8B", str(tmp_path if where == "folder" else bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "malformed JSON" in err and str(bad) in err
