"""Kernel dispatch: the torch path without the Neuron SDK, and the NKI branch with the SDK faked."""

import warnings

import pytest
import torch

import trnmodels.core.ops as ops
from trnmodels.core import neuron
from trnmodels.core.cpu import linear as cpu_linear
from trnmodels.core.errors import BackendUnavailableError, ConfigError
from trnmodels.core.ops import dispatch, norm
from trnmodels.core.ops.dispatch import (
    CPU_KERNELS_ENV_VAR,
    ENV_VAR,
    cpu_kernels_enabled,
    current_backend,
    kernel_op,
    register_cpu,
    register_nki,
    select_backend,
    use_backend,
)

EPS = 1e-6
_REAL_SDK_AVAILABLE = neuron.sdk_available
_REAL_IS_NEURON_TENSOR = neuron.is_neuron_tensor

# Tests of the SDK-less behaviour are meaningless where the Neuron SDK really imports.
no_sdk = pytest.mark.skipif(neuron.sdk_available(), reason="the Neuron SDK imports on this host")


@pytest.fixture(autouse=True)
def _clean_backend(monkeypatch):
    monkeypatch.delenv(ENV_VAR, raising=False)
    monkeypatch.delenv(CPU_KERNELS_ENV_VAR, raising=False)
    assert dispatch._forced is None


def _hand_rms_norm(x, w):
    return w * x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + EPS)


def _inputs():
    torch.manual_seed(0)
    return torch.randn(3, 8), torch.rand(8) + 0.5


# --------------------------------------------------------------------------------------------------
# No Neuron SDK on this host
# --------------------------------------------------------------------------------------------------


def test_cpu_tensors_are_not_neuron_tensors():
    assert not neuron.is_neuron_tensor(torch.zeros(1))
    assert not neuron.is_neuron_tensor("not a tensor")


def test_auto_selects_the_cpu_kernel_where_it_runs_else_torch():
    x, w = _inputs()
    assert current_backend() == "auto"
    assert select_backend("rms_norm", x, w, EPS) == "cpu"  # FP32, the plain form
    torch.testing.assert_close(ops.rms_norm(x, w, EPS), _hand_rms_norm(x, w))
    assert select_backend("rms_norm", x, w - 1.0, EPS, 1.0) == "torch"  # the Gemma form: no CPU kernel
    torch.testing.assert_close(ops.rms_norm(x, w - 1.0, EPS, 1.0), _hand_rms_norm(x, w))
    assert select_backend("layer_norm", x, None, None, EPS) == "torch"


def test_env_var_torch(monkeypatch):
    monkeypatch.setenv(ENV_VAR, "torch")
    x, w = _inputs()
    assert current_backend() == "torch"
    assert select_backend("rms_norm", x, w, EPS) == "torch"
    torch.testing.assert_close(ops.rms_norm(x, w, EPS), _hand_rms_norm(x, w))


def test_use_backend_torch_is_scoped():
    x, w = _inputs()
    with use_backend("torch"):
        assert current_backend() == "torch"
        torch.testing.assert_close(ops.rms_norm(x, w, EPS), _hand_rms_norm(x, w))
        with use_backend("auto"):
            assert current_backend() == "auto"
        assert current_backend() == "torch"
    assert current_backend() == "auto"


def test_use_backend_restores_after_exception():
    with pytest.raises(RuntimeError), use_backend("torch"):
        raise RuntimeError("boom")
    assert current_backend() == "auto"


def test_use_backend_overrides_env_var(monkeypatch):
    monkeypatch.setenv(ENV_VAR, "nki")
    with use_backend("torch"):
        assert select_backend("rms_norm", torch.zeros(2)) == "torch"


@no_sdk
def test_forced_nki_via_env_raises_naming_op(monkeypatch):
    monkeypatch.setenv(ENV_VAR, "nki")
    x, w = _inputs()
    with pytest.raises(BackendUnavailableError, match=r"rms_norm.*SDK"):
        ops.rms_norm(x, w, EPS)


@no_sdk
@pytest.mark.parametrize("op", ["rms_norm", "gated_mlp", "layer_norm"])
def test_forced_nki_via_use_backend_raises_naming_op(op):
    with use_backend("nki"), pytest.raises(BackendUnavailableError, match=op):
        select_backend(op, torch.zeros(2))


@no_sdk
def test_forced_nki_on_a_real_op_call_raises():
    x = torch.randn(2, 3, 8)
    w = torch.randn(16, 8)
    d = torch.randn(8, 8)
    with use_backend("nki"), pytest.raises(BackendUnavailableError, match="gated_mlp"):
        ops.gated_mlp(x, w, d)


def test_invalid_backend_name_raises(monkeypatch):
    with pytest.raises(ConfigError, match="cuda"), use_backend("cuda"):
        pass
    monkeypatch.setenv(ENV_VAR, "fast")
    with pytest.raises(ConfigError, match=ENV_VAR):
        current_backend()
    x, w = _inputs()
    with pytest.raises(ConfigError, match="fast"):
        ops.rms_norm(x, w, EPS)


def test_register_nki_unknown_op_raises():
    with pytest.raises(ConfigError, match="no_such_op"):
        register_nki("no_such_op", lambda *a, **k: None)
    assert "no_such_op" not in dispatch._nki_impls


def test_reference_is_the_pytorch_function():
    ref = ops.rms_norm.reference
    assert ref is dispatch._REFERENCES["rms_norm"]
    assert ref is not ops.rms_norm
    assert ref.__name__ == "rms_norm"
    assert ref.__module__ == norm.__name__
    x, w = _inputs()
    torch.testing.assert_close(ref(x, w, EPS), _hand_rms_norm(x, w))
    for name in ("layer_norm", "gated_mlp", "prefill_attention", "decode_attention", "attention"):
        assert getattr(ops, name).reference is dispatch._REFERENCES[name]


# --------------------------------------------------------------------------------------------------
# The NKI branch, with the SDK and the device faked
# --------------------------------------------------------------------------------------------------


class FakeKernel:
    def __init__(self):
        self.calls = []

    def __call__(self, *args, **kwargs):
        self.calls.append((args, kwargs))
        return torch.full_like(args[0], 42.0)


@pytest.fixture
def fake_neuron(monkeypatch):
    """SDK 'imports'; tensors with requires_grad=False count as on-device, others as CPU."""
    monkeypatch.setattr(neuron, "sdk_available", lambda: True)
    monkeypatch.setattr(
        neuron, "is_neuron_tensor", lambda t: isinstance(t, torch.Tensor) and not t.requires_grad
    )
    # A private copy of the registry so nothing leaks into other tests.
    monkeypatch.setattr(dispatch, "_nki_impls", dict(dispatch._nki_impls))
    kernel = FakeKernel()
    register_nki("rms_norm", kernel)
    yield kernel


def test_auto_calls_nki_kernel_on_device(fake_neuron):
    x, w = _inputs()
    assert select_backend("rms_norm", x, w, EPS) == "nki"
    out = ops.rms_norm(x, w, EPS, weight_offset=1.0)
    assert torch.equal(out, torch.full_like(x, 42.0))
    assert len(fake_neuron.calls) == 1
    args, kwargs = fake_neuron.calls[0]
    assert args[0] is x and args[1] is w and args[2] == EPS
    assert kwargs == {"weight_offset": 1.0}


def test_auto_stays_on_torch_off_device(fake_neuron):
    x, w = _inputs()
    x.requires_grad_(True)  # "not on device" per the fake
    with torch.no_grad():
        out = ops.rms_norm(x, w, EPS)
    torch.testing.assert_close(out, _hand_rms_norm(x.detach(), w))
    assert fake_neuron.calls == []


def test_use_backend_torch_bypasses_nki(fake_neuron):
    x, w = _inputs()
    with use_backend("torch"):
        out = ops.rms_norm(x, w, EPS)
    torch.testing.assert_close(out, _hand_rms_norm(x, w))
    assert fake_neuron.calls == []


def test_reference_bypasses_nki(fake_neuron):
    x, w = _inputs()
    torch.testing.assert_close(ops.rms_norm.reference(x, w, EPS), _hand_rms_norm(x, w))
    assert fake_neuron.calls == []


def test_forced_nki_runs_kernel(fake_neuron):
    x, w = _inputs()
    with use_backend("nki"):
        assert torch.equal(ops.rms_norm(x, w, EPS), torch.full_like(x, 42.0))
    assert len(fake_neuron.calls) == 1


def test_forced_nki_off_device_raises(fake_neuron):
    x, w = _inputs()
    x.requires_grad_(True)
    with use_backend("nki"), pytest.raises(BackendUnavailableError, match=r"rms_norm.*cpu"):
        ops.rms_norm(x, w, EPS)
    assert fake_neuron.calls == []


def test_op_without_kernel_stays_on_torch(fake_neuron):
    # layer_norm has no nki-library binding: auto falls back, forced nki names the op.
    x = torch.randn(2, 8)
    assert "layer_norm" not in dispatch._nki_impls
    assert select_backend("layer_norm", x, None, None, 1e-5) == "torch"
    torch.testing.assert_close(
        ops.layer_norm(x, None, None, 1e-5), torch.nn.functional.layer_norm(x, (8,), eps=1e-5)
    )
    with use_backend("nki"), pytest.raises(BackendUnavailableError, match=r"layer_norm.*no NKI kernel"):
        ops.layer_norm(x, None, None, 1e-5)


def test_supports_predicate_is_honoured(fake_neuron, monkeypatch):
    # A private op with a shape predicate: only last dim 8 goes to the kernel.
    monkeypatch.setattr(dispatch, "_REFERENCES", dict(dispatch._REFERENCES))
    seen = []

    def supports(x, scale=1.0):
        seen.append((tuple(x.shape), scale))
        return x.shape[-1] == 8

    @kernel_op("test_scaled_copy", supports=supports)
    def scaled_copy(x, scale=1.0):
        return x * scale

    kernel = FakeKernel()
    register_nki("test_scaled_copy", kernel)

    x8, x4 = torch.ones(2, 8), torch.ones(2, 4)
    assert torch.equal(scaled_copy(x8, scale=3.0), torch.full_like(x8, 42.0))
    assert torch.equal(scaled_copy(x4, scale=3.0), torch.full_like(x4, 3.0))
    assert len(kernel.calls) == 1
    # The predicate sees the op's own arguments, keyword ones included.
    assert seen == [((2, 8), 3.0), ((2, 4), 3.0)]
    # select_backend honours a predicate passed directly, too.
    # (BF16, which rms_norm's CPU kernel leaves to the reference.)
    call = (x8.bfloat16(), torch.ones(8, dtype=torch.bfloat16), EPS)
    assert select_backend("rms_norm", *call, supports=lambda *a, **k: False) == "torch"
    assert select_backend("rms_norm", *call, supports=lambda *a, **k: True) == "nki"


def test_fake_does_not_leak():
    # Runs after the faked tests above: the registry and the SDK probe are back to normal.
    assert "rms_norm" not in dispatch._nki_impls
    assert "test_scaled_copy" not in dispatch._REFERENCES
    assert neuron.sdk_available is _REAL_SDK_AVAILABLE
    assert neuron.is_neuron_tensor is _REAL_IS_NEURON_TENSOR


# --------------------------------------------------------------------------------------------------
# CPU kernels
# --------------------------------------------------------------------------------------------------


def _experts_call():
    return torch.zeros(2, 4), torch.zeros(3, 4, 6), torch.zeros(3, 3, 4), torch.zeros(2, 3)


def test_cpu_kernel_runs_by_default_and_the_torch_backend_runs_the_reference(monkeypatch):
    assert "moe_experts" in cpu_kernels_enabled()
    assert select_backend("moe_experts", *_experts_call()) == "cpu"
    assert select_backend("layer_norm", torch.zeros(2), None, None, EPS) == "torch"  # no CPU kernel
    with use_backend("torch"):
        assert select_backend("moe_experts", *_experts_call()) == "torch"
    monkeypatch.setenv(ENV_VAR, "torch")
    assert select_backend("moe_experts", *_experts_call()) == "torch"


@pytest.mark.parametrize(("value", "expected"), [("none", "torch"), ("moe_experts", "cpu"), (" all ", "cpu")])
def test_cpu_kernels_env_var_selects_per_op(monkeypatch, value, expected):
    monkeypatch.setenv(CPU_KERNELS_ENV_VAR, value)
    assert select_backend("moe_experts", *_experts_call()) == expected


def test_cpu_kernels_env_var_names_an_op_without_a_kernel(monkeypatch):
    monkeypatch.setenv(CPU_KERNELS_ENV_VAR, "moe_experts,layer_norm")
    with pytest.raises(ConfigError, match=r"TRNMODELS_CPU_KERNELS: no CPU kernel for \['layer_norm'\]"):
        select_backend("moe_experts", *_experts_call())


def test_cpu_kernel_predicate_rejects_to_the_reference(monkeypatch):
    calls = []
    monkeypatch.setattr(dispatch, "_cpu_impls", {"rms_norm": lambda *a, **k: calls.append(a)})
    monkeypatch.setattr(dispatch, "_cpu_kernel_names", ("rms_norm",))
    monkeypatch.setattr(dispatch, "_cpu_supports", {"rms_norm": lambda x, *a, **k: x.shape[-1] == 8})
    x, w = _inputs()
    ops.rms_norm(x, w, EPS)
    assert len(calls) == 1
    torch.testing.assert_close(ops.rms_norm(x[:, :4], w[:4], EPS), _hand_rms_norm(x[:, :4], w[:4]))
    assert len(calls) == 1


def test_register_cpu_unknown_op_raises():
    with pytest.raises(ConfigError, match="no_such_op"):
        register_cpu("no_such_op", lambda *a, **k: None)
    assert "no_such_op" not in dispatch._cpu_impls


@pytest.mark.parametrize(("value", "expected"), [("all", ("linear",)), ("none", ())])
def test_a_trace_reads_the_cpu_kernels_env_var_without_dynamo_warnings(monkeypatch, value, expected):
    # Under a trace the setting is parsed uncached: Dynamo warns when it traces through an lru_cache.
    monkeypatch.setattr(dispatch, "_cpu_kernel_names", ("linear",))
    monkeypatch.setenv(CPU_KERNELS_ENV_VAR, value)
    seen = []

    def probe(x):
        seen.append(tuple(cpu_kernels_enabled()))
        return x + 1

    torch._dynamo.reset()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.compile(probe, backend="eager", fullgraph=True)(torch.zeros(2))
    assert seen == [expected]
    assert not [w for w in caught if "lru_cache" in str(w.message)]


# --------------------------------------------------------------------------------------------------
# torch.compile (vLLM's compile of the bridge): CPU kernels choose when the graph runs
# --------------------------------------------------------------------------------------------------


def _compiled_with_graph(fn):
    """``fn`` under torch.compile as vLLM compiles it (symbolic sizes, guards dropped: traced once, the
    graph then runs for every size); and the captured graphs."""
    graphs = []

    def keep(gm, example_inputs):
        graphs.append(gm)
        return gm

    torch._dynamo.reset()
    options = {"guard_filter_fn": torch.compiler.skip_all_guards_unsafe}
    return torch.compile(fn, backend=keep, fullgraph=True, dynamic=True, options=options), graphs


def _targets(graphs):
    return {str(n.target) for g in graphs for n in g.graph.nodes if n.op == "call_function"}


def test_torch_compile_traces_linear_as_a_custom_op_that_chooses_at_run_time(monkeypatch):
    # A weight the swapped SGEMM takes from 2 rows on; oneDNN takes one row: three kernels by row count
    # (the rule where MKL's SGEMM is untuned; with it tuned, as on an Intel CPU, eager calls keep it).
    monkeypatch.setattr(cpu_linear, "sgemm_tuned", lambda: False)
    torch.manual_seed(0)
    weight, bias = torch.randn(2048, 1024) / 32, torch.randn(2048)
    real = dispatch._cpu_impls["linear"]
    rows_seen = []

    def recording(x, w, b=None):
        rows_seen.append(x.shape[0])
        return real(x, w, b)

    monkeypatch.setitem(dispatch._cpu_impls, "linear", recording)
    compiled, graphs = _compiled_with_graph(lambda x: ops.linear(x, weight, bias))
    with torch.no_grad():
        for rows in (40, 1, 4):
            x = torch.randn(rows, 1024)
            torch.testing.assert_close(
                compiled(x), torch.nn.functional.linear(x, weight, bias), rtol=1e-5, atol=1e-5
            )
    assert len(graphs) == 1
    assert "trnmodels.linear.default" in _targets(graphs)
    # The 40-row trace did not decide for the later calls: the 1- and 4-row calls met their own kernels.
    assert rows_seen[-2:] == [1, 4]
    assert cpu_linear.onednn_runs(torch.zeros(1, 1024), weight, bias)
    assert cpu_linear.swap_pays(torch.zeros(4, 1024), weight, bias)


def test_torch_compile_runs_the_token_sparse_moe_kernel():
    torch.manual_seed(0)
    tokens, experts, hidden, inter = 5, 4, 8, 6
    gate_up, down = torch.randn(experts, hidden, 2 * inter), torch.randn(experts, inter, hidden)
    down_bias = torch.randn(experts, hidden)

    def moe(x, combine):
        return ops.experts_ffn(x, gate_up, down, combine, act="silu", down_bias=down_bias)

    compiled, graphs = _compiled_with_graph(moe)
    with torch.no_grad():
        for t in (tokens, 2):
            x = torch.randn(t, hidden)
            combine = torch.zeros(t, experts)
            combine[torch.arange(t), torch.randint(0, experts, (t,))] = 0.75
            reference = ops.experts_ffn.reference(x, gate_up, down, combine, act="silu", down_bias=down_bias)
            torch.testing.assert_close(compiled(x, combine), reference, rtol=1e-5, atol=1e-5)
    assert "trnmodels.moe_experts.default" in _targets(graphs)


def test_torch_compile_keeps_the_reference_where_no_cpu_kernel_may_run(monkeypatch):
    weight = torch.randn(16, 8)
    monkeypatch.setenv(ENV_VAR, "torch")
    compiled, graphs = _compiled_with_graph(lambda x: ops.linear(x, weight))
    with torch.no_grad():
        compiled(torch.randn(3, 8))
    assert not [t for t in _targets(graphs) if t.startswith("trnmodels.")]
    # A call that records a gradient: custom ops carry none, so the trace keeps the differentiable ops.
    monkeypatch.delenv(ENV_VAR)
    trainable = torch.nn.Parameter(torch.randn(16, 8))
    compiled, graphs = _compiled_with_graph(lambda x: ops.linear(x, trainable))
    compiled(torch.randn(3, 8)).sum().backward()
    assert trainable.grad is not None
    assert not [t for t in _targets(graphs) if t.startswith("trnmodels.")]


def test_torch_export_keeps_the_static_choice(monkeypatch):
    """Our own graph capture (torch.export, static shapes) takes the kernel the shape selects, inline."""
    monkeypatch.setattr(cpu_linear, "sgemm_tuned", lambda: False)  # 4 rows swap where SGEMM is untuned
    weight = torch.randn(2048, 1024)

    class Linear(torch.nn.Module):
        def forward(self, x):
            return ops.linear(x, weight)

    program = torch.export.export(Linear(), (torch.randn(4, 1024),), strict=True)
    targets = {str(n.target) for n in program.graph.nodes if n.op == "call_function"}
    assert "aten.mm.default" in targets
    assert not [t for t in targets if t.startswith("trnmodels.")]


def test_an_eager_call_follows_every_change_of_the_settings(monkeypatch):
    """Eager calls remember the settings they were read from, and read them again when one changes."""
    calls = []
    kernel = dispatch._cpu_impls["rms_norm"]
    monkeypatch.setitem(dispatch._cpu_impls, "rms_norm", lambda *a, **k: calls.append(1) or kernel(*a, **k))
    x, w = _inputs()

    def ran_kernel() -> bool:
        before = len(calls)
        torch.testing.assert_close(ops.rms_norm(x, w, EPS), _hand_rms_norm(x, w))
        return len(calls) > before

    assert ran_kernel()
    monkeypatch.setenv(ENV_VAR, "torch")
    assert not ran_kernel()
    monkeypatch.setenv(ENV_VAR, "auto")
    assert ran_kernel()
    monkeypatch.setenv(CPU_KERNELS_ENV_VAR, "linear")
    assert not ran_kernel()
    monkeypatch.setenv(CPU_KERNELS_ENV_VAR, "linear,no_such_kernel")
    with pytest.raises(ConfigError, match="no_such_kernel"):
        ops.rms_norm(x, w, EPS)
    with pytest.raises(ConfigError, match="no_such_kernel"):  # a bad setting is never remembered
        ops.rms_norm(x, w, EPS)
    monkeypatch.setenv(CPU_KERNELS_ENV_VAR, "rms_norm")
    assert ran_kernel()
    with use_backend("torch"):
        assert not ran_kernel()
    assert ran_kernel()
