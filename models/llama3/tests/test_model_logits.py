"""The public `trnmodels logits` command against HF LlamaForCausalLM. Logits over the named and random
configs at TP=1 and TP=2 are core's conformance suite (test_conformance.py)."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from trnmodels.core.accuracy import hf_logits
from trnmodels.core.testing import run_cli

from .conftest import LLAMA3_ROPE

FP32_ATOL = 1e-4


@pytest.mark.slow  # a CLI process that starts two ranks
def test_cli_logits_tp2_matches_hf(make_checkpoint, tmp_path):
    """The public command: `trnmodels logits ... --tp 2 --out F` writes [T, vocab] float32 logits."""
    ckpt, hf = make_checkpoint(seed=7, num_key_value_heads=1, vocab_size=101, rope_parameters=LLAMA3_ROPE)
    ids = [5, 17, 3, 99, 42, 8, 0, 100, 64, 23, 11]
    out = tmp_path / "logits.safetensors"
    token_ids = ",".join(map(str, ids))
    done = run_cli(
        "logits", str(ckpt), "--token-ids", token_ids, "--prefill-len", "4", "--tp", "2", "--out", str(out)
    )
    assert done.returncode == 0, done.stderr
    logits = load_file(out)["logits"]
    assert logits.dtype == torch.float32 and logits.shape == (len(ids), 101)
    assert (logits - hf_logits(hf, ids)).abs().max() <= FP32_ATOL
