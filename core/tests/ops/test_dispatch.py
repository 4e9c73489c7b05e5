"""Kernel dispatch: the torch path without the Neuron SDK, and the NKI branch with the SDK faked."""

import warnings

import pytest
import torch

import trnmodels.core.ops as ops
from trnmodels.core import neuron
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


def test_auto_selects_torch():
    x, w = _inputs()
    assert current_backend() == "auto"
    assert select_backend("rms_norm", x, w, EPS) == "torch"
    torch.testing.assert_close(ops.rms_norm(x, w, EPS), _hand_rms_norm(x, w))


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
    assert select_backend("rms_norm", x8, supports=lambda *a, **k: False) == "torch"
    assert select_backend("rms_norm", x8, supports=lambda *a, **k: True) == "nki"


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
    assert select_backend("rms_norm", torch.zeros(2)) == "torch"  # no CPU kernel: the reference
    with use_backend("torch"):
        assert select_backend("moe_experts", *_experts_call()) == "torch"
    monkeypatch.setenv(ENV_VAR, "torch")
    assert select_backend("moe_experts", *_experts_call()) == "torch"


@pytest.mark.parametrize(("value", "expected"), [("none", "torch"), ("moe_experts", "cpu"), (" all ", "cpu")])
def test_cpu_kernels_env_var_selects_per_op(monkeypatch, value, expected):
    monkeypatch.setenv(CPU_KERNELS_ENV_VAR, value)
    assert select_backend("moe_experts", *_experts_call()) == expected


def test_cpu_kernels_env_var_names_an_op_without_a_kernel(monkeypatch):
    monkeypatch.setenv(CPU_KERNELS_ENV_VAR, "moe_experts,rms_norm")
    with pytest.raises(ConfigError, match=r"TRNMODELS_CPU_KERNELS: no CPU kernel for \['rms_norm'\]"):
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
