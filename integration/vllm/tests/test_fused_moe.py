"""The bridge's swap of MoE experts for vLLM's fused CPU MoE kernel: the swapped module computes what
``ops.experts_ffn`` defines (against a float64 truth), and every case the kernel cannot run keeps core's."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from vllm.model_executor.layers.fused_moe.experts.cpu_moe import X86CPUUnquantizedExperts
from vllm_harness import MAX_TOKENS, PLUGINS, PROMPTS, run_offline

from trnmodels.core import ops
from trnmodels.core.modules import MoEExperts
from trnmodels.core.vllm.fused_moe import VllmFusedExperts, kernel_isa, swap_fused_experts, why_not_fused

E, K, H, INTER, T = 8, 2, 64, 96, 12


def random_experts(
    act: str = "swiglu_clamped", dtype=torch.bfloat16, hidden: int = H, **kwargs
) -> MoEExperts:
    torch.manual_seed(0)
    experts = MoEExperts(E, hidden, INTER, act=act, bias=True, dtype=dtype, **kwargs)
    with torch.no_grad():
        for p in experts.parameters():
            p.copy_(torch.randn(p.shape) * 0.2)
    return experts


def routed(experts: MoEExperts, tokens: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    x = torch.randn(tokens, experts.down.shape[2]).bfloat16()
    weights, chosen = ops.route(torch.randn(tokens, E).bfloat16(), K)
    return x, weights, chosen


def float64_truth(experts: MoEExperts, x, weights, chosen) -> torch.Tensor:
    combine = ops.combine_matrix(weights.double(), chosen, E)
    with ops.use_backend("torch"):
        return ops.experts_ffn(
            x.double(), experts.gate_up.double(), experts.down.double(), combine, act=experts.act,
            gate_up_bias=experts.gate_up_bias.double(), down_bias=experts.down_bias.double(),
        )  # fmt: skip


# vLLM's own unquantized experts take its AMX kernel where this says the CPU runs it.
AMX = X86CPUUnquantizedExperts._supports_current_device()


@pytest.mark.parametrize(
    "isa", ["vec", pytest.param("amx", marks=pytest.mark.skipif(not AMX, reason="no AMX tiles on this CPU"))]
)
@pytest.mark.parametrize("act", ["swiglu_clamped", "silu", "gelu_tanh", "gelu_pytorch_tanh"])
@pytest.mark.parametrize("tokens", [1, T, 80])
def test_fused_experts_match_a_float64_truth_like_cores_kernel(act, tokens, isa):
    """Decode (1 token), a batch, a prefill, on each of vLLM's kernels this CPU runs: within BF16 rounding
    of the truth, as close as core's own."""
    experts = random_experts(act)
    assert why_not_fused(experts) is None
    x, weights, chosen = routed(experts, tokens)
    truth = float64_truth(experts, x, weights, chosen)
    rank = torch.tensor(0)
    ours = experts(x, weights, chosen, rank)
    fused = VllmFusedExperts(experts, isa=isa)(x, weights, chosen, rank)
    assert fused.dtype == torch.bfloat16 and fused.shape == x.shape
    scale = truth.abs().max().item()
    torch.testing.assert_close(fused.double(), truth, rtol=2**-6, atol=2**-6 * scale)
    assert (fused.double() - truth).abs().max() <= 2 * (ours.double() - truth).abs().max() + 2**-8 * scale


def test_the_swap_picks_the_kernel_vllms_own_experts_pick_here():
    """vLLM's own unquantized experts take the AMX kernel on an x86 CPU with AMX tiles, else the vector one."""
    assert kernel_isa() == VllmFusedExperts(random_experts()).isa == ("amx" if AMX else "vec")


def test_non_finite_inputs_stay_non_finite():
    experts = random_experts()
    x, weights, chosen = routed(experts, 3)
    x[1, 0] = float("nan")
    out = VllmFusedExperts(experts)(x, weights, chosen, torch.tensor(0))
    assert not out[1].isfinite().all()
    assert out[0].isfinite().all() and out[2].isfinite().all()


@pytest.mark.parametrize(
    "build, env, reason",
    [
        (lambda: random_experts(dtype=torch.float32), {}, "not bfloat16"),
        (lambda: random_experts(alpha=1.5), {}, "not vLLM's fixed values"),
        (lambda: random_experts(hidden=48), {}, "not multiples of 32"),
        (lambda: random_experts(), {"TRNMODELS_CPU_KERNELS": "linear"}, "turned off"),
        (lambda: random_experts(), {"TRNMODELS_KERNEL_BACKEND": "torch"}, "turned off"),
    ],
)
def test_cases_the_kernel_cannot_run_keep_cores_kernel(monkeypatch, build, env, reason):
    for name, value in env.items():
        monkeypatch.setenv(name, value)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.experts = build()

    model = nn.Sequential(Block())
    swapped, reasons = swap_fused_experts(model)
    assert swapped == 0 and isinstance(model[0].experts, MoEExperts)
    assert len(reasons) == 1 and reasons[0].startswith("0.experts: ") and reason in reasons[0], reasons


def test_swap_replaces_each_runnable_module_and_drops_the_unpacked_weights():
    model = nn.ModuleDict({"a": random_experts(), "b": random_experts("silu")})
    x, weights, chosen = routed(model["a"], 4)
    expected = VllmFusedExperts(model["a"])(x, weights, chosen, torch.tensor(0))
    assert swap_fused_experts(model) == (2, [])
    assert all(isinstance(m, VllmFusedExperts) for m in model.values())
    # No parameter is left: vLLM checks each one left after loading against the checkpoint's names.
    assert not list(model.parameters())
    torch.testing.assert_close(model["a"](x, weights, chosen, torch.tensor(0)), expected, rtol=0, atol=0)


@pytest.mark.skipif("gpt_oss" not in PLUGINS, reason="the gpt_oss plugin is not installed")
def test_bf16_server_runs_the_tiny_gpt_oss_experts_on_the_fused_kernel(tmp_path):
    """Served in BF16, both MoE layers are swapped after loading and vLLM accepts the swapped model;
    in FP32 (the other tests' dtype) core's kernel stays and the log says why."""
    checkpoint = PLUGINS["gpt_oss"].build(tmp_path / "tiny")
    bf16 = run_offline(checkpoint, tmp_path, dtype="bfloat16")
    assert "trnmodels: 2 MoE layers run vLLM's fused CPU MoE kernel" in bf16["log"]
    assert [len(o["token_ids"]) for o in bf16["completions"]] == [MAX_TOKENS] * len(PROMPTS)
    fp32 = run_offline(checkpoint, tmp_path)
    assert "trnmodels: 0 MoE layers run vLLM's fused CPU MoE kernel; core's kernel for " in fp32["log"]
    assert "weights are torch.float32 on cpu, not bfloat16" in fp32["log"]
