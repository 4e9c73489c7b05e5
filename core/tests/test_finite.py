"""The NaN/inf checks: what they refuse, what they name, and the finite tensors they must let through."""

from __future__ import annotations

import pytest
import torch

from trnmodels.core.errors import InputError, NonFiniteOutputError
from trnmodels.core.finite import check_finite_input, check_finite_output, non_finite_weight


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_finite_values_whose_sum_overflows_pass(dtype):
    # 3e38 * 4 overflows the sum's float32 (and bfloat16) range: the screen trips, the confirm must not.
    big = torch.full((4,), 3e38, dtype=dtype)
    check_finite_input(big, "x")
    check_finite_output(big, "x")


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_one_bad_value_is_counted_and_named(bad):
    x = torch.zeros(2, 5)
    x[1, 3] = bad
    with pytest.raises(InputError, match=r"^decode: latents: NaN or inf in 1 of 10 values; expected finite"):
        check_finite_input(x, "decode: latents")
    model = torch.nn.Sequential(torch.nn.Linear(5, 5), torch.nn.Linear(5, 5))
    with torch.no_grad():
        model[1].bias[2] = bad
    with pytest.raises(
        NonFiniteOutputError, match=r"^step 3: NaN or inf in 1 of 10 .*parameter 1\.bias holds"
    ):
        check_finite_output(x, "step 3", model)


def test_integer_and_empty_tensors_pass_and_a_clean_model_names_no_weight():
    check_finite_input(torch.tensor([1, 2, 3]), "ids")
    check_finite_output(torch.empty(0), "nothing")
    assert non_finite_weight(torch.nn.Linear(3, 3)) == ""
