"""The published Gemma 4 configs, verbatim but for sizes, through `trnmodels logits` against HF.

Every field a user's checkpoint carries (``use_bidirectional_attention: "vision"``, ``attention_k_eq_v``,
``num_global_key_value_heads``, proportional RoPE, softcapping, a vision tower beside ``audio_config:
null``, an ``eos_token_id`` list...) stays as published; only sizes shrink. The random checkpoint is
written by ``Gemma4ForConditionalGeneration`` and its ``config.json`` replaced by the shrunk published one,
so both sides read the same files. Teacher-forced FP32 logits (prefill, then decode steps past the
sliding window) must match HF to 1e-4 at TP=1 and TP=2.
"""

from __future__ import annotations

import pytest
import torch
import transformers

from trnmodels.core.accuracy.logits import hf_logits
from trnmodels.core.testing.published import (
    FP32_ATOL,
    as_hf_config,
    cli_logits_max_error,
    logits_case,
    published_config,
    shrink,
)
from trnmodels.core.testing.published import (
    test_published_config_logits_match_hf as test_published_config_logits_match_hf,
)

from .conftest import FULL, SLIDING, perturb

WINDOW = 4
PREFILL = 5
LENGTH = 14  # decode steps run from position 5 to 13, well past the window of 4

VOCAB = 128
SPECIAL_IDS = {  # the multimodal placeholders, moved inside the small vocabulary
    "boi_token_id": 120,
    "eoi_token_id": 121,
    "image_token_id": 122,
    "audio_token_id": 123,
    "video_token_id": 124,
    "boa_token_id": 125,
    "eoa_token_id": 126,
    "eoa_token_index": 126,
}
TEXT = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 4,
    "layer_types": [SLIDING, FULL, SLIDING, FULL],
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "global_head_dim": 16,
    "vocab_size": VOCAB,
    "vocab_size_per_layer_input": VOCAB,
    "sliding_window": WINDOW,
}
VISION = {
    "hidden_size": 16,
    "intermediate_size": 32,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "global_head_dim": 8,
}
SIZES = {
    # 26B-A4B: MoE beside the dense MLP; 2 global KV heads as published.
    "gemma-4-26B-A4B": {
        "text_config.num_experts": 4,
        "text_config.top_k_experts": 2,
        "text_config.moe_intermediate_size": 16,
    },
    # 31B-it: dense; one global KV head (replicated at TP=2); top-level eos [1, 106] kept as published.
    "gemma-4-31B-it": {"text_config.num_global_key_value_heads": 1},
}


def shrunk(name: str) -> dict:
    sizes = {f"text_config.{k}": v for k, v in TEXT.items()}
    sizes.update({f"vision_config.{k}": v for k, v in VISION.items()})
    sizes.update(SPECIAL_IDS)
    sizes.update(SIZES[name])
    return shrink(published_config(name), sizes)


def load_reference(ckpt):
    return transformers.Gemma4ForConditionalGeneration.from_pretrained(
        ckpt, dtype=torch.float32, attn_implementation="eager"
    )


@pytest.fixture(scope="module", params=sorted(SIZES))
def case(request, tmp_path_factory):
    """The checkpoint of one published config, random text ids and HF's logits of them."""
    name = request.param
    config = shrunk(name)
    root = tmp_path_factory.mktemp(name)
    torch.manual_seed(0)
    model = transformers.Gemma4ForConditionalGeneration(as_hf_config(config, root / "published")).eval()
    perturb(model, seed=0)
    with torch.no_grad():  # logits of order 10, so final_logit_softcapping=30 takes effect
        model.model.language_model.norm.weight.mul_(20.0)
    model.save_pretrained(root / "ckpt")
    # Text only: no pad/eos/bos ids (0-2), no multimodal placeholders.
    text_ids = [t for t in range(3, VOCAB) if t not in SPECIAL_IDS.values()]
    return logits_case(name, root / "ckpt", config, load_reference, text_ids, LENGTH, PREFILL)


@pytest.mark.parametrize("tp", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_multimodal_placeholders_embed_as_the_pad_token(case, tp, tmp_path):
    """Text holding the image, audio and video placeholders (a prompt can; a random model generates them),
    in the prefill and in decode steps: embedded as transformers embeds them without tower features, as
    the pad token."""
    ids = list(case.token_ids)
    placeholders = [SPECIAL_IDS[n] for n in ("image_token_id", "audio_token_id", "video_token_id")]
    for position, token_id in zip((1, PREFILL + 1, LENGTH - 2), placeholders, strict=True):
        ids[position] = token_id
    with torch.no_grad():
        expected = hf_logits(load_reference(case.checkpoint).eval(), ids)
    err = cli_logits_max_error(case.checkpoint, ids, PREFILL, tp, expected, tmp_path / "logits.safetensors")
    assert err <= FP32_ATOL, f"{case.name} tp={tp}: max abs error {err:.3g}"
