"""rms_norm and layer_norm against transformers' norm modules, torch.nn.LayerNorm and hand computation."""

import pytest
import torch
from transformers.models.gemma.modeling_gemma import GemmaRMSNorm
from transformers.models.gemma3.modeling_gemma3 import Gemma3RMSNorm
from transformers.models.llama.modeling_llama import LlamaRMSNorm

from trnmodels.core.accuracy.three_way import assert_close_three_way
from trnmodels.core.ops import layer_norm, rms_norm, select_backend

HIDDEN = 64
EPS = 1e-6


def _inputs(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(seed)
    x = torch.randn(3, 5, HIDDEN) * 3.0
    w = 1.0 + 0.5 * torch.randn(HIDDEN)
    return x, w


def _llama_norm(w: torch.Tensor, dtype: torch.dtype) -> LlamaRMSNorm:
    m = LlamaRMSNorm(HIDDEN, eps=EPS)
    with torch.no_grad():
        m.weight.copy_(w)
    return m.to(dtype)


@torch.no_grad()
def test_rms_norm_matches_llama_fp32():
    x, w = _inputs()
    expected = _llama_norm(w, torch.float32)(x)
    torch.testing.assert_close(rms_norm(x, w, EPS), expected)


@torch.no_grad()
def test_rms_norm_matches_llama_bf16_three_way():
    x, w = _inputs(1)
    x16, w16 = x.bfloat16(), w.bfloat16()
    target = rms_norm(x16, w16, EPS)
    assert target.dtype == torch.bfloat16
    # Gold: the same (bf16-representable) values through the reference in fp32.
    expected = _llama_norm(w16.float(), torch.float32)(x16.float())
    baseline = _llama_norm(w16.float(), torch.bfloat16)(x16)
    assert baseline.dtype == torch.bfloat16
    assert_close_three_way(target, expected, baseline, name="rms_norm bf16")
    # The plain form casts before scaling, exactly as Llama does, so it rounds identically.
    assert torch.equal(target, baseline)


@pytest.mark.parametrize("gemma_cls", [GemmaRMSNorm, Gemma3RMSNorm])
@torch.no_grad()
def test_rms_norm_weight_offset_matches_gemma(gemma_cls):
    torch.manual_seed(2)
    x = torch.randn(4, HIDDEN) * 2.0
    w = 0.3 * torch.randn(HIDDEN)  # Gemma stores w; the scale is (1 + w)
    ref = gemma_cls(HIDDEN, eps=EPS)
    with torch.no_grad():
        ref.weight.copy_(w)

    torch.testing.assert_close(rms_norm(x, w, EPS, weight_offset=1.0), ref(x))
    # Without the offset the result is clearly different (guards against the offset being ignored).
    assert not torch.allclose(rms_norm(x, w, EPS), ref(x), atol=1e-3)

    # BF16: Gemma scales in fp32 and casts once; ours does the same, so the result is bit-exact.
    x16, w16 = x.bfloat16(), w.bfloat16()
    ref16 = gemma_cls(HIDDEN, eps=EPS).to(torch.bfloat16)
    ref16.weight.copy_(w16)
    target = rms_norm(x16, w16, EPS, weight_offset=1.0)
    assert target.dtype == torch.bfloat16
    assert torch.equal(target, ref16(x16))


@torch.no_grad()
def test_rms_norm_scale_free_hand_computed():
    x = torch.tensor([[3.0, 4.0], [1.0, -1.0], [0.0, 2.0]])
    eps = 1e-5
    # rms = sqrt(mean(x^2) + eps): rows have mean squares 12.5, 1 and 2.
    ms = torch.tensor([[12.5], [1.0], [2.0]])
    expected = x / torch.sqrt(ms + eps)
    out = rms_norm(x, None, eps)
    torch.testing.assert_close(out, expected, atol=1e-6, rtol=1e-6)
    # Concrete values: [3, 4] / sqrt(12.5) and [1, -1] / 1.
    torch.testing.assert_close(out[0], torch.tensor([0.8485281, 1.1313708]), atol=1e-5, rtol=0)
    torch.testing.assert_close(out[1], torch.tensor([1.0, -1.0]), atol=1e-5, rtol=0)
    # dtype is preserved
    assert rms_norm(x.bfloat16(), None, eps).dtype == torch.bfloat16


@pytest.mark.parametrize(
    ("affine", "bias"),
    [(True, True), (True, False), (False, False)],
    ids=["affine+bias", "affine-no-bias", "no-affine"],
)
@torch.no_grad()
def test_layer_norm_matches_torch(affine, bias):
    torch.manual_seed(3)
    x = torch.randn(2, 7, HIDDEN) * 2.0 + 0.5
    ref = torch.nn.LayerNorm(HIDDEN, eps=1e-5, elementwise_affine=affine, bias=bias)
    if affine:
        ref.weight.copy_(1.0 + 0.3 * torch.randn(HIDDEN))
        if bias:
            ref.bias.copy_(0.2 * torch.randn(HIDDEN))
    out = layer_norm(x, ref.weight, ref.bias, 1e-5)
    torch.testing.assert_close(out, ref(x))


@torch.no_grad()
def test_layer_norm_bf16_computes_in_fp32():
    torch.manual_seed(4)
    x = (torch.randn(5, HIDDEN) * 2.0).bfloat16()
    w, b = (1.0 + 0.3 * torch.randn(HIDDEN)).bfloat16(), (0.2 * torch.randn(HIDDEN)).bfloat16()
    out = layer_norm(x, w, b, 1e-5)
    assert out.dtype == torch.bfloat16
    expected = torch.nn.functional.layer_norm(x.float(), (HIDDEN,), w.float(), b.float(), 1e-5)
    baseline = torch.nn.functional.layer_norm(x, (HIDDEN,), w, b, 1e-5)
    assert_close_three_way(out, expected, baseline, name="layer_norm bf16")
    # One rounding of the fp32 result: within half a bf16 ulp of the gold.
    torch.testing.assert_close(out, expected.bfloat16(), atol=0, rtol=0)


@pytest.mark.parametrize("rows", [1, 8, 256])
@pytest.mark.parametrize("scale_in_float32", [False, True])
@torch.no_grad()
def test_rms_norm_cpu_kernel_matches_llama_and_the_reference_fp32(rows, scale_in_float32):
    """The CPU kernel (torch's fused ``F.rms_norm``) takes FP32 calls of the plain form: against
    transformers' LlamaRMSNorm and the reference, as close as the reference is to a float64 truth."""
    torch.manual_seed(rows)
    x = torch.randn(rows, HIDDEN) * 3.0
    w = 1.0 + 0.5 * torch.randn(HIDDEN)
    assert select_backend("rms_norm", x, w, EPS, 0.0, scale_in_float32) == "cpu"
    kernel = rms_norm(x, w, EPS, scale_in_float32=scale_in_float32)
    reference = rms_norm.reference(x, w, EPS, scale_in_float32=scale_in_float32)
    truth = rms_norm.reference(x.double(), w.double(), EPS)
    assert (kernel.double() - truth).abs().max() <= 2 * (reference.double() - truth).abs().max() + 1e-7
    torch.testing.assert_close(kernel, reference)
    torch.testing.assert_close(kernel, _llama_norm(w, torch.float32)(x))
    none = rms_norm(x, None, EPS)
    torch.testing.assert_close(none, rms_norm.reference(x, None, EPS))


@pytest.mark.parametrize(
    ("dtype", "offset"), [(torch.bfloat16, 0.0), (torch.float32, 1.0)], ids=["bf16", "gemma-offset"]
)
def test_rms_norm_cpu_kernel_leaves_bf16_and_the_offset_form_to_the_reference(dtype, offset):
    x, w = (t.to(dtype) for t in _inputs())
    assert select_backend("rms_norm", x, w, EPS, offset) == "torch"
