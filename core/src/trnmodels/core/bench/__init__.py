"""The benchmark of a model plugin: ``python -m trnmodels.core.bench MODEL`` (nox session ``bench-<model>``).

On the plugin's bundled ``bench`` config (about 100M parameters, random weights) it measures in one run:
weight loading (GB/s and peak RSS against a plain safetensors read, per rank at TP=2), prefill and decode
throughput (our runner eager and compiled, and HF transformers ``generate``), decode against the memory
bandwidth roofline, and cold versus warm compile time; then it writes ``<model>.md``, ``.json`` and
``.png``. ``measure`` holds the measurements, ``report`` the targets and the page, ``run`` the run.
"""

from .report import Target, markdown, targets, write_report
from .run import QUICK, Settings, run_benchmark

__all__ = ["QUICK", "Settings", "Target", "markdown", "run_benchmark", "targets", "write_report"]
