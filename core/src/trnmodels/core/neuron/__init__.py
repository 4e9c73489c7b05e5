"""The Neuron path: the thin layer that binds NKI kernels where the Neuron SDK imports.

Nothing in trnmodels requires the SDK. On a host without it, ``sdk_available()`` is False, every op runs
its PyTorch reference, and forcing the ``nki`` backend is a named error.
"""

from __future__ import annotations

import functools
import importlib

import torch

NEURON_DEVICE_TYPES = ("neuron", "xla")


@functools.cache
def sdk_available() -> bool:
    """True when torch-neuronx and nki import (the PyPI placeholders install no module, so this is False)."""
    try:
        importlib.import_module("torch_neuronx")
        importlib.import_module("nki")
    except ImportError:
        return False
    return True


def is_neuron_tensor(t: object) -> bool:
    return isinstance(t, torch.Tensor) and t.device.type in NEURON_DEVICE_TYPES
