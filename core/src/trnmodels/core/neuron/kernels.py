"""Which nki-library kernel each functional op targets on Trainium.

A kernel does not take our op's arguments as they are: it has its own layouts (for example
``[128, B×S, H/128]`` tiles) and writes into output tensors. So a kernel runs only once an adapter that
converts our op's arguments to the kernel's and back is registered for the op with
``trnmodels.core.ops.register_nki(op, adapter)``. One adapter ships, unverified on hardware:
``attention_cte`` for ``prefill_attention`` (``neuron.attention_cte``), bound only when the runtime
configuration names it (``neuron.adapters``). Until an adapter is bound, every op runs its PyTorch
reference, on Neuron as elsewhere.
"""

from __future__ import annotations

# op name -> (nki-library module, kernel function)
NKILIB_KERNELS: dict[str, tuple[str, str]] = {
    "rms_norm": ("nkilib.core.subkernels.rmsnorm_tkg", "rmsnorm_tkg"),
    "gated_mlp": ("nkilib.core.mlp.mlp", "mlp"),
    "prefill_attention": ("nkilib.core.attention.attention_cte", "attention_cte"),
    "decode_attention": ("nkilib.core.attention.attention_tkg", "attention_tkg"),
    "experts_ffn": ("nkilib.core.moe.moe_tkg.moe_tkg", "moe_tkg"),
}
