import math

import pytest
import torch

from trnmodels.core.accuracy import assert_kv_close, cosine_similarity, hf_kv_cache, kv_cache_similarity

TOKENS = [1, 5, 7, 11, 42, 3, 88, 19, 60, 2, 14, 33]


def test_cosine_hand_values():
    assert cosine_similarity(torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0])) == 0.0
    t = torch.tensor
    assert cosine_similarity(t([1.0, 1.0]), t([3.0, 0.0])) == pytest.approx(1 / math.sqrt(2))
    assert cosine_similarity(t([1.0, 2.0, 3.0]), t([-2.0, -4.0, -6.0])) == pytest.approx(-1.0)
    a = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    assert cosine_similarity(a, 5 * a.bfloat16()) == pytest.approx(1.0)
    assert cosine_similarity(torch.zeros(3), torch.zeros(3)) == 1.0
    assert cosine_similarity(torch.zeros(3), torch.ones(3)) == 0.0
    with pytest.raises(ValueError, match="shape mismatch"):
        cosine_similarity(torch.zeros(3), torch.zeros(4))


def test_hf_kv_cache_shapes_and_self_similarity(tiny_llama):
    kv = hf_kv_cache(tiny_llama, TOKENS)
    assert list(kv) == ["layers.0", "layers.1"]
    for k, v in kv.values():
        assert k.shape == v.shape == (2, len(TOKENS), 8) and k.dtype == torch.float32
    sims = assert_kv_close(kv, hf_kv_cache(tiny_llama, TOKENS), min_cosine=0.999999)
    assert all(c == pytest.approx(1.0) for kv_pair in sims.values() for c in kv_pair)


def test_hf_kv_cache_is_causal_prefix(tiny_llama):
    # The cache of a prefix is the prefix of the cache: checks that dim 1 really is the sequence.
    full, prefix = hf_kv_cache(tiny_llama, TOKENS), hf_kv_cache(tiny_llama, TOKENS[:5])
    for name, (k, v) in prefix.items():
        torch.testing.assert_close(k, full[name][0][:, :5])
        torch.testing.assert_close(v, full[name][1][:, :5])


def test_perturbed_copy_lowers_similarity(tiny_llama):
    expected = hf_kv_cache(tiny_llama, TOKENS)
    actual = {name: (k.clone(), v.clone()) for name, (k, v) in expected.items()}
    k1 = actual["layers.1"][0]
    k1 += 0.5 * k1.std() * torch.randn(k1.shape, generator=torch.Generator().manual_seed(0))
    sims = kv_cache_similarity(actual, expected)
    assert sims["layers.0"] == pytest.approx((1.0, 1.0))
    assert sims["layers.1"][0] < 0.99 and sims["layers.1"][1] == pytest.approx(1.0)
    with pytest.raises(AssertionError, match=r"worst layers\.1\.k cosine"):
        assert_kv_close(actual, expected)


def test_name_and_shape_mismatch():
    kv = {"layers.0": (torch.ones(2, 3, 4), torch.ones(2, 3, 4))}
    names = r"missing in actual \['layers\.1'\].*unexpected in actual \['layer1'\]"
    with pytest.raises(ValueError, match=names):
        kv_cache_similarity({**kv, "layer1": kv["layers.0"]}, {**kv, "layers.1": kv["layers.0"]})
    with pytest.raises(ValueError, match=r"layers\.0\.v: actual \[2, 4, 4\] vs expected \[2, 3, 4\]"):
        kv_cache_similarity({"layers.0": (torch.ones(2, 3, 4), torch.ones(2, 4, 4))}, kv)
