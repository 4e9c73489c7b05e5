"""``cpu.fp32_gemm``: core's FP32 GEMM on packed weights against a float64 truth, element by element within
the error bound of an FP32 sum (K * 2**-24 of sum |x w|), at every row count the kernel splits differently
(pairs of rows up to 8, tiles of 6 rows beyond, so last blocks of 1 to 5) and at edges (a last panel of
fewer than 32 or 16 columns, any K, a K deeper than one GEMM block of 256); non-finite inputs reach the
result; a mismatched input is refused by name; the op traces."""

from __future__ import annotations

import pytest
import torch

from trnmodels.core.cpu import fp32_gemm
from trnmodels.core.testing.markers import needs_cpu_extension

pytestmark = needs_cpu_extension("core's FP32 GEMM")


def assert_within_fp32_sum_error(got: torch.Tensor, x: torch.Tensor, weight: torch.Tensor) -> None:
    truth = x.double() @ weight.double().T
    # A sum of K products in FP32, in any order, is within K * 2**-24 of sum |x w| of the exact one (each
    # product and each addition rounds by at most 2**-24 relative); the result then rounds once more.
    bound = weight.shape[1] * 2**-24 * (x.double().abs() @ weight.double().abs().T) + 2**-24 * truth.abs()
    assert got.dtype == torch.float32 and got.shape == truth.shape and got.is_contiguous()
    excess = (got.double() - truth).abs() - bound
    assert excess.max() <= 0, (
        f"{int((excess > 0).sum())} elements beyond FP32 sum error, worst by {excess.max():.3g}"
    )


@pytest.mark.parametrize("n, k", [(96, 64), (100, 77), (33, 600), (1, 5), (40, 1), (47, 257)])
@pytest.mark.parametrize("rows", [1, 2, 3, 8, 9, 14, 71])
def test_matches_a_float64_truth_within_fp32_sum_error(n, k, rows):
    gen = torch.Generator().manual_seed(n * 1000 + k * 10 + rows)
    weight = torch.randn(n, k, generator=gen)
    x = torch.randn(rows, k, generator=gen)
    got = fp32_gemm.gemm(x, fp32_gemm.pack(weight), n)
    assert_within_fp32_sum_error(got, x, weight)
    # Far tighter than the bound in practice: as close as MKL's SGEMM is.
    truth = x.double() @ weight.double().T
    sgemm = (torch.nn.functional.linear(x, weight).double() - truth).abs().max().item()
    assert (got.double() - truth).abs().max().item() <= 8 * sgemm + 2**-20


def test_leading_dimensions_and_a_strided_input():
    gen = torch.Generator().manual_seed(1)
    weight = torch.randn(64, 48, generator=gen)
    x = torch.randn(2, 3, 96, generator=gen)[..., ::2]  # not contiguous
    got = fp32_gemm.gemm(x, fp32_gemm.pack(weight), 64)
    assert got.shape == (2, 3, 64)
    assert_within_fp32_sum_error(got.reshape(6, 64), x.reshape(6, 48), weight)
    assert fp32_gemm.gemm(x[:0], fp32_gemm.pack(weight), 64).shape == (0, 3, 64)


def test_the_pack_is_zero_padded_panels_of_32_columns():
    weight = torch.arange(1, 35 * 3 + 1, dtype=torch.float32).reshape(35, 3)
    packed = fp32_gemm.pack(weight)
    assert packed.shape == (2, 3, 32)
    # packed[p][k][c] == weight[32 p + c][k], zero past the weight's last row.
    assert torch.equal(packed[0, :, 5], weight[5])
    assert torch.equal(packed[1, :, 2], weight[34])
    assert packed[1, :, 3:].abs().sum() == 0


@pytest.mark.parametrize("rows", [2, 30])  # a pair of rows through a panel, and GEMM tiles
def test_non_finite_inputs_are_not_hidden(rows):
    weight = torch.ones(40, 6)
    weight[33, 4] = float("nan")
    x = torch.ones(rows, 6)
    x[1, 0] = float("inf")
    got = fp32_gemm.gemm(x, fp32_gemm.pack(weight), 40)
    assert got[:, 33].isnan().all() and got[1, 0].isinf()
    assert torch.equal(got[0, :33], torch.full((33,), 6.0))


def test_a_mismatched_input_is_refused():
    packed = fp32_gemm.pack(torch.ones(40, 6))
    with pytest.raises(RuntimeError, match="x has 8 columns, the packed weight 6"):
        fp32_gemm.gemm(torch.ones(1, 8), packed, 40)
    with pytest.raises(RuntimeError, match="x must be a CPU float32 tensor"):
        fp32_gemm.gemm(torch.ones(1, 6).bfloat16(), packed, 40)
    with pytest.raises(RuntimeError, match="n = 80 does not fit 2 panels"):
        fp32_gemm.gemm(torch.ones(1, 6), packed, 80)
    with pytest.raises(RuntimeError, match="expected a 2-D CPU float32 weight"):
        fp32_gemm.pack(torch.ones(40, 6).bfloat16())


def test_torch_compile_traces_the_op():
    gen = torch.Generator().manual_seed(2)
    weight = torch.randn(70, 64, generator=gen)
    packed = fp32_gemm.pack(weight)
    compiled = torch.compile(lambda x: fp32_gemm.gemm(x, packed, 70) * 2, dynamic=True, fullgraph=True)
    for rows in (3, 11):
        x = torch.randn(rows, 64, generator=gen)
        assert torch.equal(compiled(x), fp32_gemm.gemm(x, packed, 70) * 2)
