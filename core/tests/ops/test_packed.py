"""``cpu.packed``: a weight registered with its own GEMM runs it through the linear op, eagerly and under
torch.compile (through the runtime op, or traced inline when the GEMM is traceable); its memory is
released on request; a view at the same address is not it; the entry goes with the parameter."""

from __future__ import annotations

import gc

import torch

from trnmodels.core import ops
from trnmodels.core.cpu import packed
from trnmodels.core.cpu.packed import pack, packed_gemm


def packed_weight(
    release: bool, traceable: bool = False
) -> tuple[torch.nn.Parameter, torch.Tensor, list[int]]:
    torch.manual_seed(0)
    weight = torch.nn.Parameter(torch.randn(6, 4), requires_grad=False)
    copy = weight.detach().clone()
    calls: list[int] = []

    def gemm(x: torch.Tensor) -> torch.Tensor:  # the library's own copy, in float64
        calls.append(x.shape[0])
        return (x.double() @ copy.double().T).to(x.dtype)

    pack(weight, gemm, release=release, traceable=traceable)
    return weight, copy, calls


def test_the_linear_op_runs_the_packed_gemm_and_adds_the_bias():
    weight, copy, calls = packed_weight(release=True)
    x, bias = torch.randn(2, 3, 4), torch.randn(6)
    out = ops.linear(x, weight, bias)
    assert calls == [6] and out.shape == (2, 3, 6)
    torch.testing.assert_close(out, x @ copy.T + bias, rtol=1e-6, atol=1e-6)
    compiled = torch.compile(lambda x: ops.linear(x, weight), dynamic=True, fullgraph=True)(x[0])
    torch.testing.assert_close(compiled, x[0] @ copy.T, rtol=1e-6, atol=1e-6)
    assert calls[-1] == 3


def test_release_keeps_shape_and_dtype_with_a_nan_in_the_memory():
    weight, _, _ = packed_weight(release=True)
    assert weight.shape == (6, 4) and weight.dtype == torch.float32
    assert weight.untyped_storage().nbytes() == 4 and weight.isnan().all()
    kept, copy, _ = packed_weight(release=False)
    assert torch.equal(kept, copy)


def test_a_view_at_the_same_address_and_a_dropped_parameter_are_not_packed():
    weight, _, calls = packed_weight(release=False)
    assert packed_gemm(weight) is not None and packed_gemm(weight[:3]) is None
    ops.linear(torch.randn(1, 4), weight[:3])
    assert calls == []
    key = weight.data_ptr()
    assert key in packed._packed
    del weight
    gc.collect()
    assert key not in packed._packed  # gone before the address can hold another tensor


def graph_targets(fn, *args: torch.Tensor) -> tuple[torch.Tensor, set[str]]:
    """Run ``fn`` compiled (dynamic shapes, one graph); returns its result and the ops its graph calls."""
    targets: set[str] = set()

    def capture(gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor]):
        targets.update(str(node.target) for node in gm.graph.nodes if node.op == "call_function")
        return gm.forward

    torch._dynamo.reset()
    return torch.compile(fn, backend=capture, dynamic=True, fullgraph=True)(*args), targets


def test_a_traceable_gemm_is_traced_inline_and_an_opaque_one_runs_in_the_runtime_op():
    x, bias = torch.randn(3, 4), torch.randn(6)
    inline_weight, copy, _ = packed_weight(release=True, traceable=True)
    out, targets = graph_targets(lambda x: ops.linear(x, inline_weight, bias), x)
    # The released weight is NaN: a result this close came from the GEMM's own copy.
    torch.testing.assert_close(out, x @ copy.T + bias, rtol=1e-6, atol=1e-6)
    assert not any("trnmodels" in t for t in targets), targets
    opaque_weight, copy, calls = packed_weight(release=True)
    out, targets = graph_targets(lambda x: ops.linear(x, opaque_weight, bias), x)
    torch.testing.assert_close(out, x @ copy.T + bias, rtol=1e-6, atol=1e-6)
    assert "trnmodels.linear.default" in targets and calls == [3]
