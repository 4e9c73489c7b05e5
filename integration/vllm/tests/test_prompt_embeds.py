"""Prompt embeddings (vLLM's ``enable_prompt_embeds``): with them on, vLLM hands every step to the bridge as
embeddings, token prompts too (it embeds their ids through ``embed_input_ids``). Served greedily, they must
equal transformers' ``generate`` from the same ids, or from the same ``inputs_embeds``."""

from __future__ import annotations

from functools import partial

import pytest
import torch
import transformers
from vllm_harness import PLUGINS, PROMPTS, TinyCheckpoint, build_gemma4, run_offline

# The checkpoint each plugin serves prompt embeddings for. Gemma 4's bundled tiny config has per-layer
# embeddings (refused, below); without them, as published, it is the text-only export here, because
# transformers' multimodal class cannot run from embeddings alone at this vocabulary size (it looks up
# its image placeholder id, beyond the tiny vocabulary, to find images among them).
BUILDS = {name: case.build for name, case in PLUGINS.items()} | (
    {"gemma4": partial(build_gemma4, text_only_moe=True, per_layer_embeddings=False)}
    if "gemma4" in PLUGINS
    else {}
)


# Each plugin eagerly, and llama3 under vLLM's compile too (the embeddings' token count is symbolic there,
# as the ids' is).
@pytest.mark.parametrize(
    "plugin,enforce_eager", [(name, True) for name in sorted(BUILDS)] + [("llama3", False)]
)
def test_prompt_embeds_match_transformers(plugin: str, enforce_eager: bool, tmp_path):
    tiny = TinyCheckpoint(plugin, BUILDS[plugin](tmp_path / "tiny"), PLUGINS[plugin])
    tokenizer = transformers.AutoTokenizer.from_pretrained(tiny.path)
    prompt_ids = [tokenizer(p)["input_ids"] for p in PROMPTS]
    embedding = tiny.hf_model().get_input_embeddings()  # scaled, for a model that scales (Gemma 4)
    with torch.no_grad():
        exact = embedding(torch.tensor(prompt_ids[0])).clone()
    # Embeddings no token has: the engine can only be right by running from them.
    off_vocabulary = exact + 0.5 * exact.std() * torch.randn(
        exact.shape, generator=torch.Generator().manual_seed(0)
    )

    result = run_offline(
        tiny.path, tmp_path, chats=[], enforce_eager=enforce_eager, prompt_embeds=[exact, off_vocabulary]
    )

    assert f"is served by plugin {plugin}" in result["log"]
    assert result["model"]["compiled"] is not enforce_eager
    # Token prompts, which vLLM embeds through the bridge's embed_input_ids.
    for out, ids in zip(result["completions"], prompt_ids, strict=True):
        assert out["prompt_token_ids"] == ids
        assert out["token_ids"] == tiny.hf_greedy(ids), ids
    from_exact, from_off_vocabulary = result["from_embeds"]
    assert from_exact == tiny.hf_greedy(prompt_ids[0])
    assert from_off_vocabulary == tiny.hf_greedy_from_embeds(off_vocabulary)
    assert from_off_vocabulary != from_exact, "the perturbation changed nothing: the test cannot tell"


@pytest.mark.skipif("gemma4" not in PLUGINS, reason="trnmodels-gemma4 is not installed")
def test_prompt_embeds_refused_at_startup_for_per_layer_embeddings(tmp_path):
    """Gemma 4's per-layer embeddings are looked up by token id: with prompt embeddings on, vLLM would give
    the bridge none, so start-up fails naming why, rather than the first request killing the engine."""
    checkpoint = build_gemma4(tmp_path / "tiny")
    with pytest.raises(AssertionError) as failed:
        run_offline(checkpoint, tmp_path, chats=[], prompt_embeds=[torch.zeros(3, 64)])
    message = str(failed.value)
    assert (
        "plugin gemma4: prompt embeddings (enable_prompt_embeds) are not supported for "
        "Gemma4ForConditionalGeneration: its per-layer embeddings (hidden_size_per_layer_input=16) are looked "
        "up by token id" in message
    )
