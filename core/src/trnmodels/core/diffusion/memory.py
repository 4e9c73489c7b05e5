"""What one component of a diffusion pipeline holds on a NeuronCore, for ``trnmodels plan``.

A diffusion plugin's pipeline class reports, per mesh, one ``ComponentMemory`` per component (its
``plan_memory`` classmethod; see ``trnmodels.core.omni.registry``). The helpers here count bytes without
allocating them: ``module_bytes`` reads a module built on the meta device (or in a ``FakeTensorMode``),
and ``fake_peak_bytes`` runs a computation on fake tensors and reports the peak of the memory it would
hold, which is how a component whose working set no formula captures (a VAE's causal-convolution cache
and its widest feature maps) is sized.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class ComponentMemory:
    """One component on one rank of a mesh. ``working_bytes`` is what a call of the component holds
    beyond its weights; ``working`` says how it was found. ``vae_ranks_only``: built only on the VAE
    rank(s), not on every rank."""

    name: str
    weight_bytes: int
    working_bytes: int
    working: str
    vae_ranks_only: bool = False

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def module_bytes(module: torch.nn.Module) -> int:
    """Parameters and buffers of ``module``, each shared tensor once (a tied table is one table)."""
    tensors = {id(t): t for t in (*module.parameters(), *module.buffers())}
    return sum(t.numel() * t.element_size() for t in tensors.values())


def fake_peak_bytes(module: torch.nn.Module, run: Callable[[], Any], *inputs: torch.Tensor) -> int:
    """The peak bytes ``run()`` holds beyond ``module``'s weights, inputs included: call it inside the
    ``FakeTensorMode`` that built ``module`` and ``inputs`` (nothing is computed or allocated). This is
    the eager PyTorch math's peak, as the CPU path runs it; a compiler may schedule the same graph in
    less, so it is an upper estimate of a compiled graph's working set."""
    from torch.distributed._tools.mem_tracker import MemTracker

    tracker = MemTracker()
    tracker.track_external(module, *inputs)
    with tracker, torch.no_grad():
        run()
    # Per device, the peak total and what each kind of reference holds in it; parameters are not working.
    peak = tracker.get_tracker_snapshot("peak")
    return max(
        int(by_kind["Total"] - sum(v for k, v in by_kind.items() if str(k).endswith("PARAM")))
        for by_kind in peak.values()
    )
