"""KV-cache validation by cosine similarity.

Logits can look fine while the cache is subtly wrong (e.g. a RoPE offset that only hurts long
contexts, or a head permutation that attention happens to tolerate on a short prompt). Comparing the
cached K and V per layer catches those early; cosine similarity is scale-free, so one threshold works
for every layer regardless of activation magnitude.

Caches are ``{layer_name: (k, v)}`` with ``k``/``v`` of shape ``[num_kv_heads, seq_len, head_dim]``
for one sequence.
"""

from __future__ import annotations

from typing import Any

import torch

KVCache = dict[str, tuple[torch.Tensor, torch.Tensor]]


def cosine_similarity(a: torch.Tensor, b: torch.Tensor) -> float:
    """Cosine of the angle between two tensors flattened to float64 vectors.

    Both zero counts as identical (1.0); exactly one zero as unrelated (0.0), instead of NaN.
    """
    if a.shape != b.shape:
        raise ValueError(f"cosine_similarity: shape mismatch {list(a.shape)} vs {list(b.shape)}")
    x = a.detach().flatten().to("cpu", torch.float64)
    y = b.detach().flatten().to("cpu", torch.float64)
    nx, ny = torch.linalg.vector_norm(x).item(), torch.linalg.vector_norm(y).item()
    if nx == 0.0 or ny == 0.0:
        return 1.0 if nx == ny else 0.0
    return max(-1.0, min(1.0, (x @ y).item() / (nx * ny)))


def kv_cache_similarity(actual: KVCache, expected: KVCache) -> dict[str, tuple[float, float]]:
    """Per layer ``(k cosine, v cosine)``, in the order of ``expected``."""
    if actual.keys() != expected.keys():
        missing = sorted(expected.keys() - actual.keys())
        extra = sorted(actual.keys() - expected.keys())
        raise ValueError(
            f"KV cache layer names differ: missing in actual {missing}, unexpected in actual {extra}"
        )
    bad = [
        f"{name}.{kind}: actual {list(a.shape)} vs expected {list(e.shape)}"
        for name in expected
        for kind, a, e in zip("kv", actual[name], expected[name], strict=True)
        if a.shape != e.shape
    ]
    if bad:
        raise ValueError("KV cache shape mismatch: " + "; ".join(bad))
    return {
        name: (cosine_similarity(actual[name][0], e_k), cosine_similarity(actual[name][1], e_v))
        for name, (e_k, e_v) in expected.items()
    }


def assert_kv_close(
    actual: KVCache, expected: KVCache, *, min_cosine: float = 0.99
) -> dict[str, tuple[float, float]]:
    """Raise AssertionError naming the worst layer if any K or V cosine is below ``min_cosine``."""
    sims = kv_cache_similarity(actual, expected)
    failing = [(c, f"{name}.{kind}") for name, kv in sims.items() for kind, c in zip("kv", kv, strict=True)]
    failing = sorted(f for f in failing if f[0] < min_cosine)
    if failing:
        worst_cos, worst = failing[0]
        raise AssertionError(
            f"KV cache mismatch: worst {worst} cosine {worst_cos:.6f} < {min_cosine}; "
            f"{len(failing)} failing: " + ", ".join(f"{n}={c:.6f}" for c, n in failing)
        )
    return sims


@torch.no_grad()
def hf_kv_cache(hf_model: Any, token_ids: list[int]) -> KVCache:
    """Run the reference once with ``use_cache=True`` and return its cache as float32 on CPU.

    In transformers 5.x ``past_key_values`` is a ``DynamicCache`` whose ``layers[i].keys`` /
    ``.values`` are ``[batch, kv_heads, seq, head_dim]``; batch is 1 here and dropped.
    """
    device = next(hf_model.parameters()).device
    input_ids = torch.tensor([token_ids], dtype=torch.long, device=device)
    cache = hf_model(input_ids=input_ids, use_cache=True).past_key_values
    return {
        f"layers.{i}": (layer.keys[0].float().cpu(), layer.values[0].float().cpu())
        for i, layer in enumerate(cache.layers)
    }
