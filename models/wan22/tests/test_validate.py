"""``trnmodels validate`` on a Wan2.2 pipeline: every stage of one generation against diffusers, and a bug
injected into one component is named as the first stage that drifts."""

from __future__ import annotations

import json

import pytest
import torch

from trnmodels.core.accuracy.pipeline_validate import ValidationRequest, validate_pipeline
from trnmodels.core.cli import main
from trnmodels.core.testing.bad_inputs import BadInput, check_one_line_error

REQUEST = ValidationRequest(
    prompt="two cats playing chess in an old library lit by candles, books stacked on every shelf",
    num_frames=5,
    height=32,
    width=32,
    steps=4,
    max_sequence_length=64,
)


def test_validate_passes_every_stage_with_the_defaults(tiny_t2v, capsys):
    assert main(["validate", str(tiny_t2v.path), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    names = [s["name"] for s in result["stages"]]
    assert names[0] == "text_encoder" and names[-1] == "vae decode"
    steps = [s for s in result["stages"] if s["name"].startswith("step ")]
    assert len(steps) == result["settings"]["steps"] == 4
    # Wan2.2's expert switch: the high-noise expert first, then the low-noise one (boundary 0.875 x 1000).
    assert [s["component"] for s in steps] == ["transformer", "transformer", "transformer_2", "transformer_2"]
    assert result["passed"] and result["first_drift"] is None
    for stage in result["stages"]:
        assert stage["fp32"]["max_abs_error"] < 1e-5, stage
    assert "PASS: every stage matches the reference" in result["report"]


def test_image_to_video_adds_the_vae_encode_of_its_condition(tiny_i2v):
    report = validate_pipeline(tiny_i2v.path, REQUEST)
    assert [s.name for s in report.stages][:2] == ["text_encoder", "vae encode"]
    assert report.passed, report.format()


def swap_norms_in_one_block(name: str, module: torch.nn.Module) -> None:
    """The known bug: the low-noise expert's second block reads its Q norm's weight for K and K's for Q."""
    if name == "transformer_2":
        attn = module.blocks[1].attn1
        with torch.no_grad():
            q, k = attn.norm_q.weight.clone(), attn.norm_k.weight.clone()
            attn.norm_q.weight.copy_(k)
            attn.norm_k.weight.copy_(q)


def shift_vae_output(name: str, module: torch.nn.Module) -> None:
    if name == "vae":
        with torch.no_grad():
            module.decoder.conv_out.bias.add_(0.05)


@pytest.mark.parametrize(
    ("bug", "component"),
    [(swap_norms_in_one_block, "transformer_2"), (shift_vae_output, "vae")],
    ids=["low-noise-expert-norms", "vae-bias"],
)
def test_an_injected_bug_is_named_as_the_first_stage_that_drifts(tiny_t2v, bug, component):
    report = validate_pipeline(tiny_t2v.path, REQUEST, component_hook=bug)
    drift = report.first_drift
    assert not report.passed and drift is not None
    assert drift.component == component and not drift.fp32_passed
    first = report.stages.index(drift)
    assert drift is next(s for s in report.stages if s.component == component)  # its first stage
    assert all(s.passed for s in report.stages[:first])  # every stage before it matches
    assert all(not s.passed for s in report.stages if s.component == component)
    assert all(s.passed for s in report.stages if s.component != component)  # teacher-forced: no carry-over
    assert f"the first stage that drifts is {drift.name} ({component})" in report.format()


BAD = [
    BadInput("validate", "--num-frames 6", "num_frames=6 is not of the form 4k+1"),
    BadInput("validate", "--height 40", "height=40 is not divisible by 16"),
    BadInput("validate", "--tp 2", "a diffusion pipeline is validated in this process at TP=1"),
    BadInput("validate", "--token-ids 1,2,3", "--token-ids: not an option for a diffusion pipeline"),
    BadInput("validate", "--new-tokens 4", "--new-tokens: not an option for a diffusion pipeline"),
]


@pytest.mark.parametrize("case", BAD, ids=[c.input for c in BAD])
def test_bad_input_is_one_line_exit_2(case, tiny_t2v, capsys):
    argv = ["validate", str(tiny_t2v.path), *case.input.split()]
    check_one_line_error(main(argv), capsys.readouterr().err, case)


def test_a_pipeline_flag_on_an_llm_checkpoint_is_refused(capsys):
    from trnmodels.core.plugins import discover_plugins

    tiny = discover_plugins()["llama3"].bundled_config_dir("tiny")
    case = BadInput("validate", "--steps 3", "--steps: not an option for an LLM checkpoint")
    check_one_line_error(main(["validate", str(tiny), "--steps", "3"]), capsys.readouterr().err, case)
