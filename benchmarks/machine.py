"""The host a benchmark ran on, as every page records it."""

from __future__ import annotations

import importlib
import os
import platform
import statistics
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def proc_bytes(path: str) -> dict[str, int]:
    """``Key: N kB`` lines of a /proc file, in bytes."""
    out: dict[str, int] = {}
    for line in Path(path).read_text().splitlines():
        key, _, value = line.partition(":")
        parts = value.split()
        if len(parts) == 2 and parts[1] == "kB":
            out[key] = int(parts[0]) * 1024
    return out


def machine_info(packages: Sequence[str] = ("torch", "transformers", "safetensors")) -> dict[str, Any]:
    """CPU, cores, memory, Python and platform, and ``__version__`` of each of ``packages`` (by import
    name, which is also its key)."""
    import torch

    cpuinfo = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").is_file() else ""
    cpu = next(
        (line.split(":", 1)[1].strip() for line in cpuinfo.splitlines() if line.startswith("model name")),
        platform.processor() or "unknown",
    )
    meminfo = proc_bytes("/proc/meminfo") if Path("/proc/meminfo").is_file() else {}
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "memory_bytes": meminfo.get("MemTotal", 0),
        "python": platform.python_version(),
        **{name: importlib.import_module(name).__version__ for name in packages},
        "platform": platform.platform(),
        # The vector ISA torch's CPU kernels use (AVX2, AVX512...) and whether the CPU has BF16 arithmetic
        # (AVX512-BF16 or AMX): without it, BF16 matmuls convert in software and run several times slower
        # than FP32.
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "bf16_in_hardware": torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported(),
        # Other processes share the cores: the 1, 5 and 15 minute load averages when the run starts.
        "load_average_start": os.getloadavg(),
    }


# A CPU-bound loop that touches no memory to speak of: what it loses beside a copy of itself is the
# share of the cores the machine gives two processes at once, not cache or bandwidth.
_SPIN = (
    "import time\nt = time.perf_counter()\ns = 0\nfor i in range({n}): s += i\nprint(time.perf_counter() - t)"
)


def side_by_side_slowdown(copies: int = 2, iterations: int = 20_000_000, repeats: int = 3) -> dict[str, Any]:
    """How much longer a CPU-bound process takes while ``copies`` run at once than alone: the medians of
    ``repeats`` rounds, each timing one copy alone, then ``copies`` together (every copy's time counts).
    ``copies`` over the ratio caps the speed-up of any ``copies``-way parallel work on this machine now."""
    command = [sys.executable, "-c", _SPIN.format(n=iterations)]

    def together(n: int) -> list[float]:
        procs = [subprocess.Popen(command, stdout=subprocess.PIPE, text=True) for _ in range(n)]
        return [float(p.communicate()[0]) for p in procs]

    alone, shared = [], []
    for _ in range(repeats):
        alone += together(1)
        shared += together(copies)
    ratio = statistics.median(shared) / statistics.median(alone)
    return {
        "copies": copies,
        "alone_seconds": statistics.median(alone),
        "together_seconds": statistics.median(shared),
        "slowdown": ratio,
        "speedup_ceiling": copies / ratio,
    }
