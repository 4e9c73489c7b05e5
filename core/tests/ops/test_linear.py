"""The linear op and its CPU kernel: one-row FP32 calls through oneDNN, a few FP32 rows against a large
weight as a swapped SGEMM, one row and five to eight rows in a captured graph as a reduction, BF16
projections computed in FP32 on a CPU without BF16 arithmetic.

The kernel is checked against a float64 ground truth of the same inputs: in FP32 it is within FP32
rounding of it, as the reference is, and multi-row FP32 calls are an SGEMM like the reference's, its
operands swapped for a few rows against a large weight (oneDNN sums those more coarsely, which broke
logit parity on real weights); in BF16 it is never further off
than the BF16 reference (both round the result once; the reference's BF16 GEMM may round more). It is
selected exactly where its predicate says, and graph capture for the CPU takes it.
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


@pytest.fixture(autouse=True)
def untuned_sgemm(monkeypatch):
    """The rules for a CPU where MKL's SGEMM takes its generic code paths (not an Intel CPU), on any CPU;
    ``tuned_sgemm`` tests the other rule."""
    monkeypatch.setattr(cpu_linear, "sgemm_tuned", lambda: False)


@pytest.fixture
def tuned_sgemm(monkeypatch):
    monkeypatch.setattr(cpu_linear, "sgemm_tuned", lambda: True)


def _no_coarser_than_sgemm(got, reference, truth):
    """The swapped call sums in SGEMM's own order: its error is the reference's. Only where the rule is
    this CPU's own: on an Intel CPU MKL's tuned SGEMM sums a few rows more finely than the swapped call
    (2.2x smaller largest error at 2 rows of 1024 x 2048 on a Xeon), and there no call swaps."""
    if not cpu_linear._SGEMM_TUNED:
        assert (got.double() - truth).abs().max() <= 2 * (reference.double() - truth).abs().max()


def _call(rows: int, dtype: torch.dtype, bias: bool = True, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, 96, generator=g).to(dtype)
    w = (torch.randn(80, 96, generator=g) / 96**0.5).to(dtype)
    b = torch.randn(80, generator=g).to(dtype) if bias else None
    return x, w, b


def _truth(x, w, b):
    return F.linear(x.double(), w.double(), None if b is None else b.double())


def _fp32_bound(x, w, b):
    """Each of K products rounds by 2**-24 relative; the sum by at most K such steps of its partial sums."""
    return x.shape[-1] * 2**-24 * _truth(x.abs(), w.abs(), None if b is None else b.abs())


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(1,), (1, 1), (1, 1, 1)])
def test_fp32_one_row_runs_onednn_within_fp32_rounding_of_the_truth(shape, bias):
    x, w, b = _call(int(torch.tensor(shape).prod()), torch.float32, bias)
    x = x.reshape(*shape, x.shape[-1])
    assert select_backend("linear", x, w, b) == "cpu"
    got, reference, truth = ops.linear(x, w, b), F.linear(x, w, b), _truth(x, w, b)
    assert got.dtype == torch.float32 and got.shape == reference.shape
    bound = _fp32_bound(x, w, b)
    assert ((got.double() - truth).abs() <= bound).all()
    assert ((reference.double() - truth).abs() <= bound).all()


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(2,), (8,), (256,), (2, 4, 5)])
def test_fp32_several_rows_run_the_reference_sgemm(shape, bias):
    x, w, b = _call(int(torch.tensor(shape).prod()), torch.float32, bias)
    x = x.reshape(*shape, x.shape[-1])
    assert select_backend("linear", x, w, b) == "torch"
    assert torch.equal(ops.linear(x, w, b), F.linear(x, w, b))


def _large_call(rows: int, bias: bool = True, elements: int = cpu_linear.SWAP_MIN_WEIGHT, k: int = 2048):
    """A weight of ``SWAP_MIN_WEIGHT`` elements: the size from which a few rows swap the operands. It is
    ``k`` wide, by default wider than ``SWAP_NARROW_MAX_K`` (a narrow weight swaps more rows)."""
    g = torch.Generator().manual_seed(1)
    n = elements // k
    x = torch.randn(rows, k, generator=g)
    w = torch.randn(n, k, generator=g) / k**0.5
    return x, w, torch.randn(n, generator=g) if bias else None


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(2,), (8,), (2, 4, 4), (cpu_linear.SWAP_MAX_ROWS,)])
def test_fp32_few_rows_against_a_large_weight_run_the_swapped_sgemm_within_fp32_rounding(shape, bias):
    x, w, b = _large_call(int(torch.tensor(shape).prod()), bias)
    x = x.reshape(*shape, x.shape[-1])
    assert select_backend("linear", x, w, b) == "cpu"
    got, reference, truth = ops.linear(x, w, b), F.linear(x, w, b), _truth(x, w, b)
    assert got.shape == reference.shape and got.is_contiguous()
    k = x.shape[-1]
    bound = k * 2**-24 * _truth(x.abs(), w.abs(), None if b is None else b.abs())
    assert ((got.double() - truth).abs() <= bound).all()
    # Not a coarser order than the reference's (as oneDNN's was): the same size of error.
    _no_coarser_than_sgemm(got, reference, truth)


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("rows", range(2, cpu_linear.SWAP_FEW_ROWS + 1))
def test_up_to_four_rows_swap_from_a_smaller_weight_within_fp32_rounding(rows, bias):
    x, w, b = _large_call(rows, bias, elements=cpu_linear.SWAP_FEW_ROWS_MIN_WEIGHT)
    assert w.numel() == cpu_linear.SWAP_FEW_ROWS_MIN_WEIGHT < cpu_linear.SWAP_MIN_WEIGHT
    assert select_backend("linear", x, w, b) == "cpu"
    got, reference, truth = ops.linear(x, w, b), F.linear(x, w, b), _truth(x, w, b)
    bound = x.shape[-1] * 2**-24 * _truth(x.abs(), w.abs(), None if b is None else b.abs())
    assert ((got.double() - truth).abs() <= bound).all()
    _no_coarser_than_sgemm(got, reference, truth)


@pytest.mark.parametrize("case", ["more-rows", "smaller-weight"])
def test_the_smaller_weight_swaps_only_up_to_four_rows(case):
    rows = cpu_linear.SWAP_FEW_ROWS + 1 if case == "more-rows" else cpu_linear.SWAP_FEW_ROWS
    x, w, b = _large_call(rows, elements=cpu_linear.SWAP_FEW_ROWS_MIN_WEIGHT)
    if case == "smaller-weight":
        w, b = w[:-1], b[:-1]
    assert not cpu_linear.swap_pays(x, w, b)
    assert select_backend("linear", x, w, b) == "torch"


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("rows", range(cpu_linear.SWAP_FEW_ROWS + 1, cpu_linear.SWAP_NARROW_MAX_ROWS + 1))
def test_up_to_eight_rows_swap_a_narrow_smaller_weight_within_fp32_rounding(rows, bias):
    k = cpu_linear.SWAP_NARROW_MAX_K
    x, w, b = _large_call(rows, bias, elements=cpu_linear.SWAP_FEW_ROWS_MIN_WEIGHT, k=k)
    assert w.shape[-1] == k and w.numel() == cpu_linear.SWAP_FEW_ROWS_MIN_WEIGHT
    assert select_backend("linear", x, w, b) == "cpu"
    got, reference, truth = ops.linear(x, w, b), F.linear(x, w, b), _truth(x, w, b)
    bound = k * 2**-24 * _truth(x.abs(), w.abs(), None if b is None else b.abs())
    assert ((got.double() - truth).abs() <= bound).all()
    _no_coarser_than_sgemm(got, reference, truth)


@pytest.mark.parametrize("case", ["wider", "more-rows", "smaller-weight"])
def test_a_narrow_smaller_weight_swaps_only_up_to_eight_rows(case):
    rows = cpu_linear.SWAP_NARROW_MAX_ROWS + (case == "more-rows")
    k = cpu_linear.SWAP_NARROW_MAX_K + 64 * (case == "wider")
    x, w, b = _large_call(rows, elements=cpu_linear.SWAP_FEW_ROWS_MIN_WEIGHT * k // 1024, k=k)
    if case == "smaller-weight":
        w, b = w[:-1], b[:-1]
    assert not cpu_linear.swap_pays(x, w, b)
    assert select_backend("linear", x, w, b) == "torch"


@pytest.mark.parametrize("case", ["too-many-rows", "small-weight", "transposed-weight", "bf16"])
def test_the_swap_is_only_taken_where_it_was_measured_to_pay(case):
    x, w, b = _large_call(cpu_linear.SWAP_MAX_ROWS + 1 if case == "too-many-rows" else 8)
    if case == "small-weight":
        w, b = w[: w.shape[0] // 2], b[: w.shape[0] // 2]
    if case == "transposed-weight":
        w = w.t().contiguous().t()
    if case == "bf16":
        x, w, b = x.bfloat16(), w.bfloat16(), b.bfloat16()
    assert not cpu_linear.swap_pays(x, w, b)
    assert select_backend("linear", x, w, b) == "torch"


def test_fp32_kernel_takes_strided_inputs_and_weights():
    x, w, b = _call(1, torch.float32)
    w_strided = w.t().contiguous().t()
    x_strided = torch.randn(96, 3)[:, 1:2].t()
    x_strided.copy_(x)
    assert not x_strided.is_contiguous() and not w_strided.is_contiguous()
    assert select_backend("linear", x_strided, w_strided, b) == "cpu"
    torch.testing.assert_close(ops.linear(x_strided, w_strided, b), _truth(x, w, b).float())


def test_fp32_with_a_gradient_runs_the_reference():
    """oneDNN's inner product has no backward: a call that records one keeps ``F.linear``."""
    x, w, b = _call(1, torch.float32)
    w.requires_grad_(True)
    assert select_backend("linear", x, w, b) == "torch"
    ops.linear(x, w, b).sum().backward()
    torch.testing.assert_close(w.grad, x.sum(0, keepdim=True).expand_as(w))
    with torch.no_grad():
        assert select_backend("linear", x, w, b) == "cpu"


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


class _Projection(torch.nn.Module):
    def forward(self, x, w):
        return ops.linear(x, w)


_FEW = cpu_linear.SWAP_FEW_ROWS


@pytest.mark.parametrize(
    ("rows", "dtype", "kernels", "expected", "absent"),
    [
        (1, torch.float32, "all", "aten.sum", "mkldnn"),
        (1, torch.float32, "all", "inductor_force_stride_order", "aten.linear"),
        (1, torch.float32, "none", "aten.linear", "mkldnn"),
        (_FEW + 1, torch.float32, "all", "inductor_force_stride_order", "aten.linear"),
        (cpu_linear.REDUCTION_MAX_ROWS, torch.float32, "all", "aten.sum", "aten.linear"),
        (cpu_linear.REDUCTION_MAX_ROWS, torch.float32, "none", "aten.linear", "aten.sum"),
        (cpu_linear.REDUCTION_MAX_ROWS + 1, torch.float32, "all", "aten.linear", "aten.sum"),
        (f"transposed-{cpu_linear.REDUCTION_MAX_ROWS}", torch.float32, "all", "aten.linear", "aten.sum"),
        (f"large-{_FEW}", torch.float32, "all", "aten.mm", "aten.linear"),
        (f"large-{cpu_linear.REDUCTION_MAX_ROWS}", torch.float32, "all", "aten.sum", "aten.mm"),
        (cpu_linear.MIN_ROWS, torch.bfloat16, "all", "aten.to.dtype", "mkldnn"),
        (cpu_linear.MIN_ROWS - 1, torch.bfloat16, "all", "aten.linear", "aten.to.dtype"),
    ],
    ids=[
        "fp32-one-row",
        "fp32-one-row-input-in-its-own-buffer",
        "fp32-kernels-off",
        "fp32-five-rows",
        "fp32-eight-rows",
        "fp32-eight-rows-kernels-off",
        "fp32-nine-rows",
        "fp32-eight-rows-transposed-weight",
        "fp32-four-rows-swapped",
        "fp32-eight-rows-large-weight",
        "bf16-upcast",
        "bf16-few-rows",
    ],
)
def test_graph_capture_takes_the_kernel(
    no_bf16_hardware, monkeypatch, rows, dtype, kernels, expected, absent
):
    """The kernel is static, so a CPU graph captures it: the same inner product as eager calls, or for
    one row and five to eight FP32 rows a product and a sum (another order of the same sum)."""
    monkeypatch.setenv(CPU_KERNELS_ENV_VAR, kernels)
    if isinstance(rows, str) and rows.startswith("large-"):
        x, w, _ = _large_call(int(rows.removeprefix("large-")))
    elif isinstance(rows, str):  # a column-major weight: the reduction would read it across its rows
        x, w, _ = _call(int(rows.removeprefix("transposed-")), dtype)
        w = w.t().contiguous().t()
    else:
        x, w, _ = _call(rows, dtype)
    with torch.no_grad():
        program = torch.export.export(_Projection(), (x, w), strict=True)
    assert expected in str(program.graph) and absent not in str(program.graph)
    got = program.module()(x, w)
    if "aten.sum" in str(program.graph):
        assert ((got.double() - _truth(x, w, None)).abs() <= _fp32_bound(x, w, None)).all()
    else:
        torch.testing.assert_close(got, ops.linear(x, w), rtol=0, atol=0)


@pytest.mark.parametrize(
    ("rows", "elements", "k"),
    [
        (1, cpu_linear.SWAP_MIN_WEIGHT, 2048),
        (2, cpu_linear.SWAP_MIN_WEIGHT, 2048),
        (_FEW, cpu_linear.SWAP_MIN_WEIGHT, 2048),
        (_FEW, cpu_linear.SWAP_MIN_WEIGHT, cpu_linear.SWAP_NARROW_MAX_K),
        (cpu_linear.SWAP_NARROW_MAX_ROWS, cpu_linear.SWAP_FEW_ROWS_MIN_WEIGHT, cpu_linear.SWAP_NARROW_MAX_K),
    ],
    ids=["one-row", "two-rows", "four-rows", "four-rows-narrow", "eight-rows-narrow-smaller-weight"],
)
def test_where_sgemm_is_tuned_eager_fp32_calls_keep_it(tuned_sgemm, rows, elements, k):
    """On an Intel CPU MKL's SGEMM was the fastest eager FP32 call of one to four rows, and of a narrow
    smaller weight (the module's notes): those calls keep the reference, bit for bit."""
    x, w, b = _large_call(rows, elements=elements, k=k)
    assert not cpu_linear.onednn_runs(x, w, b) and not cpu_linear.swap_pays(x, w, b)
    assert select_backend("linear", x, w, b) == "torch"
    assert torch.equal(ops.linear(x, w, b), F.linear(x, w, b))


@pytest.mark.parametrize("rows", [_FEW + 1, cpu_linear.SWAP_MAX_ROWS])
def test_where_sgemm_is_tuned_more_rows_against_a_large_weight_still_swap(tuned_sgemm, rows):
    x, w, b = _large_call(rows)
    assert select_backend("linear", x, w, b) == "cpu"
    got = ops.linear(x, w, b)
    assert ((got.double() - _truth(x, w, b)).abs() <= _fp32_bound(x, w, b)).all()
    assert not cpu_linear.swap_pays(_large_call(cpu_linear.SWAP_MAX_ROWS + 1)[0], w, b)


@pytest.mark.parametrize(
    ("rows", "expected", "absent"),
    [
        (1, "aten.sum", "aten.linear"),
        (_FEW, "aten.linear", "aten.mm"),
        (cpu_linear.REDUCTION_MAX_ROWS, "aten.sum", "aten.linear"),
    ],
    ids=["one-row-reduction", "four-rows-not-swapped", "eight-rows-reduction"],
)
def test_where_sgemm_is_tuned_graphs_keep_the_reductions_and_swap_nothing(
    tuned_sgemm, rows, expected, absent
):
    """Inductor's reductions are its own code on every CPU (the compiled batch-1 decode of Gemma 4's bench
    config streamed its weights at 105% of the copy bandwidth on a Xeon); only the swap is left out."""
    x, w, _ = _large_call(rows)
    with torch.no_grad():
        program = torch.export.export(_Projection(), (x, w), strict=True)
    assert expected in str(program.graph) and absent not in str(program.graph)
    got = program.module()(x, w)
    assert ((got.double() - _truth(x, w, None)).abs() <= _fp32_bound(x, w, None)).all()


@pytest.mark.parametrize(
    ("k", "chunks"),
    [(768, 4), (576, 3), (1536, 8), (2048, 8), (2880, 15), (192, 1), (383, 1), (100, 1), (16, 1)],
)
def test_a_few_rows_reduction_sums_each_row_in_runs_of_whole_vectors(k, chunks):
    """Runs of at least ``REDUCTION_CHUNK`` elements, a whole number of 16-lane vectors each (hand-counted:
    2880 = 15 runs of 192; 2048 = 8 of 256, as 10 or 12 runs would not be whole vectors)."""
    assert cpu_linear.reduction_chunks(k) == chunks
    assert k % chunks == 0


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("rows", [1, _FEW + 1, cpu_linear.REDUCTION_MAX_ROWS])
@pytest.mark.parametrize("k", [768, 576, 100])
def test_the_graph_reduction_compiled_by_inductor_is_within_fp32_rounding_of_the_truth(rows, bias, k):
    """Inductor compiles the kernel's product and sum (traced as our graph capture traces it, not through
    the op's runtime custom op) into a reduction over each weight row (for a few rows, in runs: 4, 3 and 1
    of them at these widths): within FP32 rounding of the truth, and no further from it than SGEMM in the
    root mean square (their largest errors, single samples, take turns: 5.7e-7 against SGEMM's 5.1e-7 at
    five rows of 576, 5.3e-7 against 6.8e-7 at eight rows of 768)."""
    g = torch.Generator().manual_seed(2)
    x, w = torch.randn(rows, k, generator=g), torch.randn(2048, k, generator=g) / k**0.5
    b = torch.randn(2048, generator=g) if bias else None
    torch._dynamo.reset()  # one code object compiled for each of the 18 cases passes Dynamo's recompile limit
    compiled = torch.compile(cpu_linear.linear, fullgraph=True, dynamic=False)
    with torch.no_grad():
        got = compiled(x, w, b)
    assert got.shape == (rows, 2048)
    error, sgemm_error = (
        (got.double() - _truth(x, w, b)).abs(),
        (F.linear(x, w, b).double() - _truth(x, w, b)).abs(),
    )
    assert (error <= _fp32_bound(x, w, b)).all()
    assert error.pow(2).mean().sqrt() <= sgemm_error.pow(2).mean().sqrt()
