"""gated_mlp against transformers' Llama/Gemma MLPs; clamped_swiglu against gpt-oss and hand values."""

import math
from types import SimpleNamespace

import pytest
import torch
from transformers import GemmaConfig, LlamaConfig
from transformers.models.gemma.modeling_gemma import GemmaMLP
from transformers.models.gpt_oss.modeling_gpt_oss import GptOssExperts
from transformers.models.llama.modeling_llama import LlamaMLP

from trnmodels.core.accuracy.three_way import assert_close_three_way
from trnmodels.core.ops import clamped_swiglu, gated_mlp, gelu_tanh, select_backend, use_backend

HIDDEN, INTER = 32, 48


def _llama_mlp(act: str = "silu", bias: bool = False, seed: int = 0) -> LlamaMLP:
    torch.manual_seed(seed)
    cfg = LlamaConfig(hidden_size=HIDDEN, intermediate_size=INTER, hidden_act=act, mlp_bias=bias)
    mlp = LlamaMLP(cfg)
    with torch.no_grad():
        for p in mlp.parameters():
            p.copy_(torch.randn_like(p) * 0.2)
    return mlp.eval()


def _ours(mlp, x, act="silu"):
    gate_up = torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight])
    gate_up_bias = None
    if mlp.gate_proj.bias is not None:
        gate_up_bias = torch.cat([mlp.gate_proj.bias, mlp.up_proj.bias])
    down_bias = mlp.down_proj.bias
    return gated_mlp(x, gate_up, mlp.down_proj.weight, act, gate_up_bias, down_bias)


@pytest.mark.parametrize("bias", [False, True], ids=["no-bias", "bias"])
@pytest.mark.parametrize("act", ["silu", "gelu_pytorch_tanh"])
@torch.no_grad()
def test_gated_mlp_matches_llama_fp32(act, bias):
    mlp = _llama_mlp(act, bias)
    x = torch.randn(2, 5, HIDDEN)
    out = _ours(mlp, x, act)
    assert out.shape == x.shape
    torch.testing.assert_close(out, mlp(x))


@torch.no_grad()
def test_gated_mlp_activation_matters():
    """SiLU and GELU-tanh give different results on the same weights (the name is not ignored)."""
    mlp = _llama_mlp("silu")
    x = torch.randn(4, HIDDEN)
    assert not torch.allclose(_ours(mlp, x, "silu"), _ours(mlp, x, "gelu_pytorch_tanh"), atol=1e-4)


@pytest.mark.parametrize("act", ["gelu_pytorch_tanh", "gelu_tanh"])
@torch.no_grad()
def test_gated_mlp_matches_gemma(act):
    torch.manual_seed(1)
    cfg = GemmaConfig(hidden_size=HIDDEN, intermediate_size=INTER, hidden_act="gelu_pytorch_tanh")
    mlp = GemmaMLP(cfg).eval()
    for p in mlp.parameters():
        p.copy_(torch.randn_like(p) * 0.2)
    x = torch.randn(6, HIDDEN)
    torch.testing.assert_close(_ours(mlp, x, act), mlp(x))


@pytest.mark.parametrize("act", ["silu", "gelu_pytorch_tanh"])
@torch.no_grad()
def test_gated_mlp_bf16_three_way(act):
    mlp = _llama_mlp(act, seed=2)
    mlp16 = _llama_mlp(act, seed=2).to(torch.bfloat16)
    # The fp32 gold uses the bf16-rounded weights and inputs, so only arithmetic differs.
    mlp.load_state_dict({k: v.float() for k, v in mlp16.state_dict().items()})
    x16 = torch.randn(3, 7, HIDDEN).bfloat16()
    target = _ours(mlp16, x16, act)
    assert target.dtype == torch.bfloat16
    assert_close_three_way(target, mlp(x16.float()), mlp16(x16), name=f"gated_mlp {act} bf16")


def test_unknown_activation_raises():
    mlp = _llama_mlp()
    with pytest.raises(ValueError, match="relu_squared"):
        _ours(mlp, torch.randn(2, HIDDEN), "relu_squared")


# --------------------------------------------------------------------------------------------------
# clamped_swiglu (gpt-oss)
# --------------------------------------------------------------------------------------------------


def _hand_swiglu(g: float, u: float, alpha: float = 1.702, limit: float = 7.0) -> float:
    g = min(g, limit)
    u = max(-limit, min(u, limit))
    return (u + 1.0) * g / (1.0 + math.exp(-alpha * g))


@pytest.mark.parametrize(
    ("g", "u"),
    [(0.0, 0.0), (1.0, 2.0), (-3.0, 0.5), (7.0, 7.0), (10.0, 3.0), (2.0, 12.0), (1.5, -9.0), (-20.0, -20.0)],
)
def test_clamped_swiglu_hand_values(g, u):
    out = clamped_swiglu(torch.tensor([g], dtype=torch.float64), torch.tensor([u], dtype=torch.float64))
    assert out.item() == pytest.approx(_hand_swiglu(g, u), rel=1e-12, abs=1e-12)


def test_clamped_swiglu_clamps():
    # Beyond +limit, gate and up saturate: same as at the limit.
    big = clamped_swiglu(torch.tensor([100.0]), torch.tensor([100.0]))
    at_limit = clamped_swiglu(torch.tensor([7.0]), torch.tensor([7.0]))
    assert torch.equal(big, at_limit)
    # up below -limit saturates at -limit: (−7 + 1) * silu-ish(g)
    low = clamped_swiglu(torch.tensor([1.0]), torch.tensor([-100.0]))
    assert low.item() == pytest.approx(-6.0 / (1.0 + math.exp(-1.702)), rel=1e-6)
    # gate is not clamped below: a very negative gate drives the output to ~0 rather than to a clamp value.
    assert abs(clamped_swiglu(torch.tensor([-100.0]), torch.tensor([1.0])).item()) < 1e-6
    # Custom alpha / limit are honoured.
    out = clamped_swiglu(torch.tensor([3.0]), torch.tensor([3.0]), alpha=1.0, limit=2.0)
    assert out.item() == pytest.approx(_hand_swiglu(3.0, 3.0, alpha=1.0, limit=2.0), rel=1e-6)


@torch.no_grad()
def test_clamped_swiglu_matches_gpt_oss_experts():
    torch.manual_seed(3)
    gate_up = torch.randn(5, 2 * 16) * 6.0  # wide enough to cross ±limit
    assert (gate_up.abs() > 7.0).any()
    fake_experts = SimpleNamespace(alpha=1.702, limit=7.0)
    ref = GptOssExperts._apply_gate(fake_experts, gate_up)
    # gpt-oss interleaves gate/up columns; ours takes them split.
    out = clamped_swiglu(gate_up[..., ::2], gate_up[..., 1::2], alpha=1.702, limit=7.0)
    torch.testing.assert_close(out, ref)


# --------------------------------------------------------------------------------------------------
# gelu_tanh and its CPU kernel (x σ(2u) for FP32 calls)
# --------------------------------------------------------------------------------------------------


def _hand_gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    """The tanh approximation as written: ``0.5 x (1 + tanh(√(2/π) (x + 0.044715 x³)))``."""
    return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))


@pytest.mark.parametrize("shape", [(1, 48), (8, 2048), (320, 2048)])
@torch.no_grad()
def test_gelu_tanh_cpu_kernel_matches_a_float64_truth_as_closely_as_the_reference(shape):
    torch.manual_seed(shape[0])
    x = torch.randn(shape) * 4.0
    assert select_backend("gelu_tanh", x) == "cpu"
    kernel, reference = gelu_tanh(x), gelu_tanh.reference(x)
    truth = _hand_gelu_tanh(x.double())
    # FP32 spacing at the largest |x| (about 20): 2 ulps of it bound both.
    bound = 2 * torch.finfo(torch.float32).eps * x.abs().max().item()
    assert (kernel.double() - truth).abs().max() <= bound
    assert (reference.double() - truth).abs().max() <= bound
    with use_backend("torch"):
        torch.testing.assert_close(gelu_tanh(x), reference, rtol=0, atol=0)


def test_gelu_tanh_cpu_kernel_keeps_non_finite_values_as_the_reference_does():
    x = torch.tensor([float("-inf"), float("inf"), float("nan"), -20.0, -1e-30, 0.0, 1e-30, 3e38, -3e38])
    torch.testing.assert_close(gelu_tanh(x), gelu_tanh.reference(x), equal_nan=True, rtol=0, atol=0)


@torch.no_grad()
def test_gelu_tanh_bf16_stays_on_the_reference_three_way():
    torch.manual_seed(0)
    x = torch.randn(8, 64) * 3.0
    assert select_backend("gelu_tanh", x.bfloat16()) == "torch"
    expected = _hand_gelu_tanh(x.bfloat16().double()).float()
    assert_close_three_way(
        gelu_tanh(x.bfloat16()), expected, gelu_tanh(x.bfloat16().float()).bfloat16(), name="gelu_tanh bf16"
    )


@torch.no_grad()
def test_gelu_tanh_cpu_kernel_is_taken_into_cpu_graphs():
    """It is static: torch.export's CPU graph runs it (a sigmoid, no tanh) and agrees with eager."""
    x = torch.randn(4, 32) * 4.0

    class Act(torch.nn.Module):
        def forward(self, x):
            return gelu_tanh(x)

    graph = torch.export.export(Act(), (x,)).graph_module
    targets = {str(n.target) for n in graph.graph.nodes if n.op == "call_function"}
    assert any("sigmoid" in t for t in targets) and not any("tanh" in t or "gelu" in t for t in targets)
    torch.testing.assert_close(graph(x)[0], gelu_tanh(x), rtol=0, atol=0)
