"""The published Llama 3 configs, verbatim but for sizes, through `trnmodels logits` against HF.

Every field a user's checkpoint carries (the ``rope_scaling`` llama3 factors in the legacy key,
``pretraining_tp``, ``mlp_bias``, ``attention_bias``, ``tie_word_embeddings``, a BF16 ``torch_dtype``...)
stays as published; only sizes shrink. The random checkpoint is written by transformers and its
``config.json`` replaced by the shrunk published one, so both sides read the same files. Teacher-forced
FP32 logits (prefill, then decode steps) must match HF to 1e-4 at TP=1 and TP=2.
"""

from __future__ import annotations

import pytest
import torch
import transformers

from trnmodels.core.testing.published import as_hf_config, logits_case, published_config, shrink
from trnmodels.core.testing.published import (
    test_published_config_logits_match_hf as test_published_config_logits_match_hf,
)

from .conftest import perturb

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


def load_reference(ckpt):
    return transformers.LlamaForCausalLM.from_pretrained(ckpt, dtype=torch.float32)


@pytest.fixture(scope="module", params=sorted(PUBLISHED))
def case(request, tmp_path_factory):
    """The checkpoint of one published config, random ids and HF's logits of them."""
    name = request.param
    config = shrink(published_config(name), {**SIZES, **PUBLISHED[name]})
    root = tmp_path_factory.mktemp(name)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(as_hf_config(config, root / "published"))
    perturb(model.eval())
    with torch.no_grad():  # sharper attention: ignoring the llama3 RoPE factors would then exceed 1e-4
        for key, p in model.named_parameters():
            if key.endswith(("q_proj.weight", "k_proj.weight")):
                p.mul_(8.0)
    model.save_pretrained(root / "ckpt")
    return logits_case(name, root / "ckpt", config, load_reference, range(VOCAB), LENGTH, PREFILL)
