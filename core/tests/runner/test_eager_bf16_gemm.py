"""The runner's eager BF16 models, and those with no compiled graph yet, run core's BF16 GEMM
(``cpu.packed_layers``, ``compile.runner_graphs``): their logits stay within what BF16 itself costs
transformers (three-way against its FP32 and BF16 runs), the plain weights are given back, a compiled
graph is never bound to them (a model with graphs is packed as the graphs read it:
``test_compiled_bf16_gemm.py``), and a model that cannot be packed (FP32, no kernel, the linear kernel
turned off) runs as before."""

from __future__ import annotations

import logging

import pytest
import torch

from trnmodels.core.accuracy.logits import hf_logits
from trnmodels.core.accuracy.three_way import assert_close_three_way
from trnmodels.core.causal_lm import build_model
from trnmodels.core.compile import CompileTarget, load_compiled_graphs, runner_graphs
from trnmodels.core.cpu import extension, packed_layers
from trnmodels.core.cpu.packed import packed_gemm, released
from trnmodels.core.errors import InputError
from trnmodels.core.finite import non_finite_weight
from trnmodels.core.parallel.layers import LINEAR_LAYERS, ParallelLMHead
from trnmodels.core.parallel.state import destroy_parallel_state, init_parallel_state
from trnmodels.core.runner.config import RunnerConfig
from trnmodels.core.runner.score import teacher_forced_logits
from trnmodels.core.runtime_config import NeuronConfig
from trnmodels.core.testing.markers import needs_cpu_extension

needs_kernel = needs_cpu_extension("core's BF16 GEMM")
RUNNER = RunnerConfig(max_num_seqs=2, max_model_len=64, block_size=16)


@pytest.fixture(autouse=True)
def one_rank():
    init_parallel_state(1)
    yield
    destroy_parallel_state()


def linear_modules(model: torch.nn.Module) -> dict[str, torch.nn.Module]:
    return {n: m for n, m in model.named_modules() if isinstance(m, (*LINEAR_LAYERS, ParallelLMHead))}


def tokens(checkpoint) -> list[int]:
    import json

    vocab = json.loads((checkpoint / "config.json").read_text())["vocab_size"]
    return torch.randint(0, vocab, (20,), generator=torch.Generator().manual_seed(1)).tolist()


@needs_kernel
def test_an_eager_bf16_model_runs_core_s_gemm_within_bf16_s_own_error(llama_checkpoint, caplog):
    from transformers import AutoModelForCausalLM

    model = build_model(str(llama_checkpoint), NeuronConfig(dtype="bfloat16"), progress=False)
    target = CompileTarget(str(llama_checkpoint), RUNNER, dtype="bfloat16")
    with caplog.at_level(logging.INFO, logger=packed_layers.__name__):
        assert runner_graphs(target, model, eager=True) == {}
    layers = linear_modules(model)
    assert f"{len(layers)} linear layers run core's BF16 GEMM" in caplog.text
    for name, module in layers.items():
        assert packed_gemm(module.weight) is not None, name
        # The LM head's weight is kept (a tied embedding may read it); the others are given back.
        assert released(module.weight) is not isinstance(module, ParallelLMHead), name
    assert non_finite_weight(model) == ""  # a released weight's NaN is not a bad weight

    ids = tokens(llama_checkpoint)
    # A prefill of 8 rows, then one row a step: both of the kernel's row paths.
    ours = teacher_forced_logits(model, ids, prefill_len=8)
    hf32 = AutoModelForCausalLM.from_pretrained(llama_checkpoint, dtype=torch.float32).eval()
    hf16 = AutoModelForCausalLM.from_pretrained(llama_checkpoint, dtype=torch.bfloat16).eval()
    with torch.no_grad():
        assert_close_three_way(ours, hf_logits(hf32, ids), hf_logits(hf16, ids), name="eager bf16 logits")


@needs_kernel
def test_a_model_with_no_compiled_graph_is_packed_for_eager_runs_and_one_with_graphs_for_them(
    llama_checkpoint, tmp_path
):
    from trnmodels.core.compile import compile_all
    from trnmodels.core.runner.graphs import DECODE, GraphSpec

    target = CompileTarget(str(llama_checkpoint), RUNNER, dtype="bfloat16")
    model = build_model(str(llama_checkpoint), NeuronConfig(dtype="bfloat16"), progress=False)
    assert runner_graphs(target, model, str(tmp_path / "empty")) == {}  # nothing compiled: all eager
    assert all(packed_gemm(m.weight) is not None for m in linear_modules(model).values())

    compile_all(target, str(tmp_path / "cache"), specs=[GraphSpec(DECODE, (1, RUNNER.max_model_len))])
    model = build_model(str(llama_checkpoint), NeuronConfig(dtype="bfloat16"), progress=False)
    assert len(runner_graphs(target, model, str(tmp_path / "cache"))) == 1
    # The graph reads each layer's packed copy (``test_compiled_bf16_gemm.py``), and so do the eager steps.
    for name, module in linear_modules(model).items():
        assert getattr(module, packed_layers.PACKED_BUFFER) is not None, name
        assert packed_gemm(module.weight) is not None, name


@needs_kernel
def test_compiled_graphs_are_never_bound_to_released_weights(llama_checkpoint, tmp_path):
    model = build_model(str(llama_checkpoint), NeuronConfig(dtype="bfloat16"), progress=False)
    target = CompileTarget(str(llama_checkpoint), RUNNER, dtype="bfloat16")
    runner_graphs(target, model, eager=True)
    with pytest.raises(
        InputError, match=r"layers\.0\..*weight: this model's weight was packed for eager runs"
    ):
        load_compiled_graphs(target, model, str(tmp_path))


def test_an_fp32_model_is_left_alone_and_nothing_is_built(llama_checkpoint, monkeypatch, caplog):
    def no_build() -> str:
        raise AssertionError("the kernel was asked for, with no BF16 weight")

    monkeypatch.setattr(extension, "why_unavailable", no_build)
    model = build_model(str(llama_checkpoint), NeuronConfig(), progress=False)
    before = {n: m.weight.detach().clone() for n, m in linear_modules(model).items()}
    with caplog.at_level(logging.INFO, logger=packed_layers.__name__):
        assert packed_layers.pack_for_eager(model) == 0
    assert caplog.text == ""
    for name, module in linear_modules(model).items():
        assert packed_gemm(module.weight) is None and torch.equal(module.weight, before[name]), name


@pytest.mark.parametrize("why", ["kernel", "switch"])
def test_a_bf16_model_core_s_gemm_cannot_take_runs_f_linear_and_says_why(
    llama_checkpoint, monkeypatch, caplog, why
):
    if why == "kernel":
        monkeypatch.setattr(extension, "why_unavailable", lambda: "this CPU has no AVX512-BF16")
        reason = "core's BF16 GEMM cannot run: this CPU has no AVX512-BF16"
    else:
        monkeypatch.setenv("TRNMODELS_CPU_KERNELS", "rms_norm")
        reason = "the linear CPU kernel is turned off"
    model = build_model(str(llama_checkpoint), NeuronConfig(dtype="bfloat16"), progress=False)
    with caplog.at_level(logging.INFO, logger=packed_layers.__name__):
        assert packed_layers.pack_for_eager(model) == 0
    assert "the linear layers run F.linear, not core's BF16 GEMM" in caplog.text and reason in caplog.text
    assert all(packed_gemm(m.weight) is None for m in linear_modules(model).values())
    assert torch.isfinite(teacher_forced_logits(model, tokens(llama_checkpoint), prefill_len=8)).all()


@needs_kernel
def test_a_weight_holding_nan_is_not_packed_and_is_named(llama_checkpoint):
    model = build_model(str(llama_checkpoint), NeuronConfig(dtype="bfloat16"), progress=False)
    name, module = next(iter(linear_modules(model).items()))
    with torch.no_grad():
        module.weight[0, 0] = float("nan")
    packed, reasons = packed_layers.pack_linear_layers(model)
    assert packed == len(linear_modules(model)) - 1
    assert any(r.startswith(f"{name}: core's BF16 GEMM is nan from F.linear") for r in reasons), reasons
    named = non_finite_weight(model)  # by its checkpoint keys: q, k and v, fused into one weight here
    assert "model.layers.0.self_attn.q_proj.weight" in named and named.endswith("holds NaN or inf)"), named
