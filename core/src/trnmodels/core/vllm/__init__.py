"""Serving trnmodels LLM plugins through vLLM.

- ``registration``: the ``vllm.general_plugins`` hook. It registers every opted-in plugin architecture
  with ``vllm.ModelRegistry`` as a ``"module:Class"`` string, so nothing torch-heavy is imported until
  vLLM builds a model.
- ``bridge``: the vLLM model class that wraps any trnmodels ``CausalLM`` built by its plugin factory.
- ``attention``: the swap of each ``PagedAttention`` for one backed by vLLM's attention layer.
- ``fused_moe``: the swap of each MoE experts module vLLM's fused CPU MoE kernel can run, after loading.
- ``neuron``: the class registered instead on a Neuron platform (the trnmodels contract as is).

Importing this package imports neither torch nor vLLM.
"""
