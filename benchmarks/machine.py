"""The host a benchmark ran on, as every page records it."""

from __future__ import annotations

import importlib
import os
import platform
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
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


def busy_cpu_seconds() -> float:
    """Busy CPU seconds of the whole machine since boot, summed over its cores (/proc/stat)."""
    user, nice, system, _idle, _iowait, irq, softirq = map(int, Path("/proc/stat").read_text().split()[1:8])
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


def wait_until_quiet(
    max_busy_cores: float = 0.15,
    window: float = 0.5,
    timeout: float = 30.0,
    busy_seconds: Callable[[], float] = busy_cpu_seconds,
    sleep: Callable[[float], object] = time.sleep,
) -> dict[str, Any]:
    """Wait until the machine keeps fewer than ``max_busy_cores`` cores busy over a ``window``, or until
    ``timeout``: a vLLM server keeps a core busy for about a second after its last request (its engine
    polls for more work before it sleeps), which the next server measured would otherwise share. Returns
    the seconds waited, whether it became quiet, and the busy cores of the last window."""
    waited, busy = 0.0, float("inf")
    while waited < timeout:
        before = busy_seconds()
        sleep(window)
        waited += window
        busy = (busy_seconds() - before) / window
        if busy < max_busy_cores:
            return {"seconds": waited, "quiet": True, "busy_cores": busy}
    return {"seconds": waited, "quiet": False, "busy_cores": busy}


# A CPU-bound loop that touches no memory to speak of: what it loses beside a copy of itself is the
# share of the cores the machine gives two processes at once, not cache or bandwidth.
_SPIN = "s = 0\nfor i in range({n}): s += i"

# A translation unit shaped like the kernels AOTInductor writes for a CPU graph: Inductor's own prefix
# header, then vectorised loops for the optimiser. Two compilers side by side share the caches and the
# memory, which the loop above does not show.
_KERNEL = """extern "C" void kernel_{i}(const float* a, const float* b, float* out, long n) {{
  #pragma omp parallel for
  for (long x = 0; x < n; x += 16) {{
    auto u = at::vec::Vectorized<float>::loadu(a + x);
    auto w = at::vec::Vectorized<float>::loadu(b + x);
    (u * w + u.exp() / (w.abs() + at::vec::Vectorized<float>({i}.5f))).store(out + x);
  }}
  float total = 0;
  for (long x = 0; x < n; ++x) total += out[x] * {i};
  out[0] = total;
}}
"""


def _side_by_side(commands: Callable[[int], list[str]], copies: int, repeats: int) -> dict[str, Any]:
    """The medians of ``repeats`` rounds, each timing one process alone, then ``copies`` of it at once
    (every copy's own time counts). ``commands(i)`` is the command line of copy ``i``."""

    def together(n: int) -> list[float]:
        start = time.perf_counter()
        procs = [subprocess.Popen(commands(i)) for i in range(n)]
        seconds = [0.0] * n

        def wait(i: int) -> None:
            if procs[i].wait():
                raise RuntimeError(f"{' '.join(commands(i))} failed (exit code {procs[i].returncode})")
            seconds[i] = time.perf_counter() - start

        with ThreadPoolExecutor(n) as pool:
            list(pool.map(wait, range(n)))
        return seconds

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


def side_by_side_slowdown(copies: int = 2, iterations: int = 20_000_000, repeats: int = 3) -> dict[str, Any]:
    """How much longer a CPU-bound process takes while ``copies`` run at once than alone (``_side_by_side``).
    ``copies`` over the ratio caps the speed-up of any ``copies``-way parallel work on this machine now."""
    return _side_by_side(lambda _: [sys.executable, "-c", _SPIN.format(n=iterations)], copies, repeats)


def compiler_side_by_side_slowdown(copies: int = 2, kernels: int = 120, repeats: int = 3) -> dict[str, Any]:
    """The same for the C++ compiler Inductor uses, on a translation unit of ``kernels`` vectorised loops
    like the ones it writes (``_KERNEL``): ``copies`` over the ratio caps a parallel compile's speed-up."""
    import torch
    from torch._inductor.cpp_builder import get_cpp_compiler

    capability = torch.backends.cpu.get_cpu_capability()
    with tempfile.TemporaryDirectory(prefix="trnmodels-compiler-probe-") as tmp:
        source = Path(tmp) / "kernels.cpp"
        source.write_text(
            "#include <torch/csrc/inductor/cpp_prefix.h>\n"
            + "".join(_KERNEL.format(i=i) for i in range(1, kernels + 1))
        )
        flags = [
            "-std=c++17", "-O3", "-march=native", "-fopenmp", "-fPIC", "-w",
            *([f"-DCPU_CAPABILITY_{capability}"] if capability != "DEFAULT" else []),
            "-I", str(Path(torch.__file__).parent / "include"), "-I", sysconfig.get_paths()["include"],
        ]  # fmt: skip
        compiler = get_cpp_compiler()
        figures = _side_by_side(
            lambda i: [compiler, *flags, "-c", str(source), "-o", str(Path(tmp) / f"{i}.o")],
            copies,
            repeats,
        )
    return figures | {"kernels": kernels}
