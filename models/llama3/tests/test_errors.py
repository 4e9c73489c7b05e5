"""What only the Llama 3 plugin refuses.

Core's refusals (malformed or contradictory config.json, missing/unexpected/misshapen/truncated weights,
shards, token ids out of range, TP that cannot split the heads, TP against the parallel state) are
tested in core/tests/test_config_errors.py and core/tests/test_checkpoint_errors.py on the bundled tiny
Llama checkpoint; a mesh refused before any rank starts (TP that cannot split the heads, EP on this dense
model) by the conformance suite (test_conformance.py) and core/tests/cli/bad_inputs.py.
"""

from __future__ import annotations

import json

import pytest

from trnmodels.core.causal_lm import build_model
from trnmodels.core.errors import ConfigError
from trnmodels.core.runtime_config import NeuronConfig


@pytest.mark.parametrize(
    "quant", [{"quant_method": "fp8", "activation_scheme": "dynamic"}, {"quant_method": "awq", "bits": 4}]
)
def test_unsupported_quantization_is_refused(make_checkpoint, quant):
    ckpt, _ = make_checkpoint()
    path = ckpt / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "quantization_config": quant}))
    with pytest.raises(
        ConfigError, match=f"quant_method='{quant['quant_method']}' is not supported by trnmodels-llama3"
    ):
        build_model(ckpt, NeuronConfig(), load=False)
