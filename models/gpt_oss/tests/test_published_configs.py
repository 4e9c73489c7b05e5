"""The published gpt-oss configs, verbatim but for sizes, through `trnmodels logits` against HF.

Every field a user's checkpoint carries (``quantization_config: mxfp4``, the legacy ``rope_scaling`` YaRN
with ``truncate: false``, ``swiglu_limit``, ``initial_context_length``, ``experts_per_token``...) stays as
published; only sizes shrink. The random checkpoint is written in the published MXFP4 blocks/scales
layout with the shrunk published ``config.json``, and HF loads the same files dequantized as the
reference. Teacher-forced FP32 logits (prefill, then decode steps past the sliding window) must match
HF to 1e-4 at TP=1 and TP=2.
"""

from __future__ import annotations

import pytest
import torch
import transformers

from trnmodels.core.cli import main
from trnmodels.core.testing.published import as_hf_config, logits_case, published_config, shrink
from trnmodels.core.testing.published import (
    test_published_config_logits_match_hf as test_published_config_logits_match_hf,
)

from .conftest import perturb, quantize_like_published

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


def load_reference(ckpt):
    """HF's dequantized load of the MXFP4 checkpoint."""
    ref = transformers.GptOssForCausalLM.from_pretrained(
        ckpt, quantization_config=transformers.Mxfp4Config(dequantize=True), dtype=torch.float32
    )
    # HF dequantizes into BF16 (exact: every MXFP4 value is a BF16 value); compute in FP32 like ours.
    ref = ref.float()
    ref.config._attn_implementation = "eager"
    ref.config._experts_implementation = "eager"
    return ref


@pytest.fixture(scope="module", params=PUBLISHED)
def case(request, tmp_path_factory):
    """The MXFP4 checkpoint of one published config, random ids and HF's logits of them."""
    name = request.param
    config = shrink(published_config(name), SIZES)
    root = tmp_path_factory.mktemp(name)
    hf_config = as_hf_config(config, root / "published")
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
    ckpt = quantize_like_published(root / "bf16", root / "mxfp4")
    return logits_case(name, ckpt, config, load_reference, range(VOCAB), LENGTH, PREFILL)


def test_validate_passes_on_the_mxfp4_checkpoint(case, capsys):
    """``trnmodels validate`` with no optional flag on the checkpoint as published: transformers' reference
    loads its MXFP4 experts dequantized (before, it kept them in BF16 beside FP32 layers and the run
    stopped with a dtype error inside transformers)."""
    ids = ",".join(map(str, case.token_ids[:PREFILL]))
    code = main(["validate", str(case.checkpoint), "--token-ids", ids])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "RESULT: PASS" in out
