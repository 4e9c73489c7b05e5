"""Compiled BF16 and FP32 graphs call core's GEMM of their dtype on packed weights
(``cpu.packed_layers.pack_for_graphs``): the capture lifts each layer's ``packed_weight`` buffer, binding
packs the loaded model the same way and gives the plain weights back, and the results stay within the
dtype's rounding of a float64 truth. Graphs with the linear kernel turned off read the plain weights."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch

from trnmodels.core.accuracy.logits import hf_logits
from trnmodels.core.causal_lm import build_model
from trnmodels.core.compile import CompileTarget, compile_all, load_compiled_graphs
from trnmodels.core.compile.driver import compile_module, graph_key
from trnmodels.core.compile.load import load_compiled_module
from trnmodels.core.cpu import extension
from trnmodels.core.cpu import packed as packed_registry
from trnmodels.core.cpu.packed import packed_gemm, released
from trnmodels.core.cpu.packed_layers import PACKED_BUFFER, graphs_run_core_gemm, pack_for_graphs
from trnmodels.core.errors import InputError
from trnmodels.core.finite import non_finite_weight
from trnmodels.core.parallel.layers import (
    LINEAR_LAYERS,
    ColumnParallelLinear,
    ParallelLMHead,
    RowParallelLinear,
)
from trnmodels.core.parallel.state import destroy_parallel_state, init_parallel_state
from trnmodels.core.runner.config import RunnerConfig, SamplingParams
from trnmodels.core.runner.engine import Runner
from trnmodels.core.runner.graphs import all_graph_specs
from trnmodels.core.runtime_config import NeuronConfig
from trnmodels.core.testing.markers import needs_cpu_extension

needs_kernel = needs_cpu_extension("core's BF16 GEMM")
RUNNER = RunnerConfig(
    max_num_seqs=2,
    max_model_len=32,
    block_size=16,
    num_batched_tokens_buckets=(32,),
    num_seqs_buckets=(2,),
    context_len_buckets=(32,),
)


@pytest.fixture(autouse=True)
def one_rank():
    init_parallel_state(1)
    yield
    destroy_parallel_state()


class Projections(torch.nn.Module):
    """Two projections and an LM head, in core's layers: what a decoder step's GEMMs are."""

    def __init__(self, dtype: torch.dtype = torch.bfloat16):
        super().__init__()
        self.up = ColumnParallelLinear(64, 96, bias=True, dtype=dtype)
        self.down = RowParallelLinear(96, 48, dtype=dtype)
        self.lm_head = ParallelLMHead(100, 48, dtype=dtype)
        generator = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=generator) * 0.2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.down(torch.relu(self.up(x))))


def truth(model: Projections, x: torch.Tensor) -> torch.Tensor:
    """The same projections in float64, from the same values, rounded to ``x``'s dtype where ours rounds."""

    def linear(x, layer):
        out = x.double() @ layer.weight.double().T
        return (out if getattr(layer, "bias", None) is None else out + layer.bias.double()).to(x.dtype)

    return linear(linear(torch.relu(linear(x, model.up)), model.down), model.lm_head)


@needs_kernel
@pytest.mark.slow  # AOT compiles
@pytest.mark.parametrize(
    "dtype, rows",
    [(torch.bfloat16, 1), (torch.bfloat16, 8), (torch.float32, 1), (torch.float32, 8), (torch.float32, 40)],
)
def test_a_compiled_graph_calls_the_gemm_on_the_packed_weights(tmp_path, dtype, rows):
    traced = Projections(dtype)
    pack_for_graphs(traced, probe=False)
    x = torch.randn(rows, 64, generator=torch.Generator().manual_seed(rows)).to(dtype)
    compile_module(traced, (x,), tmp_path / "graph.pt2", "projections")

    model = Projections(dtype)
    expected = truth(model, x)
    assert pack_for_graphs(model) == 3
    graph = load_compiled_module(tmp_path / "graph.pt2", model)
    # The graph reads the packed copies, and the plain weights are given back (but the LM head's).
    names = set(graph.get_constant_fqns())
    assert {f"{n}.{PACKED_BUFFER}" for n in ("up", "down", "lm_head")} <= names
    assert not any(n.endswith(".weight") for n in names), names
    assert released(model.up.weight) and released(model.down.weight) and not released(model.lm_head.weight)
    got = graph(x)
    assert got.dtype == dtype
    scale = expected.double().abs().max().item()
    # BF16: its own rounding at each layer; FP32: sums of at most 96 products in FP32, well inside 2**-16.
    tolerance = 2**-6 if dtype == torch.bfloat16 else 2**-16
    torch.testing.assert_close(got.double(), expected.double(), rtol=tolerance, atol=tolerance * scale)


@needs_kernel
@pytest.mark.slow  # AOT compiles
def test_compiled_bf16_graphs_run_core_s_gemm_and_match_the_eager_model(llama_checkpoint, tmp_path):
    target = CompileTarget(str(llama_checkpoint), RUNNER, dtype="bfloat16")
    assert graphs_run_core_gemm(target.dtype)
    cache = str(tmp_path / "cache")
    compile_all(target, cache)
    model = build_model(str(llama_checkpoint), target.neuron_config(), progress=False)
    graphs = load_compiled_graphs(target, model, cache)
    assert len(graphs) == 2
    layers = {n: m for n, m in model.named_modules() if isinstance(m, (*LINEAR_LAYERS, ParallelLMHead))}
    for name, module in layers.items():
        assert getattr(module, PACKED_BUFFER, None) is not None and packed_gemm(module.weight) is not None, (
            name
        )
        assert released(module.weight) is not isinstance(module, ParallelLMHead), name
    assert non_finite_weight(model) == ""
    # Each greedy token of the graphs is transformers' FP32 argmax up to what BF16 itself costs there
    # (twice the largest error of transformers' BF16 logits): Inductor's fused code rounds otherwise than
    # the eager steps, so on near-ties the tokens themselves may differ.
    from transformers import AutoModelForCausalLM

    hf32 = AutoModelForCausalLM.from_pretrained(llama_checkpoint, dtype=torch.float32).eval()
    hf16 = AutoModelForCausalLM.from_pretrained(llama_checkpoint, dtype=torch.bfloat16).eval()
    prompts, params = [[3, 1, 4, 1, 5], [9, 2, 6]], SamplingParams(max_new_tokens=6, ignore_eos=True)
    for prompt, result in zip(
        prompts, Runner(model, RUNNER, graphs=graphs).generate(prompts, params), strict=True
    ):
        sequence = prompt + result.token_ids
        with torch.no_grad():
            gold, bf16 = hf_logits(hf32, sequence), hf_logits(hf16, sequence)
        slack = 2 * (bf16 - gold).abs().max().item()
        chosen = torch.tensor(result.token_ids)
        rows = torch.arange(len(prompt) - 1, len(sequence) - 1)
        shortfall = gold[rows].amax(-1) - gold[rows, chosen]
        assert (shortfall <= slack).all(), (result.token_ids, shortfall.tolist(), slack)


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_the_cache_key_says_whether_graphs_call_core_s_gemm(llama_checkpoint, monkeypatch, dtype):
    target = CompileTarget(str(llama_checkpoint), RUNNER, dtype=dtype)
    spec = all_graph_specs(RUNNER)[0]
    on = graph_key(target, spec)
    assert on[1]["compiler_flags"]["core_packed_gemm"] is (extension.why_unavailable() is None)
    monkeypatch.setattr(extension, "why_unavailable", lambda: "this CPU has neither AVX512-BF16 nor AVX2")
    off = graph_key(target, spec)
    assert off[1]["compiler_flags"]["core_packed_gemm"] is False
    assert (off[0] != on[0]) is on[1]["compiler_flags"]["core_packed_gemm"]


@pytest.mark.parametrize("dtype, kernels", [("float32", "rms_norm"), ("bfloat16", "rms_norm")])
def test_graphs_without_the_linear_kernel_read_the_plain_weights(
    llama_checkpoint, tmp_path, monkeypatch, dtype, kernels
):
    monkeypatch.setenv("TRNMODELS_CPU_KERNELS", kernels)
    assert not graphs_run_core_gemm(dtype)
    model = build_model(str(llama_checkpoint), NeuronConfig(dtype=dtype), progress=False)
    target = CompileTarget(str(llama_checkpoint), RUNNER, dtype=dtype)
    assert load_compiled_graphs(target, model, str(tmp_path)) == {}  # binding packs nothing
    for name, module in model.named_modules():
        if isinstance(module, (*LINEAR_LAYERS, ParallelLMHead)):
            assert packed_gemm(module.weight) is None and not hasattr(module, PACKED_BUFFER), name


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_a_model_packed_for_graphs_is_freed_with_its_packed_weights(dtype):
    """A compile traces a new model per graph: each must go when dropped (its packed GEMMs held it alive)."""
    gc.collect()  # models other tests dropped
    before = len(packed_registry._packed)
    model = Projections(dtype)
    assert pack_for_graphs(model) == 3 and len(packed_registry._packed) == before + 3
    gone = weakref.ref(model.up)
    del model
    gc.collect()
    assert gone() is None
    assert len(packed_registry._packed) == before


@needs_kernel
def test_a_weight_holding_nan_is_packed_for_graphs_but_kept_and_named(llama_checkpoint):
    model = build_model(str(llama_checkpoint), NeuronConfig(dtype="bfloat16"), progress=False)
    layer = model.layers[0].mlp.down_proj
    with torch.no_grad():
        layer.weight[0, 0] = float("nan")
    pack_for_graphs(model)
    assert getattr(layer, PACKED_BUFFER) is not None and not released(layer.weight)
    assert "model.layers.0.mlp.down_proj.weight holds NaN or inf" in non_finite_weight(model)


@needs_kernel
def test_a_model_packed_for_eager_runs_is_refused_by_graphs(llama_checkpoint):
    from trnmodels.core.cpu.packed_layers import pack_for_eager

    model = build_model(str(llama_checkpoint), NeuronConfig(dtype="bfloat16"), progress=False)
    pack_for_eager(model)
    with pytest.raises(
        InputError, match=r"layers\.0\..*weight: this model's weight was packed for eager runs"
    ):
        pack_for_graphs(model)
