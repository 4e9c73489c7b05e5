"""A multimodal checkpoint's image, video and audio placeholder ids in text: transformers embeds them as the
pad token when no tower features come with them, and so must we. A prompt can hold them, and a small
random model generates them; the published configs' parity (``test_published_configs.py``) covers them at
TP=1 and TP=2 without per-layer embeddings, this file the PLE variant and the config check."""

from __future__ import annotations

import json

import pytest
import torch
import transformers

from trnmodels.core.accuracy.logits import hf_logits
from trnmodels.core.causal_lm import build_model
from trnmodels.core.errors import ConfigError
from trnmodels.core.runner.score import teacher_forced_logits
from trnmodels.core.runtime_config import NeuronConfig

from .conftest import PLE_KV_SHARED, build_hf

# Moved inside the tiny config's vocabulary of 320, so a token id can hold them.
PLACEHOLDERS = {"image_token_id": 300, "video_token_id": 301, "audio_token_id": 302}


def checkpoint_with_placeholders(tmp_path, **text_overrides):
    hf = build_hf(0, **text_overrides)
    for name, token_id in PLACEHOLDERS.items():
        setattr(hf.config, name, token_id)
    with torch.no_grad():  # initialised to zeros; a trained pad row is not
        pad = hf.config.text_config.pad_token_id
        hf.model.language_model.embed_tokens.weight[pad].normal_(generator=torch.Generator().manual_seed(1))
    hf.save_pretrained(tmp_path / "ckpt")
    return tmp_path / "ckpt"


def test_placeholders_embed_as_the_pad_token_with_per_layer_embeddings(tmp_path):
    """The main and the per-layer embeddings both take the pad token at a placeholder; the placeholders sit
    in the prefill and in the decode steps."""
    ckpt = checkpoint_with_placeholders(tmp_path, **PLE_KV_SHARED)
    ids = [5, 300, 17, 42, 301, 9, 302, 77, 300, 12, 301, 64]
    reference = transformers.Gemma4ForConditionalGeneration.from_pretrained(
        ckpt, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    model = build_model(str(ckpt), NeuronConfig(), progress=False)
    with torch.no_grad():
        expected = hf_logits(reference, ids)
        ours = teacher_forced_logits(model, ids, prefill_len=5)
    assert (ours - expected).abs().max().item() <= 1e-4
    # Not vacuous: the same ids embedded as themselves give other logits.
    text = [t for t in ids if t < 300]
    with torch.no_grad():
        assert not torch.allclose(expected[: len(text)], hf_logits(reference, text), atol=1e-3)


def test_a_pad_token_outside_the_vocabulary_is_refused(tmp_path):
    ckpt = checkpoint_with_placeholders(tmp_path)
    config = json.loads((ckpt / "config.json").read_text())
    config["text_config"]["pad_token_id"] = 320
    (ckpt / "config.json").write_text(json.dumps(config))
    with pytest.raises(
        ConfigError, match=r"text_config\.pad_token_id: .*\[300, 301, 302\].*\[0, 320\), got 320"
    ):
        build_model(str(ckpt), NeuronConfig(), load=False)
