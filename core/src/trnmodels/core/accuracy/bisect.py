"""Module-level validation (L3) and bisection: where inside the model our outputs leave transformers'.

One prefill of the same tokens runs through our model (FP32), the transformers model in FP32 and the
transformers model in BF16. Forward hooks keep the output of every decoder layer and of each of its
sub-modules that transformers has under the same name (our parameter names are HF's, so the name is
the mapping: ``input_layernorm``, ``self_attn``, ``mlp``, ``router``, ...).

Each output is judged against the BF16 envelope: the error HF's own BF16 model makes at that point,
``max |hf_bf16 - hf_fp32|``, floored at the FP32 tolerance scaled by the output's size. A correct port
in FP32 sits orders of magnitude inside it; a wrong RoPE base or a swapped norm leaves it at the first
module it touches, and every later one inherits the error. So the first layer outside its envelope,
and within it the first sub-module in HF's call order, is where the bug is.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import nn

FP32_FLOOR = 1e-4  # the FP32 tolerance of the logits checks, per unit of the output's magnitude


def decoder_layers(model: nn.Module, num_layers: int) -> nn.ModuleList:
    """The model's decoder layers: the one ``ModuleList`` named ``layers`` with ``num_layers`` entries."""
    found = [
        m
        for name, m in model.named_modules()
        if name.rpartition(".")[2] == "layers" and isinstance(m, nn.ModuleList) and len(m) == num_layers
    ]
    if len(found) != 1:
        raise ValueError(f"{type(model).__name__}: expected one ModuleList 'layers', found {len(found)}")
    return found[0]


def _flat(output: Any) -> torch.Tensor | None:
    tensor = output[0] if isinstance(output, tuple) else output
    if not isinstance(tensor, torch.Tensor) or not tensor.is_floating_point():
        return None
    return tensor.detach().reshape(-1, tensor.shape[-1]).float()


@dataclass
class Captured:
    """Outputs by (layer, module name; ``""`` is the layer itself), in the order they first ran."""

    outputs: dict[tuple[int, str], list[torch.Tensor]]
    order: list[tuple[int, str]]


def capture(layers: nn.ModuleList, names: Sequence[str], run: Callable[[], Any]) -> Captured:
    """Run ``run()`` once with hooks on each layer and on its children ``names``."""
    captured = Captured({}, [])

    def hook(key: tuple[int, str]):
        def keep(_module: nn.Module, _inputs: Any, output: Any) -> None:
            tensor = _flat(output)
            if tensor is None:
                return
            if key not in captured.outputs:
                captured.outputs[key] = []
                captured.order.append(key)
            captured.outputs[key].append(tensor)

        return keep

    handles = []
    for i, layer in enumerate(layers):
        handles.append(layer.register_forward_hook(hook((i, ""))))
        for name in names:
            child = getattr(layer, name, None)
            if isinstance(child, nn.Module):
                handles.append(child.register_forward_hook(hook((i, name))))
    try:
        with torch.no_grad():
            run()
    finally:
        for handle in handles:
            handle.remove()
    return captured


def shared_children(ours: nn.ModuleList, theirs: nn.ModuleList) -> list[str]:
    """Names of the sub-modules both models' first layer has (a layer's own children, not deeper)."""
    ours_names = {name for name, _ in ours[0].named_children()}
    return [name for name, _ in theirs[0].named_children() if name in ours_names]


@dataclass(frozen=True)
class ModuleError:
    layer: int
    module: str  # "" is the decoder layer's output
    error: float  # max |ours FP32 - HF FP32|
    bf16_error: float  # max |HF BF16 - HF FP32|: what BF16 alone costs here
    envelope: float

    @property
    def within(self) -> bool:
        return self.error <= self.envelope

    @property
    def where(self) -> str:
        return f"layer {self.layer}" + (f" {self.module}" if self.module else "")

    def describe(self) -> str:
        ratio = self.error / self.envelope if self.envelope else float("inf")
        return (
            f"{self.where}: max abs error {self.error:.3e} vs BF16 envelope {self.envelope:.3e} "
            f"({ratio:.3g}x; HF BF16's own error {self.bf16_error:.3e})"
        )


@dataclass(frozen=True)
class ModuleReport:
    """L3: every layer's and matched sub-module's error against its envelope, plus the first departure."""

    num_tokens: int
    layers: list[ModuleError]
    modules: list[ModuleError]  # in HF's call order within each layer
    skipped: list[str]  # matched names whose outputs could not be compared, with the reason

    @property
    def passed(self) -> bool:
        return all(e.within for e in self.layers) and all(e.within for e in self.modules)

    @property
    def first_layer(self) -> ModuleError | None:
        """The first decoder layer whose output leaves its envelope."""
        return next((e for e in self.layers if not e.within), None)

    @property
    def culprit(self) -> ModuleError | None:
        """Within the first departing layer, the first sub-module (in HF's call order) outside its envelope;
        None when every sub-module holds (the layer's own arithmetic, such as a residual, is wrong)."""
        first = self.first_layer
        if first is None:
            return next((e for e in self.modules if not e.within), None)
        return next((e for e in self.modules if e.layer == first.layer and not e.within), None)

    def summary(self) -> str:
        worst = max(self.layers + self.modules, key=lambda e: e.error / e.envelope if e.envelope else 0.0)
        names = sorted({e.module for e in self.modules})
        return (
            f"{len(self.layers)} layers and {len(self.modules)} sub-module outputs ({', '.join(names)}) over "
            f"{self.num_tokens} tokens; closest to its envelope: {worst.describe()}"
        )

    def bisection(self) -> list[str]:
        """The report's bisection lines: each layer's error, and the module named."""
        lines = [f"  {'layer':>5}  {'ours FP32 err':>13}  {'BF16 envelope':>13}  verdict"]
        for e in self.layers:
            lines.append(
                f"  {e.layer:>5}  {e.error:>13.3e}  {e.envelope:>13.3e}  {'ok' if e.within else 'OUTSIDE'}"
            )
        first, culprit = self.first_layer, self.culprit
        if first is None and culprit is None:
            lines.append(
                "  every layer and module is inside its envelope (a failing L2 then comes from after the last "
                "layer: the final norm or the head)"
            )
            return lines
        if first is not None:
            lines.append(f"  first layer outside: {first.describe()}")
            for e in self.modules:
                if e.layer == first.layer:
                    lines.append(
                        f"    {e.module:<28} {e.error:.3e} / {e.envelope:.3e}  {'ok' if e.within else 'OUTSIDE'}"
                    )
        if culprit is not None:
            lines.append(f"  first module outside: {culprit.describe()}")
        else:
            lines.append("  every sub-module holds: the layer's own arithmetic (residual, scaling) differs")
        return lines

    def to_dict(self) -> dict[str, Any]:
        first, culprit = self.first_layer, self.culprit
        return {
            "passed": self.passed,
            "num_tokens": self.num_tokens,
            "layers": [asdict(e) | {"within": e.within} for e in self.layers],
            "modules": [asdict(e) | {"within": e.within} for e in self.modules],
            "skipped": self.skipped,
            "first_layer": None if first is None else first.layer,
            "culprit": None if culprit is None else {"layer": culprit.layer, "module": culprit.module},
        }


def _error(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a - b).abs().max().item()


def compare_modules(ours: Captured, hf32: Captured, hf16: Captured, num_tokens: int) -> ModuleReport:
    """Judge each captured output of ours against HF FP32, inside HF BF16's envelope."""
    layers, modules, skipped = [], [], []
    for key in hf32.order:
        layer, name = key
        where = f"layer {layer} {name}".rstrip()
        if key not in ours.outputs or key not in hf16.outputs:
            if name:
                skipped.append(f"{where}: ran in transformers only")
                continue
            raise ValueError(f"{where}: our model did not run it")
        got, want, bf16 = ours.outputs[key], hf32.outputs[key], hf16.outputs[key]
        if len(got) != len(want) or any(g.shape != w.shape for g, w in zip(got, want, strict=False)):
            shapes = [tuple(t.shape) for t in got], [tuple(t.shape) for t in want]
            skipped.append(f"{where}: ours ran as {shapes[0]}, transformers as {shapes[1]}")
            continue
        error = max(_error(g, w) for g, w in zip(got, want, strict=True))
        bf16_error = max(_error(b, w) for b, w in zip(bf16, want, strict=True))
        scale = max(1.0, max(w.abs().max().item() for w in want))
        entry = ModuleError(layer, name, error, bf16_error, max(bf16_error, FP32_FLOOR * scale))
        (modules if name else layers).append(entry)
    return ModuleReport(num_tokens, layers, modules, skipped)
