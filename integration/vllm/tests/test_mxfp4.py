"""gpt-oss as it is published (MXFP4 experts under the published ``quantization_config``) served through
the plugin: its tokens equal those of the same weights dequantized by transformers into a plain BF16
checkpoint. vLLM takes such a checkpoint in BF16 only: its own MXFP4 config refuses float32 before any
plugin loads."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from vllm_harness import BRIDGE, PLUGINS, build_gpt_oss, run_offline

from trnmodels.core.published import published_config
from trnmodels.core.testing.checkpoints import quantize_checkpoint_mxfp4

pytestmark = pytest.mark.skipif("gpt_oss" not in PLUGINS, reason="trnmodels-gpt_oss is not installed")

EXPERT_WEIGHTS = ("gate_up_proj", "down_proj")


def dequantized_by_transformers(mxfp4: Path, out: Path) -> Path:
    """``mxfp4`` with its experts decoded by transformers' own MXFP4 decoder, saved in BF16 without a
    ``quantization_config``: the weights the MXFP4 checkpoint stands for."""
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    shutil.copytree(mxfp4, out)
    tensors = load_file(out / "model.safetensors")
    plain = {}
    for key, value in tensors.items():
        if key.endswith("_blocks"):
            stem = key.removesuffix("_blocks")
            plain[stem] = convert_moe_packed_tensors(value, tensors[f"{stem}_scales"], dtype=torch.bfloat16)
        elif not key.endswith("_scales"):
            plain[key] = value
    save_file(
        {k: v.contiguous() for k, v in plain.items()}, out / "model.safetensors", metadata={"format": "pt"}
    )
    config = json.loads((out / "config.json").read_text())
    del config["quantization_config"]
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return out


def test_published_mxfp4_checkpoint_serves_as_its_bf16_dequantization(tmp_path):
    # Writes gpt-oss-20b's quantization_config as published: the method and its modules_to_not_convert.
    quantization = published_config("gpt-oss-20b")["quantization_config"]
    mxfp4 = quantize_checkpoint_mxfp4(
        build_gpt_oss(tmp_path / "bf16"),
        tmp_path / "mxfp4",
        weights=EXPERT_WEIGHTS,
        modules_to_not_convert=quantization["modules_to_not_convert"],
    )

    served = run_offline(mxfp4, tmp_path, dtype="bfloat16")
    assert served["model"]["class"] == BRIDGE and served["model"]["inner"] == PLUGINS["gpt_oss"].plugin_model
    reference = run_offline(
        dequantized_by_transformers(mxfp4, tmp_path / "dequantized"), tmp_path, dtype="bfloat16"
    )
    outputs = served["completions"] + served["chats"]
    assert [o["token_ids"] for o in outputs] == [
        o["token_ids"] for o in reference["completions"] + reference["chats"]
    ]
