"""The attention_cte binding: argument conversion checked against a stand-in kernel with the documented
layouts and masking (no Neuron SDK or device exists here, so the real kernel never runs), and its
registration, which happens only when configuration names it."""

from __future__ import annotations

import functools

import pytest
import torch

from trnmodels.core import neuron, ops
from trnmodels.core.errors import ConfigError
from trnmodels.core.neuron import adapters
from trnmodels.core.neuron.attention_cte import attention_cte_adapter, supports
from trnmodels.core.ops import dispatch


def stand_in_attention_cte(
    q, k, v, *, scale, causal_mask, sliding_window, tp_q, tp_k, tp_out, bound_min, bound_max
):
    """nki-library 2.32's documented semantics: q ``(B, Sq, d)``, k/v ``(Bkv, Skv, d)`` (tp_q/tp_k True),
    GQA over the batch, key j masked for query i if j > i (causal), |i - j| > window, or j outside
    [bound_min, bound_max]; output ``(B, Sq, d)``."""
    assert tp_q and tp_k and not tp_out and causal_mask and scale == 1.0
    b, s, _ = q.shape
    group = b // k.shape[0]
    kk, vv = k.repeat_interleave(group, 0), v.repeat_interleave(group, 0)
    i, j = torch.arange(s)[:, None], torch.arange(s)[None, :]
    visible = (j <= i) & (j >= bound_min[:, :, None]) & (j <= bound_max[:, :, None])
    if sliding_window:
        visible = visible & ((i - j).abs() <= sliding_window)
    scores = (q @ kk.transpose(1, 2)).masked_fill(~visible, float("-inf"))
    return torch.softmax(scores, -1) @ vv


@pytest.mark.parametrize("window", [None, 3])
def test_adapter_matches_the_reference_on_packed_ragged_prompts(window):
    torch.manual_seed(0)
    seq_ids = torch.tensor([0, 0, 0, 0, 0, 1, 1, 2, 2, 2, 2, 2, 2, -1, -1])
    q, k, v = torch.randn(15, 4, 16), torch.randn(15, 2, 16), torch.randn(15, 2, 16)
    options = dict(scale=0.3, sliding_window=window)
    expected = ops.prefill_attention.reference(q, k, v, seq_ids, **options)
    got = attention_cte_adapter(q, k, v, seq_ids, **options, kernel=stand_in_attention_cte)
    real = seq_ids >= 0  # padding rows are never read
    torch.testing.assert_close(got[real], expected[real])


def test_supports_declines_what_the_kernel_cannot_do():
    q, k = torch.zeros(4, 2, 128), torch.zeros(4, 1, 128)
    ids = torch.zeros(4, dtype=torch.int64)
    assert supports(q, k, k, ids, scale=1.0, sliding_window=8)
    assert not supports(torch.zeros(4, 2, 256), k, k, ids, scale=1.0)  # Gemma 4's 256/512 head sizes
    assert not supports(q, k, k, ids, scale=1.0, softcap=50.0)
    assert not supports(q, k, k, ids, scale=1.0, sinks=torch.zeros(2))
    assert not supports(q, k, k, ids, scale=1.0, sliding_window=1)


def test_binding_is_inert_without_the_sdk(monkeypatch):
    assert not neuron.sdk_available()
    monkeypatch.setenv(adapters.ENV_VAR, "attention_cte")
    assert adapters.register_configured_adapters() == []
    assert "prefill_attention" not in dispatch._nki_impls


def test_configuration_names_the_adapters(monkeypatch):
    monkeypatch.delenv(adapters.ENV_VAR, raising=False)
    assert adapters.configured_adapters() == ()
    monkeypatch.setenv(adapters.ENV_VAR, " attention_cte, ")
    assert adapters.configured_adapters() == ("attention_cte",)
    with pytest.raises(ConfigError, match=r"unknown NKI adapters \['attention_tce'\]"):
        adapters.register_adapters(["attention_tce"])


def test_bound_adapter_runs_only_where_it_can(monkeypatch):
    """With an SDK and Neuron tensors faked: supported calls take the adapter, others the reference
    under auto, and forcing nki on an unsupported call is an error, not a fallback."""
    calls = []

    def fake_kernel(*args, **kwargs):
        calls.append(args[0].shape)
        return stand_in_attention_cte(*args, **kwargs)

    monkeypatch.setattr(neuron, "sdk_available", lambda: True)
    monkeypatch.setattr(neuron, "is_neuron_tensor", lambda t: isinstance(t, torch.Tensor))
    monkeypatch.setattr(dispatch, "_nki_impls", {})
    monkeypatch.setattr(dispatch, "_nki_supports", {})
    bound = adapters.NkiAdapter(
        "prefill_attention", functools.partial(attention_cte_adapter, kernel=fake_kernel), supports
    )
    monkeypatch.setitem(adapters.NKI_ADAPTERS, "attention_cte", bound)
    assert adapters.register_adapters(["attention_cte"]) == ["attention_cte"]
    ids = torch.zeros(6, dtype=torch.int64)
    small = torch.randn(6, 2, 16)
    ops.prefill_attention(small, small, small, ids, scale=1.0, sliding_window=4)
    assert calls == [(2, 6, 16)]
    wide = torch.randn(6, 2, 256)
    ops.prefill_attention(wide, wide, wide, ids, scale=1.0)
    assert len(calls) == 1  # head size 256: the reference ran
    with ops.use_backend("nki"), pytest.raises(Exception, match="does not support this call"):
        ops.prefill_attention(wide, wide, wide, ids, scale=1.0)
