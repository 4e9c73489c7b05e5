"""Capture is whole-graph: a graph break is an error that names the offending source line."""

from __future__ import annotations

import inspect

import pytest
import torch

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
