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
