"""The demo's validation report: it passes on a correct port and fails on a broken one."""

from __future__ import annotations

import pytest
import torch

from trnmodels.core.modules import rotary
from trnmodels.llama3 import demo


def test_demo_report_passes(capsys):
    assert demo.main(["--tiny", "--new-tokens", "6"]) == 0
    out = capsys.readouterr().out
    assert "RESULT: PASS" in out
    assert "BF16 three-way" in out and "KV cache cosine" in out


@pytest.mark.slow  # a second demo run; test_demo_report_passes is the fast one
def test_demo_report_catches_an_off_by_one_rope(capsys, monkeypatch):
    real = rotary.cos_sin

    def shifted(inv_freq: torch.Tensor, positions: torch.Tensor, *args):
        return real(inv_freq, positions + 1, *args)

    monkeypatch.setattr(rotary, "cos_sin", shifted)
    assert demo.main(["--tiny", "--new-tokens", "6"]) == 1
    assert "RESULT: FAIL" in capsys.readouterr().out
