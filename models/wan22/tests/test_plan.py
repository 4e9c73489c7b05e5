"""``trnmodels plan`` on a Wan2.2 pipeline: every TP x CP x CFG mesh with each component's memory per core.

The weights the plan reports are checked two ways: against what the pipeline allocates when it is built
from a checkpoint on live ranks (TP=1 here, TP=2 on two gloo ranks), and, for the published A14B configs,
against diffusers' and transformers' own models built on the meta device (the independent reference for
the sizes: ``WanTransformer3DModel``, ``UMT5EncoderModel``, ``AutoencoderKLWan``).
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest
import torch
import transformers
from diffusers import AutoencoderKLWan, WanTransformer3DModel

from trnmodels.core.cli import main
from trnmodels.core.diffusion.memory import module_bytes
from trnmodels.core.onboarding.plan_diffusion import plan_diffusion
from trnmodels.core.parallel import ParallelLayout
from trnmodels.core.parallel.launch import run_on_ranks
from trnmodels.core.published import PUBLISHED_DIR
from trnmodels.core.testing.bad_inputs import BadInput, check_one_line_error
from trnmodels.wan22.compile import TINY

from .conftest import VIDEO, bf16_like_diffusers

A14B = PUBLISHED_DIR / "Wan2.2-T2V-A14B-Diffusers"
TINY_VIDEO = {k: VIDEO[k] for k in ("num_frames", "height", "width", "max_sequence_length")}
GIB = 1 << 30
HERE = Path(__file__).parent


def mesh(result: dict, tp: int, cp: int, cfg: int) -> dict:
    found = [m for m in result["meshes"] if (m["tp"], m["cp"], m["cfg"]) == (tp, cp, cfg)]
    assert found, f"TP {tp} x CP {cp} x CFG {cfg} not planned; refused: {result['refused']}"
    return found[0]


def weights(entry: dict) -> dict[str, int]:
    return {c["name"]: c["weight_bytes"] for c in entry["components"]}


def bf16_dit_bytes(dit: WanTransformer3DModel) -> int:
    """The bytes of diffusers' DiT loaded in BF16: its ``_keep_in_fp32_modules`` stay float32, buffers (the
    RoPE tables) included."""
    model = bf16_like_diffusers(dit)
    keep = set(model._keep_in_fp32_modules)
    for module_name, module in model.named_modules():
        if keep & set(module_name.split(".")):
            for name, buffer in module.named_buffers(recurse=False):
                module.register_buffer(name, buffer.float(), persistent=name in module.state_dict())
    return module_bytes(model)


# ---------------------------------------------------------------------- the bytes the pipeline allocates

LAYOUTS = [
    pytest.param(ParallelLayout(), id="tp1"),
    pytest.param(ParallelLayout(tp=2), id="tp2", marks=pytest.mark.slow),
    pytest.param(ParallelLayout(cfg=2), id="cfg2", marks=pytest.mark.slow),
]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_plan_weights_equal_what_the_pipeline_allocates(layout, tiny_t2v):
    result = plan_diffusion(tiny_t2v.path, "trn2.3xlarge", **TINY_VIDEO, dtype="float32")
    planned = weights(mesh(result, layout.tp, layout.cp, layout.cfg))
    mp = pytest.MonkeyPatch()
    mp.syspath_prepend(str(HERE))  # spawned ranks import the rank function by module name
    try:
        fns = importlib.import_module("_wan22_rank_fns")
        ranks = run_on_ranks(fns.pipeline_bytes, layout, str(tiny_t2v.path))
    finally:
        mp.undo()
    assert [r["rank"] for r in ranks] == list(range(layout.world_size))
    for measured in ranks:
        has_vae = measured["rank"] == 0  # the VAE rank
        assert {k: v for k, v in measured.items() if k != "rank"} == {
            name: size for name, size in planned.items() if name != "vae" or has_vae
        }, measured


def test_published_a14b_weights_equal_the_reference_models():
    """At TP=1 in BF16, the DiT and the text encoder hold what diffusers' and transformers' BF16 models
    hold (diffusers keeps its ``_keep_in_fp32_modules`` in float32, as ours does), and the VAE in FP32
    what diffusers' VAE holds; at TP=4 the sharded components hold about a quarter."""
    result = plan_diffusion(A14B, "trn2.48xlarge", dtype="bfloat16", vae_dtype="float32")
    with torch.device("meta"):
        dit = WanTransformer3DModel.from_config(json.loads((A14B / "transformer/config.json").read_text()))
        encoder_config = transformers.UMT5Config.from_dict(
            json.loads((A14B / "text_encoder/config.json").read_text())
        )
        encoder = transformers.UMT5EncoderModel(encoder_config)
        vae = AutoencoderKLWan.from_config(json.loads((A14B / "vae/config.json").read_text()))
    expected = {
        "text_encoder": module_bytes(encoder.to(torch.bfloat16)),
        "transformer": bf16_dit_bytes(dit),
        "transformer_2": bf16_dit_bytes(dit),
        "vae": module_bytes(vae),
    }
    tp1 = weights(mesh(result, 1, 1, 1))
    assert tp1 == expected
    assert 26 * GIB < tp1["transformer"] < 27 * GIB  # 14.3B parameters in BF16
    tp4 = weights(mesh(result, 4, 8, 2))
    for name in ("text_encoder", "transformer"):
        assert tp1[name] / 4 <= tp4[name] < tp1[name] / 4 * 1.02, name  # only norms and embeddings whole
    assert tp4["vae"] == tp1["vae"]  # the VAE is not sharded


def test_release_mesh_fits_with_the_release_vae_settings():
    """The seeds' release mesh (TP 4 x CP 8 x CFG 2 on trn2.48xlarge) is marked; it fits in a core's
    24 GiB with the release YAML's VAE tiling and patch parallelism 16, not with an untiled FP32 decode of
    the pipeline's default video (81 frames of 480x832)."""
    untiled = plan_diffusion(A14B, "trn2.48xlarge")
    assert untiled["release_mesh"] == {"tp": 4, "cp": 8, "cfg": 2}
    assert (untiled["settings"]["num_frames"], untiled["settings"]["height"]) == (81, 480)  # the defaults
    release = mesh(untiled, 4, 8, 2)
    assert release["release"] and not release["fits"]
    vae = next(c for c in release["components"] if c["name"] == "vae")
    assert vae["vae_ranks_only"] and vae["working_bytes"] == release["working_bytes_per_core"]
    assert release["other_ranks_total_bytes"] < release["hbm_bytes_per_core"]  # only the VAE ranks overflow

    tiled = plan_diffusion(A14B, "trn2.48xlarge", vae_tiling=True, vae_patch_parallel=16)
    release_tiled = mesh(tiled, 4, 8, 2)
    assert release_tiled["fits"]
    tiled_vae = next(c for c in release_tiled["components"] if c["name"] == "vae")
    video = 3 * 81 * 480 * 832 * 4  # every VAE rank holds the decoded FP32 video
    assert video < tiled_vae["working_bytes"] < vae["working_bytes"]
    # TP must divide the DiT's 40 heads; CP the video's 21 x 30 x 52 = 32760 latent tokens.
    reasons = {(r["tp"], r["cp"], r["cfg"]): r["reason"] for r in untiled["refused"]}
    assert "num_attention_heads=40 is not divisible by tp_degree=16" in reasons[16, 1, 1]
    assert "32760 latent tokens are not divisible by cp_degree=16" in reasons[1, 16, 1]
    assert {(m["tp"], m["cp"], m["cfg"]) for m in untiled["meshes"]} >= {(8, 8, 1), (4, 8, 2), (1, 1, 2)}


def test_weights_scale_with_the_dtype_and_working_with_context_parallelism():
    fp32 = plan_diffusion(A14B, "trn2.48xlarge", dtype="float32")
    bf16 = plan_diffusion(A14B, "trn2.48xlarge")
    full, half = weights(mesh(fp32, 4, 1, 1)), weights(mesh(bf16, 4, 1, 1))
    assert half["vae"] == full["vae"]  # the VAE's dtype is its own (--vae-dtype)
    assert 0.5 < half["transformer"] / full["transformer"] < 0.52  # only the float32-kept modules stay
    dit = [next(c for c in mesh(bf16, 4, cp, 1)["components"] if c["name"] == "transformer") for cp in (1, 8)]
    assert dit[1]["working_bytes"] < dit[0]["working_bytes"]


# --------------------------------------------------------------------------------------------- the CLI


def test_cli_prints_every_component_and_json(capsys):
    argv = [
        "plan",
        str(TINY),
        "--instance",
        "trn2.3xlarge",
        "--num-frames",
        "5",
        "--height",
        "32",
        "--width",
        "32",
    ]
    assert main(argv) == 0
    out = capsys.readouterr().out
    for word in ("text_encoder", "transformer_2", "vae", "fits", "on the VAE ranks"):
        assert word in out
    assert main([*argv, "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["kind"] == "diffusion" and result["plugin"] == "wan22"
    assert {(m["tp"], m["cfg"]) for m in result["meshes"]} >= {(1, 1), (2, 1), (1, 2), (2, 2)}


BAD = [
    BadInput("plan", "--max-model-len 64", "--max-model-len: not an option for a diffusion pipeline"),
    BadInput("plan", "--num-frames 6", "num_frames=6 is not of the form 4k+1"),
    BadInput("plan", "--height 36", "height=36 is not divisible by 16"),
    BadInput(
        "plan", "--vae-patch-parallel 8", "--vae-patch-parallel 8 exceeds the 4 NeuronCores of trn2.3xlarge"
    ),
    BadInput("plan", "LLM --vae-tiling", "--vae-tiling: not an option for an LLM"),
    BadInput("plan", "DIT_CONFIG", "is one component of a diffusers pipeline: plan the pipeline's folder"),
]


@pytest.mark.parametrize("case", BAD, ids=[c.input for c in BAD])
def test_bad_input_is_one_line_exit_2(case, capsys):
    words = case.input.split()
    source = {"LLM": "Llama-3.2-1B", "DIT_CONFIG": str(A14B / "transformer_2" / "config.json")}
    argv = ["plan", source.get(words[0], str(TINY)), "--instance", "trn2.3xlarge"]
    argv += [w for w in words if w not in source]
    check_one_line_error(main(argv), capsys.readouterr().err, case)
