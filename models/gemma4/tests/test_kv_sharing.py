"""KV sharing: the last layers read an earlier layer's cache and own none (their parity with HF is the
conformance suite's, over the bundled tiny config)."""

from __future__ import annotations

from trnmodels.core.causal_lm import build_model
from trnmodels.core.runtime_config import NeuronConfig

from .conftest import PLE_KV_SHARED


def test_kv_shared_layers_own_no_cache(make_checkpoint):
    ckpt, _ = make_checkpoint(**PLE_KV_SHARED)
    model = build_model(ckpt, NeuronConfig(), load=False)
    spec = model.get_kv_spec()
    # Layers 2-4 read layers 0 (sliding) and 1 (full); sliding and full caches differ in head size.
    assert [(s.name, s.num_kv_heads, s.head_dim, s.sliding_window) for s in spec.layers] == [
        ("layers.0.self_attn", 2, 16, 8),
        ("layers.1.self_attn", 2, 32, None),
    ]
    assert model.layers[3].self_attn.attn.kv_sharing_target_layer_name == "layers.0.self_attn"
    assert model.layers[4].self_attn.attn.kv_sharing_target_layer_name == "layers.1.self_attn"
