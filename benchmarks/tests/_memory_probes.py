"""Memory measurements the tests run in a fresh process (``measure.run_in_fresh_process``), as the
benchmark runs its own: in a long test process, the allocator may serve a new block from memory an
earlier test freed but kept resident, and the RSS does not move."""

from __future__ import annotations

from typing import Any

import torch

from benchmarks.llm import measure


def peak_of_a_64mib_block() -> dict[str, Any]:
    with measure.PeakMemory() as memory:
        block = torch.ones(64 << 18)  # 64 MiB, touched
    del block
    return memory.result


def case_memory_of_a_64mib_model() -> dict[str, Any]:
    def build():
        model = torch.ones(64 << 18)  # 64 MiB the case holds

        def run():
            return (model[: 32 << 18] * 2).sum()  # a 32 MiB temporary

        return run

    return measure.case_memory(build)


def case_memory_of_first_calls_on_a_tiny_tensor() -> dict[str, Any]:
    """A pass that allocates next to nothing but calls ops this process has not run: without the
    libraries' code made resident first, their first calls map 5.7 MB of it here."""

    def build():
        x = torch.randn(256)

        def run():
            return (
                torch.special.erfcx(x).sum()
                + torch.fft.rfft(x).abs().sum()
                + torch.linalg.vector_norm(x, ord=3)
                + torch.cumprod(x, 0).sum()
                + torch.sort(x).values.sum()
            )

        return run

    result = measure.case_memory(build)
    result["library_code_again"] = measure.fault_in_library_code()
    return result
