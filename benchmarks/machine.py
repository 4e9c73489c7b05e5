"""The host a benchmark ran on, as every page records it."""

from __future__ import annotations

import importlib
import os
import platform
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
