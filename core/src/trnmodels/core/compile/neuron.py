"""The Neuron hand-off of the compile driver. Imported only where the Neuron SDK imports.

On Trainium the captured step goes to TorchNeuron's ``torch.compile(backend="neuron", fullgraph=True)``
instead of AOTInductor; the first call with the bucket's shapes compiles the NEFF into TorchNeuron's own
NEFF cache. The cache entry then records that the graph was compiled. Nothing on this machine can run
this path: it is the binding only.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch


def compile_for_neuron(step: torch.nn.Module, args: tuple[torch.Tensor, ...], path: Path) -> None:
    compiled = torch.compile(step, backend="neuron", fullgraph=True)
    compiled(*(a.to("neuron") for a in args))
    path.write_text(json.dumps({"backend": "neuron", "neff_cache": "torch-neuronx"}))
