"""Capture is whole-graph: a graph break is an error that names the offending source line."""

from __future__ import annotations

import inspect
import warnings

import pytest
import torch

from trnmodels.core.attention import PagedAttention
from trnmodels.core.compile import driver
from trnmodels.core.compile.driver import CompileError, capture


class DataDependentBranch(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum().item() > 0:  # the graph break: Python control flow on a tensor's value
            return x * 2
        return x


class Clean(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.where(x.sum() > 0, x * 2, x)


def test_graph_break_names_the_line():
    line = inspect.getsourcelines(DataDependentBranch.forward)[1] + 1
    with pytest.raises(
        CompileError, match=rf"prefill_8: the graph cannot be captured whole at .*test_capture\.py:{line}"
    ):
        capture(DataDependentBranch(), (torch.randn(8),), "prefill_8")


def test_clean_graph_captures():
    program = capture(Clean(), (torch.randn(8),), "prefill_8")
    x = torch.randn(8)
    torch.testing.assert_close(program.module()(x), Clean()(x))


class BindsItsAttentionCache(torch.nn.Module):
    """What a runner step does: bind the cache tensors it is passed to its attention layer."""

    def __init__(self) -> None:
        super().__init__()
        self.attn = PagedAttention("layers.0.attn", num_heads=2, num_kv_heads=1, head_dim=4)

    def forward(self, x: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> torch.Tensor:
        self.attn.bind(k_cache, v_cache)
        return x + self.attn.k_cache.sum()


class StoresStateInForward(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.inner.last_input = x  # state kept across calls: a graph would not replay it
        return self.inner(x)


def test_binding_the_attention_caches_captures_without_a_warning():
    cache = torch.zeros(3, 1, 4, 4)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        capture(BindsItsAttentionCache(), (torch.randn(8), cache, cache.clone()), "decode_1x8")
    assert [str(w.message) for w in caught] == []


def test_a_side_effect_outside_the_attention_layers_is_still_shown():
    with pytest.warns(UserWarning, match=r"side effects happened.*'inner'"):
        capture(StoresStateInForward(), (torch.randn(2, 8),), "prefill_2")


def test_a_warning_raised_before_a_failure_is_still_shown():
    with pytest.warns(UserWarning, match="the model's own"), pytest.raises(CompileError):
        with driver._expected_warnings_hidden(torch.nn.Module()):
            warnings.warn("the model's own warning", UserWarning, stacklevel=1)
            raise CompileError("prefill_8: the graph cannot be captured whole")
