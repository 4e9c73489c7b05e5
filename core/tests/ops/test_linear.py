"""The linear op and its CPU kernel: BF16 projections computed in FP32 on a CPU without BF16 arithmetic.

The kernel is checked three ways: against a float64 ground truth of the same BF16 inputs, it is never
further off than the BF16 reference (both round the result once; the reference's BF16 GEMM may round
more), and it is selected exactly where its predicate says (BF16, enough rows, no BF16 hardware).
"""

import pytest
import torch
import torch.nn.functional as F

import trnmodels.core.ops as ops
from trnmodels.core.cpu import linear as cpu_linear
from trnmodels.core.ops.dispatch import CPU_KERNELS_ENV_VAR, ENV_VAR, select_backend, use_backend


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    monkeypatch.delenv(ENV_VAR, raising=False)
    monkeypatch.delenv(CPU_KERNELS_ENV_VAR, raising=False)


@pytest.fixture
def no_bf16_hardware(monkeypatch):
    monkeypatch.setattr(cpu_linear, "bf16_in_hardware", lambda: False)


def _call(rows: int, dtype: torch.dtype, bias: bool = True, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, 96, generator=g).to(dtype)
    w = (torch.randn(80, 96, generator=g) / 96**0.5).to(dtype)
    b = torch.randn(80, generator=g).to(dtype) if bias else None
    return x, w, b


def _truth(x, w, b):
    return F.linear(x.double(), w.double(), None if b is None else b.double())


def test_fp32_runs_the_reference_bit_for_bit(no_bf16_hardware):
    x, w, b = _call(16, torch.float32)
    assert select_backend("linear", x, w, b) == "torch"
    assert torch.equal(ops.linear(x, w, b), F.linear(x, w, b))


@pytest.mark.parametrize("rows", [1, 2, cpu_linear.MIN_ROWS - 1])
def test_bf16_below_min_rows_runs_the_reference(no_bf16_hardware, rows):
    x, w, b = _call(rows, torch.bfloat16)
    assert select_backend("linear", x, w, b) == "torch"
    assert torch.equal(ops.linear(x, w, b), F.linear(x, w, b))


def test_bf16_with_bf16_hardware_runs_the_reference(monkeypatch):
    monkeypatch.setattr(cpu_linear, "bf16_in_hardware", lambda: True)
    assert select_backend("linear", *_call(64, torch.bfloat16)) == "torch"


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(cpu_linear.MIN_ROWS,), (128,), (2, 4, 5)])
def test_bf16_kernel_is_no_further_from_the_truth_than_the_reference(no_bf16_hardware, shape, bias):
    x, w, b = _call(int(torch.tensor(shape).prod()), torch.bfloat16, bias)
    x = x.reshape(*shape, x.shape[-1])
    assert select_backend("linear", x, w, b) == "cpu"
    got, reference, truth = ops.linear(x, w, b), F.linear(x, w, b), _truth(x, w, b)
    assert got.dtype == torch.bfloat16 and got.shape == reference.shape
    kernel_error, reference_error = (got.double() - truth).abs(), (reference.double() - truth).abs()
    assert kernel_error.max() <= reference_error.max() and kernel_error.mean() <= reference_error.mean()
    # Rounded once: within half a BF16 ulp (2**-8 relative) of the truth, plus FP32 accumulation.
    assert (kernel_error <= truth.abs() * 2**-8 + 1e-6).all()


def test_non_finite_inputs_stay_non_finite(no_bf16_hardware):
    x, w, b = _call(cpu_linear.MIN_ROWS, torch.bfloat16)
    x[3, 5] = float("nan")
    x[6, 0] = float("inf")
    out = ops.linear(x, w, b)
    assert out[3].isnan().all() and not out[6].isfinite().all() and out[[0, 1, 2, 4, 5, 7]].isfinite().all()


def test_the_env_var_and_the_torch_backend_turn_it_off(no_bf16_hardware, monkeypatch):
    args = _call(cpu_linear.MIN_ROWS, torch.bfloat16)
    with use_backend("torch"):
        assert select_backend("linear", *args) == "torch"
    monkeypatch.setenv(CPU_KERNELS_ENV_VAR, "moe_experts")
    assert select_backend("linear", *args) == "torch"
    monkeypatch.setenv(CPU_KERNELS_ENV_VAR, "linear")
    assert select_backend("linear", *args) == "cpu"


def test_matmul_upcasts_like_linear(no_bf16_hardware):
    x, w, _ = _call(cpu_linear.MIN_ROWS, torch.bfloat16)
    torch.testing.assert_close(cpu_linear.matmul(x, w.T), ops.linear(x, w), rtol=0, atol=0)
    assert torch.equal(cpu_linear.matmul(x[:1], w.T), x[:1] @ w.T)


def test_graph_capture_keeps_the_reference(no_bf16_hardware):
    """A captured graph runs the reference linear: the upcast's extra weight pass is the kernel's choice
    for eager calls, and compiled graphs keep one code path for every backend."""

    class Projection(torch.nn.Module):
        def forward(self, x, w):
            return ops.linear(x, w)

    x, w, _ = _call(cpu_linear.MIN_ROWS, torch.bfloat16)
    graph = str(torch.export.export(Projection(), (x, w), strict=True).graph)
    assert "aten.linear" in graph and "torch.float32" not in graph
