"""The published gpt-oss configs, verbatim but for sizes, through `trnmodels logits` against HF.

Every field a user's checkpoint carries (``quantization_config: mxfp4``, the legacy ``rope_scaling`` YaRN
with ``truncate: false``, ``swiglu_limit``, ``initial_context_length``, ``experts_per_token``...) stays as
published; only sizes shrink. The random checkpoint is written in the published MXFP4 blocks/scales
layout with the shrunk published ``config.json``, and HF loads the same files dequantized as the
reference. Teacher-forced FP32 logits (prefill, then decode steps past the sliding window) must match
HF to 1e-4 at TP=1 and TP=2.
"""

from __future__ import annotations

import json
import random

import pytest
import torch
import transformers

from trnmodels.core.accuracy import hf_logits
from trnmodels.core.testing.published import cli_logits_max_error, published_config, shrink

from .conftest import perturb, quantize_checkpoint

FP32_ATOL = 1e-4
WINDOW = 4
PREFILL = 6
LENGTH = 24  # decode steps run from position 6 to 23, well past the window of 4

VOCAB = 160
SIZES = {
    "hidden_size": 64,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "layer_types": ["sliding_attention", "full_attention"],
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_local_experts": 8,  # 4 experts per token, as published
    "vocab_size": VOCAB,
    "pad_token_id": 150,
    "eos_token_id": 153,
    "sliding_window": WINDOW,
}
PUBLISHED = ("gpt-oss-20b", "gpt-oss-120b")


@pytest.fixture(scope="module", params=PUBLISHED)
def case(request, tmp_path_factory):
    """(name, MXFP4 checkpoint dir, token ids, HF logits of HF's dequantized load of it)."""
    name = request.param
    config = shrink(published_config(name), SIZES)
    root = tmp_path_factory.mktemp(name)
    (root / "published").mkdir()
    (root / "published" / "config.json").write_text(json.dumps(config, indent=2))
    hf_config = transformers.AutoConfig.from_pretrained(root / "published")
    del hf_config.quantization_config  # random BF16-layout weights first; quantized below
    torch.manual_seed(0)
    model = transformers.GptOssForCausalLM(hf_config).eval()
    perturb(model)
    with torch.no_grad():
        for key, p in model.named_parameters():
            # Sharper attention, so ignoring YaRN's un-truncated correction range would exceed 1e-4.
            if key.endswith(("q_proj.weight", "k_proj.weight")):
                p.mul_(8.0)
            # Expert pre-activations well past swiglu_limit=7, so the clamp takes effect.
            if key.endswith("gate_up_proj"):
                p.mul_(50.0)
    model.save_pretrained(root / "bf16")
    ckpt = quantize_checkpoint(root / "bf16", root / "mxfp4")
    (ckpt / "config.json").write_text(json.dumps(config, indent=2))  # the published fields, verbatim

    rng = random.Random(name)
    ids = [rng.randrange(VOCAB) for _ in range(LENGTH)]
    ref = transformers.GptOssForCausalLM.from_pretrained(
        ckpt, quantization_config=transformers.Mxfp4Config(dequantize=True), dtype=torch.float32
    )
    # HF dequantizes into BF16 (exact: every MXFP4 value is a BF16 value); compute in FP32 like ours.
    ref = ref.float().eval()
    ref.config._attn_implementation = "eager"
    ref.config._experts_implementation = "eager"
    with torch.no_grad():
        expected = hf_logits(ref, ids)
    return name, ckpt, ids, expected


@pytest.mark.parametrize("tp", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_published_config_logits_match_hf(case, tp, tmp_path):
    name, ckpt, ids, expected = case
    err = cli_logits_max_error(ckpt, ids, PREFILL, tp, expected, tmp_path / "logits.safetensors")
    assert err <= FP32_ATOL, f"{name} tp={tp}: max abs error {err:.3g}"
