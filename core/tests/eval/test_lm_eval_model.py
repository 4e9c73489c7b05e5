"""The ``trnmodels`` lm_eval model against transformers on a tiny random llama checkpoint."""

from __future__ import annotations

import math

import pytest
import torch
from lm_eval.api.instance import Instance

from trnmodels.core.errors import ConfigError

FP32_ATOL = 1e-4

TEXT = (
    "Paged attention stores keys and values in fixed-size blocks. The quick brown fox jumps over the "
    "lazy dog. Tensor parallelism splits attention heads across NeuronCores."
)


@torch.no_grad()
def hf_logprobs(hf_model, ids: list[int]) -> torch.Tensor:
    """``[len(ids), vocab]`` float64 log-probs: row i predicts the token after ``ids[: i + 1]``."""
    logits = hf_model(torch.tensor([ids])).logits[0].double()
    return torch.log_softmax(logits, dim=-1)


def ll_instance(context: str, continuation: str) -> Instance:
    return Instance("loglikelihood", {}, (context, continuation), 0)


def test_loglikelihood_equals_hf_logprobs(lm, hf_model, tokenizer):
    pairs = [
        ("The quick brown", " fox jumps"),
        ("Paged attention stores keys", " and values in blocks"),
        ("Once upon a time, ", "a small model"),  # the trailing space moves to the continuation
        ("", "Hello there"),  # empty context: scored after the prefix (BOS) token
    ]
    ours = lm.loglikelihood([ll_instance(c, x) for c, x in pairs])
    for (context, continuation), (logprob, greedy) in zip(pairs, ours, strict=True):
        if context:
            # lm_eval's rule: trailing spaces of the context belong to the continuation; the continuation's
            # tokens are those of the whole text past the context's.
            stripped = context.rstrip()
            ctx = tokenizer.encode(stripped)
            cont = tokenizer.encode(context + continuation)[len(ctx) :]
        else:
            ctx, cont = [tokenizer.bos_token_id], tokenizer.encode(continuation, add_special_tokens=False)
        ids = ctx + cont
        logprobs = hf_logprobs(hf_model, ids[:-1])
        picked = [logprobs[len(ctx) - 1 + i, t].item() for i, t in enumerate(cont)]
        argmax = [int(logprobs[len(ctx) - 1 + i].argmax()) for i in range(len(cont))]
        assert logprob == pytest.approx(math.fsum(picked), abs=FP32_ATOL), (context, continuation)
        assert greedy == (argmax == cont)


def test_greedy_flag_is_true_for_the_models_own_argmax(lm, hf_model, tokenizer):
    ctx = tokenizer.encode("The quick brown")
    logprobs = hf_logprobs(hf_model, ctx)
    best = int(logprobs[-1].argmax())
    ((_, greedy),) = lm._loglikelihood_tokens([(None, ctx, [best])])
    assert greedy


def test_rolling_loglikelihood_is_the_sum_of_hf_logprobs_over_windows(lm, hf_model, tokenizer):
    tokens = tokenizer.encode(TEXT)
    window = lm.max_length
    assert len(tokens) > 2 * window  # several windows, the last one partial
    # Each window predicts up to `window` new tokens from at most `window` inputs: u = [BOS] + tokens, the
    # prediction of tokens[i] sees u[a : i + 1] with a = max(0, end - window) for the window ending at end.
    u = [lm.prefix_token_id, *tokens]
    expected, start = 0.0, 0
    while start < len(tokens):
        end = min(start + window, len(tokens))
        a = max(0, end - window)
        logprobs = hf_logprobs(hf_model, u[a:end])
        expected += math.fsum(logprobs[i - a, tokens[i]].item() for i in range(start, end))
        start = end
    (ours,) = lm.loglikelihood_rolling([Instance("loglikelihood_rolling", {}, (TEXT,), 0)])
    assert ours == pytest.approx(expected, abs=FP32_ATOL * len(tokens))


def test_rolling_loglikelihood_of_a_short_text_is_one_window(lm, hf_model, tokenizer):
    text = "The quick brown fox."
    tokens = tokenizer.encode(text)
    assert len(tokens) < lm.max_length
    logprobs = hf_logprobs(hf_model, [lm.prefix_token_id, *tokens])
    expected = math.fsum(logprobs[i, t].item() for i, t in enumerate(tokens))
    (ours,) = lm.loglikelihood_rolling([Instance("loglikelihood_rolling", {}, (text,), 0)])
    assert ours == pytest.approx(expected, abs=FP32_ATOL)


@torch.no_grad()
def test_generate_until_equals_hf_greedy_with_a_stop_string(lm, hf_model, tokenizer):
    prompt = "Once upon a time"
    ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
    full = hf_model.generate(ids, max_new_tokens=12, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    generated = full[0, ids.shape[1] :].tolist()
    text = tokenizer.decode(generated, skip_special_tokens=True)
    # A stop string that first appears after a few tokens: the text before it is the expected answer.
    stop = next(
        piece
        for k in range(3, len(generated))
        if (piece := tokenizer.decode(generated[k : k + 1], skip_special_tokens=True).strip())
        and piece not in tokenizer.decode(generated[:k], skip_special_tokens=True)
    )
    expected = text.split(stop)[0]
    worker = lm.pool._local  # TP=1 runs in-process
    before = len(worker.runner.steps)
    (stopped,) = lm.generate_until(
        [
            Instance(
                "generate_until", {}, (prompt, {"until": [stop], "max_gen_toks": 12, "do_sample": False}), 0
            )
        ]
    )
    assert stopped == expected
    # The stop string ended the sequence early: one prefill and fewer than 11 decode steps.
    assert worker.runner.stopped_early == 1
    assert len(worker.runner.steps) - before < 12
    (unstopped,) = lm.generate_until(
        [Instance("generate_until", {}, (prompt, {"until": ["<never>"], "max_gen_toks": 12}), 0)]
    )
    assert unstopped == text


def test_unknown_model_args_are_an_error(tiny_checkpoint):
    from trnmodels.core.eval import register

    with pytest.raises(ConfigError, match="unknown"):
        register()(pretrained=str(tiny_checkpoint), max_model_len=32, tpp=2)
    with pytest.raises(ConfigError, match="dtype"):
        register()(pretrained=str(tiny_checkpoint), max_model_len=32, dtype="fp8")


def test_model_is_registered_with_lm_eval(tiny_checkpoint):
    from lm_eval.api.registry import get_model

    from trnmodels.core.eval import register

    assert get_model("trnmodels") is register()


@pytest.mark.slow  # two gloo ranks
def test_tensor_parallel_scores_equal_tp1(lm, tiny_checkpoint):
    """TP=2 ranks (spawned once, serving several calls) score as TP=1 does."""
    from trnmodels.core.eval import register

    pairs = [("The quick brown", " fox jumps"), ("Paged attention", " stores keys")]
    expected = lm.loglikelihood([ll_instance(c, x) for c, x in pairs])
    tp2 = register()(pretrained=str(tiny_checkpoint), max_model_len=32, block_size=8, eager=True, tp=2)
    try:
        first = tp2.loglikelihood([ll_instance(c, x) for c, x in pairs])
        (rolling,) = tp2.loglikelihood_rolling([Instance("loglikelihood_rolling", {}, (TEXT,), 0)])
    finally:
        tp2.close()
    (rolling_tp1,) = lm.loglikelihood_rolling([Instance("loglikelihood_rolling", {}, (TEXT,), 0)])
    for (a, ga), (b, gb) in zip(first, expected, strict=True):
        assert a == pytest.approx(b, abs=FP32_ATOL) and ga == gb
    assert rolling == pytest.approx(rolling_tp1, abs=FP32_ATOL * 10)
