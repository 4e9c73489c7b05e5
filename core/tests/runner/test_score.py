"""Non-finite logits are an error that names the first bad position, never a result."""

from __future__ import annotations

import pytest
import torch

from trnmodels.core.errors import TrnModelsError
from trnmodels.core.runner.score import check_finite_logits, non_finite_weight


def test_the_first_non_finite_position_is_named():
    logits = torch.zeros(5, 7)
    check_finite_logits(logits)
    logits[3, 2], logits[4] = float("inf"), float("nan")
    with pytest.raises(TrnModelsError, match=r"logits at position 3 are not finite \(NaN or inf\)"):
        check_finite_logits(logits)


def test_the_error_names_the_first_weight_holding_nan_or_inf():
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))
    assert non_finite_weight(model) == ""
    with torch.no_grad():
        model[1].bias[0] = float("inf")
    with pytest.raises(
        TrnModelsError, match=r"position 0 are not finite.*\(parameter 1\.bias holds NaN or inf\)"
    ):
        check_finite_logits(torch.full((2, 3), float("nan")), model)


def test_eos_without_generation_config_comes_from_the_text_config(tmp_path):
    """A multimodal checkpoint (Gemma 4's published layout) states EOS only in ``text_config``; with no
    generation_config.json, generation must still stop there (transformers derives the same)."""
    import json

    from trnmodels.core.runner.generate import _eos_token_ids
    from trnmodels.core.testing.published import published_config

    (tmp_path / "config.json").write_text(json.dumps(published_config("gemma-4-26B-A4B")))
    assert _eos_token_ids(str(tmp_path)) == [1]
    (tmp_path / "config.json").write_text(
        json.dumps({"eos_token_id": [1, 106], "text_config": {"eos_token_id": 5}})
    )
    assert _eos_token_ids(str(tmp_path)) == [1, 106]
