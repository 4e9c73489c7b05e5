"""The benchmark of an LLM plugin: ``python -m benchmarks.llm MODEL`` (nox session ``bench-<model>``).

On each workload of the plugin (its bundled ``bench`` config, about 100M parameters with random weights,
and, for a plugin with one, its real checkpoint: see ``run``) it measures in one run: weight loading (GB/s
and peak RSS against a plain safetensors read, per rank at TP>1), prefill and decode throughput (our runner
eager and compiled, and HF transformers ``generate``), decode against the memory bandwidth roofline, and
cold versus warm compile time; then it writes ``<model>.md``, ``.json`` and ``.png``. ``measure`` holds the
measurements, ``run`` the run, ``report`` the targets and the page.
"""
