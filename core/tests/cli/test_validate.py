"""``trnmodels validate`` (Stage 4): the three levels on a correct port, and the bisection naming the layer
and module of a bug injected into our model through the test-only ``model_hook``.

The checkpoint is the llama3 plugin's bundled tiny config with random weights, perturbed norm scales (so
that swapping two norms changes the numbers) and sharpened attention (so that positions matter), and a
tokenizer, so the defaults can run.
"""

from __future__ import annotations

import functools
import json
import shutil
from pathlib import Path

import pytest
import torch
import transformers

from trnmodels.core.accuracy import validate as validate_module
from trnmodels.core.accuracy.bisect import decoder_layers
from trnmodels.core.accuracy.validate import validate_checkpoint
from trnmodels.core.cli import main
from trnmodels.core.testing import save_checkpoint, train_tokenizer
from trnmodels.core.testing.conformance import perturb_norms

BUGGY_LAYER = 1
PROMPT = [0, 17, 42, 99, 5, 23]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from trnmodels.llama3 import PLUGIN

    config = transformers.AutoConfig.from_pretrained(PLUGIN.bundled_config_dir("tiny"))
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    perturb_norms(model)
    with torch.no_grad():
        for name, p in model.named_parameters():
            # Random init leaves attention almost uniform, where no rotation shows: sharpen it.
            if name.endswith(("q_proj.weight", "k_proj.weight")):
                p.mul_(10.0)
    return save_checkpoint(model, tmp_path_factory.mktemp("validate") / "ckpt", train_tokenizer())


def swap_norms(model: torch.nn.Module) -> None:
    """The two norms of one layer loaded into each other's place."""
    layer = decoder_layers(model, model.config.num_layers)[BUGGY_LAYER]
    with torch.no_grad():
        a, b = layer.input_layernorm.weight, layer.post_attention_layernorm.weight
        saved = a.clone()
        a.copy_(b)
        b.copy_(saved)


def wrong_rope_base(model: torch.nn.Module) -> None:
    """One layer's attention rotates by the angles of another RoPE base (every frequency halved)."""
    attn = decoder_layers(model, model.config.num_layers)[BUGGY_LAYER].self_attn
    forward = attn.forward

    def halved(x, cos, sin, *args, **kwargs):
        angle = torch.atan2(sin, cos) / 2
        return forward(x, torch.cos(angle), torch.sin(angle), *args, **kwargs)

    attn.forward = halved


def test_a_correct_port_passes_every_level_with_the_defaults(checkpoint: Path, capsys):
    assert main(["validate", str(checkpoint), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["passed"] and out["L2"]["passed"] and out["L3"]["passed"]
    assert out["L1"] is None and out["bisection"] is None
    # Both layers and the four sub-modules transformers names alike in each were compared.
    assert [e["layer"] for e in out["L3"]["layers"]] == [0, 1]
    assert {e["module"] for e in out["L3"]["modules"]} == {
        "input_layernorm",
        "self_attn",
        "post_attention_layernorm",
        "mlp",
    }
    assert out["L2"]["kv_cosine"] and out["L2"]["fp32"]["max_abs_error"] <= 1e-4
    assert "RESULT: PASS" in out["report"]


@pytest.mark.parametrize(
    ("bug", "module"),
    [(swap_norms, "input_layernorm"), (wrong_rope_base, "self_attn")],
    ids=["swapped-norms", "wrong-rope-base"],
)
def test_the_bisection_names_the_layer_and_module_of_an_injected_bug(checkpoint: Path, bug, module):
    report = validate_checkpoint(checkpoint, PROMPT, 8, bisect=True, model_hook=bug)
    assert not report.passed and not report.logits_passed and not report.modules.passed
    first, culprit = report.modules.first_layer, report.modules.culprit
    assert first is not None and first.layer == BUGGY_LAYER
    assert (culprit.layer, culprit.module) == (BUGGY_LAYER, module)
    # Everything before the bug holds; the numbers say by how much the culprit leaves its envelope.
    assert all(e.within for e in report.modules.layers[:BUGGY_LAYER])
    assert culprit.error > 10 * culprit.envelope
    text = report.format()
    assert f"first module outside: layer {BUGGY_LAYER} {module}: max abs error" in text
    assert "RESULT: FAIL" in text


def test_a_failing_validation_exits_1_and_prints_the_bisection(checkpoint: Path, capsys, monkeypatch):
    injected = functools.partial(validate_checkpoint, model_hook=swap_norms)
    monkeypatch.setattr(validate_module, "validate_checkpoint", injected)
    assert (
        main(["validate", str(checkpoint), "--token-ids", "0,17,42,99", "--new-tokens", "4", "--bisect"]) == 1
    )
    out = capsys.readouterr().out
    assert f"first layer outside: layer {BUGGY_LAYER}:" in out
    assert f"first module outside: layer {BUGGY_LAYER} input_layernorm" in out


def test_no_tokenizer_and_no_token_ids_is_one_line(checkpoint: Path, tmp_path: Path, capsys):
    bare = tmp_path / "bare"
    bare.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(checkpoint / name, bare / name)
    assert main(["validate", str(bare)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no usable tokenizer" in err and "--token-ids" in err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--ep", "2"], "ep_degree=2: expert parallelism needs a mixture-of-experts model"),
        (["--tp", "3"], "3"),
        (["--token-ids", "0,1", "--prefill-len", "3"], "--prefill-len: expected at most 2"),
        (["--token-ids", "0,100000"], "100000"),
    ],
)
def test_bad_input_is_one_line(checkpoint: Path, capsys, args, message):
    assert main(["validate", str(checkpoint), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err


@pytest.mark.parametrize(
    ("index", "message"),
    [
        ({"_class_name": "WanPipeline"}, "the checkpoint has no tokenizer"),
        ({"_class_name": "FluxPipeline"}, "'FluxPipeline' is served by no installed diffusion plugin"),
    ],
    ids=["wan-without-components", "no-plugin"],
)
def test_a_diffusers_pipeline_folder_is_checked_before_any_model_loads(
    tmp_path: Path, capsys, index, message
):
    """A pipeline folder is validated stage by stage (models/wan22/tests/test_validate.py); what it lacks
    is one line."""
    (tmp_path / "model_index.json").write_text(json.dumps(index))
    assert main(["validate", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err, err


def test_component_folders_without_a_model_index_are_named(tmp_path: Path, capsys):
    (tmp_path / "transformer").mkdir()
    (tmp_path / "transformer" / "config.json").write_text(
        json.dumps({"_class_name": "WanTransformer3DModel"})
    )
    assert main(["validate", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "(transformer) but no model_index.json" in err, err


def test_a_missing_folder_is_one_line(tmp_path: Path, capsys):
    assert main(["validate", str(tmp_path / "nowhere")]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
