"""``place_in_huge_pages``: a built model's parameters move into one 2 MiB-aligned mapping advised for
huge pages, keeping their shapes, strides and sharing, and ``build_model`` loads the checkpoint into it
when ``TRNMODELS_HUGE_PAGES=1`` asks."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from torch import nn

from trnmodels.core.causal_lm import build_model, resolve_checkpoint
from trnmodels.core.errors import ConfigError
from trnmodels.core.parallel.state import destroy_parallel_state, init_parallel_state
from trnmodels.core.runtime_config import NeuronConfig
from trnmodels.core.weights import huge_pages_supported, place_in_huge_pages
from trnmodels.core.weights.huge_pages import HUGE_PAGE, HUGE_PAGES_ENV_VAR, huge_pages_requested

linux_only = pytest.mark.skipif(not huge_pages_supported(), reason="madvise(MADV_HUGEPAGE) is Linux-only")


class Shapes(nn.Module):
    """A large weight, a tied one, a transposed (non-contiguous) one and two views of one storage."""

    def __init__(self) -> None:
        super().__init__()
        self.big = nn.Linear(1024, 2048)
        self.tied = nn.Linear(1024, 2048, bias=False)
        self.tied.weight = self.big.weight
        self.experts = nn.Parameter(torch.empty(4, 16, 8).transpose(1, 2), requires_grad=False)
        shared = torch.empty(30)
        self.head, self.tail = nn.Parameter(shared[:10]), nn.Parameter(shared[10:].view(4, 5))


def _layout(module: nn.Module) -> dict[str, tuple]:
    return {n: (p.shape, p.stride(), p.dtype, p.requires_grad) for n, p in module.named_parameters()}


@linux_only
def test_parameters_keep_shapes_strides_and_sharing_in_one_aligned_mapping():
    module = Shapes()
    before, tail_after_head = _layout(module), module.tail.data_ptr() - module.head.data_ptr()
    total = place_in_huge_pages(module)

    assert _layout(module) == before
    assert module.tied.weight is module.big.weight
    assert module.tail.data_ptr() - module.head.data_ptr() == tail_after_head  # still one storage
    starts = sorted(p.data_ptr() for p in module.parameters())
    assert starts[0] % HUGE_PAGE == 0
    ends = [p.data_ptr() + p.numel() * p.element_size() for p in module.parameters()]
    assert max(ends) - starts[0] <= total

    # Each parameter has memory of its own: writing them all and reading them back gives what was written.
    torch.manual_seed(0)
    values = {n: torch.randn(p.shape) for n, p in module.named_parameters()}
    with torch.no_grad():
        for n, p in module.named_parameters():
            p.copy_(values[n])
    for n, p in module.named_parameters():
        torch.testing.assert_close(p, values[n], rtol=0, atol=0)
    x = torch.randn(3, 1024)
    torch.testing.assert_close(module.big(x), F.linear(x, values["big.weight"], values["big.bias"]))


def _anon_huge_kb(address: int) -> int:
    """AnonHugePages of the mapping of this process that holds ``address``, from /proc/self/smaps."""
    mapping = None
    for line in Path("/proc/self/smaps").read_text().splitlines():
        if m := re.match(r"([0-9a-f]+)-([0-9a-f]+) ", line):
            mapping = int(m[1], 16) <= address < int(m[2], 16)
        elif mapping and line.startswith("AnonHugePages:"):
            return int(line.split()[1])
    raise AssertionError(f"no mapping holds {address:#x}")


@linux_only
def test_written_parameters_are_backed_by_huge_pages():
    setting = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    if not setting.exists() or "[never]" in setting.read_text():
        pytest.skip("transparent huge pages are off on this kernel")
    module = nn.Linear(2048, 2048, bias=False)  # 16 MiB
    place_in_huge_pages(module)
    with torch.no_grad():
        module.weight.fill_(1.0)
    assert _anon_huge_kb(module.weight.data_ptr()) >= HUGE_PAGE // 1024


@linux_only
def test_build_model_loads_the_checkpoint_into_one_mapping(llama_checkpoint: Path, monkeypatch):
    monkeypatch.setenv(HUGE_PAGES_ENV_VAR, "1")
    init_parallel_state(1)
    try:
        model = build_model(llama_checkpoint, NeuronConfig(), progress=False)
        plugin, hf_config = resolve_checkpoint(llama_checkpoint)
        unplaced = plugin.load_factory()(hf_config, NeuronConfig())  # in torch's own allocations
        unplaced.load_weights(llama_checkpoint, progress=False)
    finally:
        destroy_parallel_state()
    params, expected = dict(model.named_parameters()), dict(unplaced.named_parameters())
    assert params.keys() == expected.keys()
    for name, param in params.items():
        torch.testing.assert_close(param, expected[name], rtol=0, atol=0, msg=name)
    # The tensors the checkpoint stores as they are (the fused projections are checked above).
    tensors = load_file(llama_checkpoint / "model.safetensors")
    direct = [n for n in params if f"model.{n}" in tensors]
    assert "embed_tokens.weight" in direct and "norm.weight" in direct
    for name in direct:
        torch.testing.assert_close(params[name], tensors[f"model.{name}"], rtol=0, atol=0, msg=name)
    assert min(p.data_ptr() for p in params.values()) % HUGE_PAGE == 0


@pytest.mark.parametrize(("value", "requested"), [(None, False), ("0", False), ("1", True), (" 1 ", True)])
def test_huge_pages_are_opt_in(monkeypatch, value, requested):
    if value is None:
        monkeypatch.delenv(HUGE_PAGES_ENV_VAR, raising=False)
    else:
        monkeypatch.setenv(HUGE_PAGES_ENV_VAR, value)
    assert huge_pages_requested() is requested


def test_a_bad_huge_pages_value_is_refused_before_loading(llama_checkpoint: Path, monkeypatch):
    monkeypatch.setenv(HUGE_PAGES_ENV_VAR, "yes")
    init_parallel_state(1)
    try:
        with pytest.raises(ConfigError, match=r"TRNMODELS_HUGE_PAGES='yes': expected 1 .* or 0"):
            build_model(llama_checkpoint, NeuronConfig(), progress=False)
    finally:
        destroy_parallel_state()
