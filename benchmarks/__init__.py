"""The benchmarks behind the ``bench-*``, ``bench-vllm`` and ``eval-*`` nox sessions, and the pages they write
into ``docs/benchmarks/``.

A plain folder of the repository, run from its root (``python -m benchmarks.<module>``), and part of no
released wheel: the runtime distributions carry no benchmark code.

- :mod:`.llm`: an LLM plugin on its bench config (and on real weights where a real checkpoint exists):
  weight loading, throughput against HF, roofline, compile time (``bench-<model>``);
- :mod:`.wan22`: the Wan2.2 DiT step and VAE decode against diffusers (``bench-wan22``);
- :mod:`.vllm_serving`: a plugin served by vLLM against vLLM's own implementation (``bench-vllm``), through
  :mod:`.vllm_server`, which the vLLM integration tests use too;
- :mod:`.eval`: L1 task accuracy through lm_eval, HF FP32 against ours (``eval-<model>``);
- :mod:`.machine`, :mod:`.parallelism`: what the pages record about the host, and the TP degree a
  checkpoint's heads split into.
"""
