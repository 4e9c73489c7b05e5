"""The published Llama 3 configs, verbatim but for sizes, through `trnmodels logits` against HF.

Every field a user's checkpoint carries (the ``rope_scaling`` llama3 factors in the legacy key,
``pretraining_tp``, ``mlp_bias``, ``attention_bias``, ``tie_word_embeddings``, a BF16 ``torch_dtype``...)
stays as published; only sizes shrink. The random checkpoint is written by transformers and its
``config.json`` replaced by the shrunk published one, so both sides read the same files. Teacher-forced
FP32 logits (prefill, then decode steps) must match HF to 1e-4 at TP=1 and TP=2.
"""

from __future__ import annotations

import json
import random

import pytest
import torch
import transformers

from trnmodels.core.accuracy import hf_logits
from trnmodels.core.testing.published import cli_logits_max_error, published_config, shrink

from .conftest import perturb

FP32_ATOL = 1e-4
PREFILL = 8
LENGTH = 32

VOCAB = 128
SIZES = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": VOCAB,
    "bos_token_id": 120,
    "eos_token_id": 121,
}
PUBLISHED = {
    "Llama-3.1-8B": {},  # no head_dim: hidden_size / num_attention_heads = 16
    "Llama-3.2-1B": {"head_dim": 16},  # explicit head_dim, tied embeddings
}


@pytest.fixture(scope="module", params=sorted(PUBLISHED))
def case(request, tmp_path_factory):
    """(name, checkpoint dir, token ids, HF logits) for one published config."""
    name = request.param
    config = shrink(published_config(name), {**SIZES, **PUBLISHED[name]})
    root = tmp_path_factory.mktemp(name)
    (root / "published").mkdir()
    (root / "published" / "config.json").write_text(json.dumps(config, indent=2))
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.AutoConfig.from_pretrained(root / "published"))
    perturb(model.eval())
    with torch.no_grad():  # sharper attention: ignoring the llama3 RoPE factors would then exceed 1e-4
        for key, p in model.named_parameters():
            if key.endswith(("q_proj.weight", "k_proj.weight")):
                p.mul_(8.0)
    ckpt = root / "ckpt"
    model.save_pretrained(ckpt)
    (ckpt / "config.json").write_text(json.dumps(config, indent=2))  # the published fields, verbatim

    rng = random.Random(name)
    ids = [rng.randrange(VOCAB) for _ in range(LENGTH)]
    ref = transformers.LlamaForCausalLM.from_pretrained(ckpt, dtype=torch.float32).eval()
    with torch.no_grad():
        expected = hf_logits(ref, ids)
    return name, ckpt, ids, expected


@pytest.mark.parametrize("tp", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_published_config_logits_match_hf(case, tp, tmp_path):
    name, ckpt, ids, expected = case
    err = cli_logits_max_error(ckpt, ids, PREFILL, tp, expected, tmp_path / "logits.safetensors")
    assert err <= FP32_ATOL, f"{name} tp={tp}: max abs error {err:.3g}"
