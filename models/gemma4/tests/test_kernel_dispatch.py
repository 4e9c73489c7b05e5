"""Building Gemma 4 leaves the process's kernel dispatch alone: its ``attention_cte`` adapter is bound only
when the runtime configuration names it (core ``neuron.adapters``), never as a side effect of a build."""

from __future__ import annotations

import torch

from trnmodels.core import neuron
from trnmodels.core.neuron import adapters
from trnmodels.core.ops import dispatch
from trnmodels.core.parallel import destroy_parallel_state, init_parallel_state
from trnmodels.core.runtime_config import NeuronConfig
from trnmodels.gemma4.factory import build

from .conftest import hf_config


def test_building_gemma4_does_not_change_another_models_dispatch(monkeypatch):
    """With the SDK and Neuron tensors faked, a prefill call another model makes (head size 64, no
    softcap: one the adapter would take) runs the PyTorch reference before and after Gemma 4 is built."""
    monkeypatch.setattr(neuron, "sdk_available", lambda: True)
    monkeypatch.setattr(neuron, "is_neuron_tensor", lambda t: isinstance(t, torch.Tensor))
    monkeypatch.setattr(dispatch, "_nki_impls", {})
    monkeypatch.setattr(dispatch, "_nki_supports", {})
    monkeypatch.delenv(adapters.ENV_VAR, raising=False)
    q, ids = torch.randn(6, 2, 64), torch.zeros(6, dtype=torch.int64)

    def backend() -> str:
        return dispatch.select_backend("prefill_attention", q, q, q, ids, scale=0.125)

    assert backend() == "torch"
    init_parallel_state(1)
    try:
        build(hf_config(), NeuronConfig())
    finally:
        destroy_parallel_state()
    assert dispatch._nki_impls == {} and backend() == "torch"
    # Named by configuration, the adapter is bound for the whole process.
    monkeypatch.setenv(adapters.ENV_VAR, "attention_cte")
    assert adapters.register_configured_adapters() == ["attention_cte"]
    assert backend() == "nki"
