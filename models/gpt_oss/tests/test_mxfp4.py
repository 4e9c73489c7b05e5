"""MXFP4 checkpoints: quantized by our own quantizer into the published ``*_blocks``/``*_scales`` form,
loaded through the same command as BF16, matching HF loading the same files (dequantized on CPU)."""

from __future__ import annotations

import json

import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file

from trnmodels.core.accuracy import hf_logits
from trnmodels.core.causal_lm import build_model
from trnmodels.core.errors import CheckpointError
from trnmodels.core.runner.score import score_checkpoint
from trnmodels.core.runtime_config import NeuronConfig
from trnmodels.core.testing import run_cli

IDS = [5, 17, 3, 99, 42, 8, 0, 100, 64, 23, 11, 7, 30, 31, 2, 9, 12, 77, 54, 4, 6, 19]
PREFILL = 10


@pytest.fixture(scope="module")
def mxfp4(tmp_path_factory):
    """(MXFP4 checkpoint dir, HF logits of HF's own MXFP4 load of it)."""
    from trnmodels.core.testing import save_checkpoint

    from .conftest import build_hf, quantize_like_published

    root = tmp_path_factory.mktemp("mxfp4")
    bf16 = save_checkpoint(build_hf(seed=11), root / "bf16")
    ckpt = quantize_like_published(bf16, root / "mxfp4")
    ref = transformers.GptOssForCausalLM.from_pretrained(
        ckpt, quantization_config=transformers.Mxfp4Config(dequantize=True), dtype=torch.float32
    )
    # HF dequantizes into BF16 (exact: every MXFP4 value is a BF16 value); compute in FP32 like ours.
    ref = ref.float().eval()
    ref.config._attn_implementation = "eager"
    ref.config._experts_implementation = "eager"
    return ckpt, hf_logits(ref, IDS)


def test_checkpoint_has_published_layout(mxfp4):
    ckpt, _ = mxfp4
    tensors = load_file(ckpt / "model.safetensors")
    blocks, scales = (tensors[f"model.layers.0.mlp.experts.gate_up_proj_{s}"] for s in ("blocks", "scales"))
    assert blocks.dtype == scales.dtype == torch.uint8
    # [experts, 2 * intermediate (rows), hidden / 32, 16 bytes] and one scale per 32 values.
    assert tuple(blocks.shape) == (4, 128, 2, 16) and tuple(scales.shape) == (4, 128, 2)
    assert "model.layers.0.mlp.experts.gate_up_proj" not in tensors
    assert json.loads((ckpt / "config.json").read_text())["quantization_config"]["quant_method"] == "mxfp4"


def test_mxfp4_logits_match_hf_dequantized(mxfp4):
    ckpt, expected = mxfp4
    ours = score_checkpoint(ckpt, IDS, PREFILL)
    assert (ours - expected).abs().max() <= 1e-4


@pytest.mark.slow  # a CLI process that starts two ranks
def test_mxfp4_through_cli_with_ep2(mxfp4, tmp_path):
    """The same command as a BF16 checkpoint; each EP rank decodes only its experts' blocks."""
    ckpt, expected = mxfp4
    out = tmp_path / "logits.safetensors"
    done = run_cli(
        "logits", str(ckpt), "--token-ids", ",".join(map(str, IDS)), "--prefill-len", str(PREFILL),
        "--ep", "2", "--out", str(out),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert (load_file(out)["logits"] - expected).abs().max() <= 1e-4


def _corrupt(ckpt, tmp_path, key, value):
    bad = tmp_path / "bad"
    bad.mkdir()
    tensors = load_file(ckpt / "model.safetensors")
    tensors[key] = value(tensors[key])
    save_file(tensors, str(bad / "model.safetensors"), metadata={"format": "pt"})
    (bad / "config.json").write_text((ckpt / "config.json").read_text())
    return bad


CORRUPTIONS = {
    "scales_wrong_shape": ("gate_up_proj_scales", lambda t: t[..., :1].contiguous(), "scales"),
    "scales_wrong_dtype": ("gate_up_proj_scales", lambda t: t.float(), "torch.uint8"),
    "blocks_wrong_shape": ("down_proj_blocks", lambda t: t[..., :8].contiguous(), "16 bytes"),
    "blocks_wrong_dtype": ("down_proj_blocks", lambda t: t.to(torch.int16), "torch.uint8"),
}


@pytest.mark.parametrize("case", CORRUPTIONS)
def test_corrupt_mxfp4_tensor_is_a_clear_error(mxfp4, tmp_path, case):
    ckpt, _ = mxfp4
    name, corrupt, expected_text = CORRUPTIONS[case]
    key = f"model.layers.1.mlp.experts.{name}"
    bad = _corrupt(ckpt, tmp_path, key, corrupt)
    with pytest.raises(CheckpointError) as e:
        build_model(bad, NeuronConfig(), progress=False)
    assert key in str(e.value) and expected_text in str(e.value), str(e.value)
