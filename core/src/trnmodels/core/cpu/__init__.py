"""The CPU kernels: faster CPU implementations of core's ops, the CPU counterpart of ``neuron``.

Each kernel registers with the op dispatch (``ops.dispatch.register_cpu``) when this package is imported,
which importing ``trnmodels.core.ops`` does. The dispatch runs a kernel for CPU tensors unless
``TRNMODELS_CPU_KERNELS`` leaves it out (``none``, or the list of ops to keep) or
``TRNMODELS_KERNEL_BACKEND=torch`` asks for the PyTorch reference of every op. Each kernel is tested
against its op's reference and the transformers module beside the reference's own tests.
"""

from . import activation, attention, linear, moe, norm, sampling

__all__ = ["activation", "attention", "linear", "moe", "norm", "sampling"]
