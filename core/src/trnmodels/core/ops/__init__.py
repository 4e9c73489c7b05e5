"""Functional ops. Each has a PyTorch reference and dispatches to an NKI kernel, or a CPU kernel, where one
can run."""

from .attention import attention, decode_attention, gather_paged, prefill_attention, scaled_dot_product
from .dispatch import current_backend, kernel_op, register_cpu, register_nki, select_backend, use_backend
from .linear import linear
from .mlp import clamped_swiglu, gated_mlp, gelu_tanh
from .moe import combine_matrix, experts_ffn, route
from .norm import layer_norm, rms_norm
from .rope import RopeConfig, apply_rope, cos_sin, inv_freq
from .sampling import gumbel_noise, sample

__all__ = [
    "RopeConfig",
    "apply_rope",
    "attention",
    "clamped_swiglu",
    "combine_matrix",
    "cos_sin",
    "current_backend",
    "decode_attention",
    "experts_ffn",
    "gated_mlp",
    "gather_paged",
    "gelu_tanh",
    "gumbel_noise",
    "inv_freq",
    "kernel_op",
    "layer_norm",
    "linear",
    "prefill_attention",
    "register_cpu",
    "register_nki",
    "rms_norm",
    "route",
    "sample",
    "scaled_dot_product",
    "select_backend",
    "use_backend",
]

# The CPU kernels register with the dispatch on import: importing the ops is enough to use them.
from .. import cpu as _cpu  # noqa: F401
