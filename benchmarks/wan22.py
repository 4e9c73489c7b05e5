"""``python -m benchmarks.wan22 [--out-dir docs/benchmarks] [--quick]``: what ``nox -s bench-wan22`` runs.

On one small config (CPU mode, FP32), seven cases: a DiT step of ours eager, ours compiled (AOTInductor)
and diffusers' ``WanTransformer3DModel``; a VAE decode of ours and diffusers', untiled and tiled. For each:

- time: median over repeats after a warm-up, the DiT cases and then the VAE cases each timed round by
  round (``measure_interleaved``) in a fresh process of their own, glibc's allocator fixed by
  ``TIMING_ENV``;
- peak memory: median over repeats of the case alone in a fresh process (``run_in_fresh_process`` and
  ``case_memory`` of ``benchmarks.llm.measure``, glibc's mmap threshold fixed by ``EXACT_RSS_ENV``):
  the RSS its model holds, the peak its first pass adds (the libraries' code made resident before it,
  ``fault_in_library_code``), the peak above the process's post-import baseline, and the process's
  peak. In one process the allocator keeps the pages of earlier cases and warm-ups, and later cases
  reuse them, which hides their peaks.

Writes ``wan22.md``, ``wan22.json`` and ``wan22.png`` (the ratios) into ``--out-dir``. CPU timings say how
our graphs compare with the reference on the same host, not what a NeuronCore does.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from .llm.report import Target
from .machine import machine_info

# The small config: a 4-layer DiT of width 512 on a 17-frame 128x128 video (5x16x16 latents -> 320 tokens),
# and a VAE of base width 32 decoding it, untiled and tiled into 64 px tiles every 48 px.
DIT = dict(
    patch_size=(1, 2, 2),
    num_attention_heads=8,
    attention_head_dim=64,
    in_channels=16,
    out_channels=16,
    text_dim=512,
    freq_dim=256,
    ffn_dim=2048,
    num_layers=4,
    cross_attn_norm=True,
    qk_norm="rms_norm_across_heads",
    eps=1e-6,
    rope_max_seq_len=1024,
)
VAE = dict(
    base_dim=32, z_dim=16, dim_mult=[1, 2, 4, 4], num_res_blocks=2, temperal_downsample=[False, True, True]
)
LATENT = (16, 5, 16, 16)
TEXT_LEN = 64
TILES = dict(
    tile_sample_min_height=64,
    tile_sample_min_width=64,
    tile_sample_stride_height=48,
    tile_sample_stride_width=48,
)


CASES = (
    "dit_diffusers",
    "dit_eager",
    "dit_compiled",
    "vae_decode_diffusers",
    "vae_decode_untiled",
    "vae_decode_tiled",
    "vae_decode_diffusers_tiled",
)


def save_checkpoints(work_dir: Path) -> None:
    """Random diffusers DiT and VAE in ``work_dir/transformer`` and ``work_dir/vae``; the cases load them."""
    from diffusers import AutoencoderKLWan, WanTransformer3DModel

    torch.manual_seed(0)
    WanTransformer3DModel(**DIT).save_pretrained(work_dir / "transformer")
    AutoencoderKLWan(**VAE).save_pretrained(work_dir / "vae")


def compile_ours(dit: Any, cache_dir: Path) -> list[Any]:
    from trnmodels.wan22.transformer import compile_dit

    return compile_dit(
        dit,
        model_name="wan22_transformer",
        batch_size=1,
        latent_shape=LATENT[1:],
        text_len=TEXT_LEN,
        cache_dir=cache_dir,
    )


def load_reference(cls: Any, path: Path) -> Any:
    """A diffusers model from ``save_pretrained`` output: built from its config (random init), then its
    state dict loaded. The DiT's ``from_pretrained`` needs accelerate (for its FP32-kept modules), which
    the bench environment does not have."""
    from safetensors.torch import load_file

    model = cls.from_config(cls.load_config(path))
    model.load_state_dict(load_file(path / "diffusion_pytorch_model.safetensors"))
    return model.eval()


def build_case(name: str, work_dir: Path) -> Callable[[], Any]:
    """Load the case's model from ``work_dir`` and make its inputs; the returned callable is one pass.
    ``dit_compiled`` loads the graph from ``work_dir/cache``, where ``run`` compiled it."""
    from diffusers import AutoencoderKLWan, WanTransformer3DModel

    from trnmodels.wan22.transformer import WanDiT
    from trnmodels.wan22.vae import Wan22VAE

    if name not in CASES:
        raise ValueError(f"unknown case {name!r}; expected one of {', '.join(CASES)}")
    gen = torch.Generator().manual_seed(1)
    if name.startswith("dit_"):
        x = torch.randn(1, *LATENT, generator=gen)
        t = torch.tensor([500], dtype=torch.int64)
        text = torch.randn(1, TEXT_LEN, DIT["text_dim"], generator=gen)
        if name == "dit_diffusers":
            ref = load_reference(WanTransformer3DModel, work_dir / "transformer")
            return lambda: ref(x, t, text, return_dict=False)
        ours = WanDiT.from_pretrained(work_dir / "transformer", dtype=torch.float32)
        if name == "dit_compiled":
            misses = [r.name for r in compile_ours(ours, work_dir / "cache") if r.cache != "hit"]
            if misses:  # a compile here would be measured as the case's memory
                raise RuntimeError(
                    f"dit_compiled: {misses} not in the compile cache {work_dir / 'cache'} "
                    "(did a core or plugin source file change since the bench compiled it?)"
                )
        return lambda: ours(x, t, text)
    z = torch.randn(1, *LATENT, generator=gen)  # the DiT's video: 17 frames of 128x128
    cls = AutoencoderKLWan if "diffusers" in name else Wan22VAE
    vae = cls.from_pretrained(work_dir / "vae").eval()
    if name.endswith("_tiled"):
        vae.enable_tiling(**TILES)
    return lambda: vae.decode(z)


def time_linear(rows: int, in_features: int, out_features: int, repeats: int = 10) -> dict[str, float]:
    """One FP32 ``rows x in_features -> out_features`` projection with bias, alone, on each of torch's two
    CPU FP32 GEMMs: MKL's SGEMM (``F.linear``, where core keeps FP32 calls of more than one row) and
    oneDNN's inner product. Per GEMM, the median seconds of ``repeats`` after a warm-up and the largest
    error against a float64 truth."""
    x, w, b = (
        torch.randn(rows, in_features),
        torch.randn(out_features, in_features) / in_features**0.5,
        torch.randn(out_features),
    )
    truth = F.linear(x.double(), w.double(), b.double())
    calls = {"sgemm": lambda: F.linear(x, w, b)}
    if torch.backends.mkldnn.is_available():
        calls["onednn"] = lambda: torch.ops.mkldnn._linear_pointwise(x, w, b, "none", [], "")
    figures = {}
    for name, call in calls.items():
        figures[name] = measure(call, repeats)
        with torch.no_grad():
            figures[f"{name}_error"] = (call().double() - truth).abs().max().item()
    return figures


def projection_floor(model: torch.nn.Module, step: Callable[[], Any]) -> dict[str, float]:
    """What ``step``'s projections (every ``nn.Linear`` call of ``model``) cost alone: their count, their
    FLOPs (2 x rows x in x out), the sum of their times on SGEMM (``seconds``: what no implementation
    doing the same FP32 arithmetic on the GEMM both models use can beat) and on oneDNN
    (``onednn_seconds``), each distinct shape timed by ``time_linear``, and the largest ratio of
    oneDNN's error to SGEMM's over those shapes; and the matmul FLOPs of the step's attention
    (``attention_flops``: QKᵀ and PV of every ``F.scaled_dot_product_attention`` call)."""
    shapes: list[tuple[int, int, int]] = []
    attention: list[int] = []

    def record(module: torch.nn.Module, args: tuple[Any, ...], _out: Any) -> None:
        shapes.append((args[0].numel() // module.in_features, module.in_features, module.out_features))

    sdpa = torch.nn.functional.scaled_dot_product_attention

    def counted_sdpa(
        query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *args: Any, **kwargs: Any
    ) -> Any:
        # torch's own parameter names: diffusers passes them by keyword. Every query head of every batch
        # row: 2 FLOPs per multiply-add, Lq x Lk x (Dqk + Dv) of them.
        q, k, v = query.shape, key.shape, value.shape
        attention.append(2 * q[:-2].numel() * q[-2] * k[-2] * (q[-1] + v[-1]))
        return sdpa(query, key, value, *args, **kwargs)

    hooks = [m.register_forward_hook(record) for m in model.modules() if isinstance(m, torch.nn.Linear)]
    torch.nn.functional.scaled_dot_product_attention = counted_sdpa
    try:
        with torch.no_grad():
            step()
    finally:
        torch.nn.functional.scaled_dot_product_attention = sdpa
        for hook in hooks:
            hook.remove()
    figures = {shape: time_linear(*shape) for shape in set(shapes)}
    floor = {
        "calls": len(shapes),
        "flops": sum(2 * r * i * o for r, i, o in shapes),
        "seconds": sum(figures[shape]["sgemm"] for shape in shapes),
        "attention_flops": sum(attention),
    }
    if all("onednn" in f for f in figures.values()):
        floor["onednn_seconds"] = sum(figures[shape]["onednn"] for shape in shapes)
        floor["onednn_error_ratio"] = max(f["onednn_error"] / f["sgemm_error"] for f in figures.values())
    return floor


def dit_projection_floor(work_dir: Path) -> dict[str, float]:
    """``projection_floor`` of diffusers' DiT step on the bench input (the same projections as ours)."""
    from diffusers import WanTransformer3DModel

    ref = load_reference(WanTransformer3DModel, work_dir / "transformer")
    gen = torch.Generator().manual_seed(1)
    x, text = torch.randn(1, *LATENT, generator=gen), torch.randn(1, TEXT_LEN, DIT["text_dim"], generator=gen)
    return projection_floor(ref, lambda: ref(x, torch.tensor([500]), text, return_dict=False))


def vae_cache_mb(work_dir: Path) -> float:
    """The feature caches a steady decode chunk carries (one per causal convolution), in MB."""
    from trnmodels.wan22.vae import DECODER, Wan22VAE

    vae = Wan22VAE.from_pretrained(work_dir / "vae")
    _, shapes = vae.cache_spec(DECODER, (1, LATENT[0], 1, *LATENT[2:]), torch.float32)
    return sum(4 * torch.Size(shape).numel() for shape in shapes) / 2**20


def memory_case(name: str, work_dir: str) -> dict[str, Any]:
    """``name``'s memory, in a fresh process started by ``run``: imports first, so the baseline holds them."""
    import diffusers  # noqa: F401

    import trnmodels.wan22.transformer
    import trnmodels.wan22.vae  # noqa: F401

    from .llm.measure import case_memory

    return case_memory(lambda: build_case(name, Path(work_dir)))


def measure(fn: Callable[[], Any], repeats: int) -> float:
    """Median seconds of ``fn`` over ``repeats`` after a warm-up."""
    with torch.no_grad():
        fn()
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
    return statistics.median(times)


# The cases a ratio compares are timed round by round (each once per round, in a rotating order), so a
# slow spell of the shared machine falls on all of them rather than on whichever ran at the time.
TIMED_TOGETHER = (CASES[:3], CASES[3:])


def measure_interleaved(fns: dict[str, Callable[[], Any]], repeats: int) -> dict[str, float]:
    """Median seconds of each of ``fns`` over ``repeats`` rounds after a warm-up of each; round ``i`` runs
    them in the order rotated by ``i``."""
    names = list(fns)
    times: dict[str, list[float]] = {name: [] for name in names}
    with torch.no_grad():
        for fn in fns.values():
            fn()
        for i in range(repeats):
            for name in names[i % len(names) :] + names[: i % len(names)]:
                start = time.perf_counter()
                fns[name]()
                times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


# glibc's default mmap and trim thresholds move with what a process has freed before, so a case's time
# depended on which cases ran earlier in the process (measured: the untiled VAE decode took 1.18x
# diffusers' after the DiT cases in one process, 0.96-1.00x in a process of its own). The timing processes
# fix them instead, the same for every case: large buffers come from the heap (the mmap threshold at
# glibc's 32 MiB cap) and freed memory stays there for reuse (no trimming), as in a long-running server.
TIMING_ENV = {"MALLOC_MMAP_THRESHOLD_": str(32 << 20), "MALLOC_TRIM_THRESHOLD_": str(1 << 30)}


def timing_group(names: list[str], work_dir: str, repeats: int) -> dict[str, float]:
    """``measure_interleaved`` of the cases ``names``, in a fresh process started by ``run``."""
    return measure_interleaved({name: build_case(name, Path(work_dir)) for name in names}, repeats)


def run(out_dir: Path, quick: bool) -> dict[str, Any]:
    from .llm.measure import EXACT_RSS_ENV, cpu_seconds, median_fields, run_in_fresh_process

    machine_start, own_start, wall_start = *cpu_seconds(), time.perf_counter()

    repeats = 1 if quick else 3
    # A DiT step takes a tenth of a second: more timed runs cost little and steady its median on a
    # shared machine.
    dit_repeats = repeats * 5
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="wan22-bench-") as tmp:
        work_dir = Path(tmp)
        save_checkpoints(work_dir)
        results["dit_projections"] = dit_projection_floor(work_dir)
        results["vae_cache_mb"] = vae_cache_mb(work_dir)
        from trnmodels.wan22.transformer import WanDiT

        dit = WanDiT.from_pretrained(work_dir / "transformer", dtype=torch.float32)
        start = time.perf_counter()
        compile_ours(dit, work_dir / "cache")
        results["dit_compile_seconds"] = time.perf_counter() - start
        del dit
        for group in TIMED_TOGETHER:
            dit_group = group[0].startswith("dit_")
            seconds = run_in_fresh_process(
                "benchmarks.wan22:timing_group",
                list(group),
                tmp,
                dit_repeats if dit_group else repeats,
                env=TIMING_ENV,
            )
            # Right after the compile: the cache key holds a digest of the sources, so the children find
            # the graph compiled above unless a source file changes in between.
            for name in group:
                memory = median_fields(
                    [
                        run_in_fresh_process("benchmarks.wan22:memory_case", name, tmp, env=EXACT_RSS_ENV)
                        for _ in range(repeats)
                    ]
                )
                results[name] = {"seconds": seconds[name], "hwm_reset": memory.pop("hwm_reset")} | {
                    f"{k}_mb": v / 2**20 for k, v in memory.items()
                }

    d = results
    ratios = {
        "dit eager / diffusers (time)": d["dit_eager"]["seconds"] / d["dit_diffusers"]["seconds"],
        "dit compiled / diffusers (time)": d["dit_compiled"]["seconds"] / d["dit_diffusers"]["seconds"],
        "vae untiled / diffusers (time)": d["vae_decode_untiled"]["seconds"]
        / d["vae_decode_diffusers"]["seconds"],
        "vae tiled / untiled (time)": d["vae_decode_tiled"]["seconds"] / d["vae_decode_untiled"]["seconds"],
        "vae untiled / diffusers (decode peak)": d["vae_decode_untiled"]["pass_added_mb"]
        / max(d["vae_decode_diffusers"]["pass_added_mb"], 1e-9),
        "vae tiled / untiled (decode peak)": d["vae_decode_tiled"]["pass_added_mb"]
        / max(d["vae_decode_untiled"]["pass_added_mb"], 1e-9),
    }
    machine_end, own_end = cpu_seconds()
    wall = time.perf_counter() - wall_start
    cpu = machine_info(())
    report = {
        "config": {"dit": DIT, "vae": VAE, "latent": LATENT, "text_len": TEXT_LEN, "tiles": TILES},
        "host": {
            "machine": platform.machine(),
            # Which CPU: its vendor decides MKL's code paths, and so much of what the graphs are compared with.
            "cpu": cpu["cpu"],
            "cpu_capability": cpu["cpu_capability"],
            "cpus": os.cpu_count(),
            "threads": torch.get_num_threads(),
            "load_average_1m": os.getloadavg()[0],
            # What the machine was busy with beyond this run and its memory processes, in cores.
            "other_processes_cores": max(0.0, (machine_end - machine_start) - (own_end - own_start)) / wall,
            "torch": torch.__version__,
        },
        "repeats": repeats,
        "dit_repeats": dit_repeats,
        "quick": quick,
        "results": results,
        "ratios": ratios,
    }
    write(out_dir, report)
    return report


def targets(report: dict[str, Any]) -> list[Target]:
    """Issue 16's Wan2.2 targets, from one run: the compiled DiT step at least 1.5x diffusers' speed; the
    untiled VAE decode no slower than diffusers' and adding no more memory at its peak."""
    r = report["results"]
    dit, vae, ours_vae = r["dit_diffusers"], r["vae_decode_diffusers"], r["vae_decode_untiled"]
    return [
        Target(
            "dit",
            "DiT step, compiled: diffusers' time ÷ ours",
            dit["seconds"] / r["dit_compiled"]["seconds"],
            ">=",
            1.5,
        ),
        Target(
            "vae_time",
            "VAE decode, untiled: ours ÷ diffusers' time",
            ours_vae["seconds"] / vae["seconds"],
            "<=",
            1.0,
        ),
        Target(
            "vae_peak",
            "VAE decode, untiled: ours ÷ diffusers' pass peak",
            ours_vae["pass_added_mb"] / vae["pass_added_mb"],
            "<=",
            1.0,
        ),
    ]


def _why_dit(report: dict[str, Any]) -> str:
    r = report["results"]
    p = r["dit_projections"]
    floor, diffusers, ours = (
        1000 * x for x in (p["seconds"], r["dit_diffusers"]["seconds"], r["dit_compiled"]["seconds"])
    )
    need = diffusers / 1.5
    text = (
        f"A step's {p['calls']} projections are {p['flops'] / 1e9:.2f} GFLOP, the same in both models, and "
        "both run them on MKL's SGEMM (`F.linear`). Timed alone in this run they take "
        f"{floor:.1f} ms ({p['flops'] / p['seconds'] / 1e9:.0f} GFLOP/s): {floor / diffusers:.0%} of "
        f"diffusers' whole step ({diffusers:.1f} ms) and {floor / ours:.0%} of our compiled step "
        f"({ours:.1f} ms), which spends {ours - floor:.1f} ms on everything else (attention, norms, "
        f"modulation) where diffusers spends {diffusers - floor:.1f} ms. 1.5× diffusers is {need:.1f} ms"
    )
    if need < floor:
        text += (
            ", less than the projections alone: no implementation doing the same FP32 arithmetic on SGEMM "
            f"can reach it; the most any can reach is {diffusers / floor:.2f}× (everything but the "
            "projections free)."
        )
    else:
        text += (
            f", leaving {need - floor:.1f} ms beyond the projections where ours spends {ours - floor:.1f} ms."
        )
    # The attention's matmuls at the rate SGEMM reached on the projections: an estimate, not a timing.
    attention = floor * p.get("attention_flops", 0) / p["flops"]
    if attention:
        text += (
            f" The step's attention adds {p['attention_flops'] / 1e9:.2f} GFLOP of matmuls (QKᵀ and PV), "
            f"about {attention:.1f} ms at that rate: the step's matmuls alone take about "
            f"{floor + attention:.1f} ms"
        )
        if floor + attention > need:
            text += f", more than the {need:.1f} ms 1.5× diffusers allows."
        else:
            text += f", leaving {need - floor - attention:.1f} ms for everything else."
    if "onednn_seconds" in p:
        onednn = 1000 * p["onednn_seconds"]
        onednn_matmuls = onednn * (1 + attention / floor)
        text += (
            f" oneDNN's inner product would run the same projections in {onednn:.1f} ms "
            f"({p['flops'] / p['onednn_seconds'] / 1e9:.0f} GFLOP/s)"
        )
        if attention and onednn_matmuls > need:
            text += f", and the step's matmuls at its rate in about {onednn_matmuls:.1f} ms, still more than 1.5× allows"
        text += (
            f"; its largest error against a float64 truth was up to {p['onednn_error_ratio']:.1f}× "
            "SGEMM's on these shapes (it sums in a coarser order), so core keeps FP32 calls of more than "
            "one row on SGEMM: no accuracy is traded for speed (`trnmodels/core/cpu/linear.py`)."
        )
    return text


def _why_vae_time(report: dict[str, Any]) -> str:
    r = report["results"]
    ours, ref = r["vae_decode_untiled"]["seconds"], r["vae_decode_diffusers"]["seconds"]
    return (
        f"Ours took {ours:.3f} s, diffusers {ref:.3f} s ({ours / ref - 1:+.1%}). Both run diffusers' "
        "convolution blocks over diffusers' cache list, frame by frame, and their convolutions get the "
        "same tensors, bit for bit (ours copies each causal convolution's input once, diffusers twice); "
        f"tiled, the same blocks took {r['vae_decode_tiled']['seconds']:.3f} s for ours and "
        f"{r['vae_decode_diffusers_tiled']['seconds']:.3f} s for diffusers. Nearly all of a decode is in "
        "those kernels (torch's native 3D convolution, which allocates its unfold buffer on every call, "
        "and the norms); this run does not attribute the difference further."
    )


def _why_vae_peak(report: dict[str, Any]) -> str:
    r = report["results"]
    ours, ref = r["vae_decode_untiled"]["pass_added_mb"], r["vae_decode_diffusers"]["pass_added_mb"]
    return (
        f"Ours adds {ours:.1f} MB at its peak, diffusers {ref:.1f} MB ({ours - ref:+.1f} MB), library code "
        "not counted (made resident before the pass). The peak is in "
        "the last chunk's full-resolution convolutions, which ours runs from diffusers' blocks (imported) "
        f"over the same feature caches ({r['vae_cache_mb']:.1f} MB here); each causal convolution copies "
        "its input once, into its padded buffer, where diffusers' makes two copies. Below that, the blocks' own "
        "temporaries (each block's normalised and activated copies, the cache slices it clones) would "
        "have to reuse their buffers in place: diffusers' blocks rewritten, not done."
    )


EXPLANATIONS: dict[str, Callable[[dict[str, Any]], str]] = {
    "dit": _why_dit,
    "vae_time": _why_vae_time,
    "vae_peak": _why_vae_peak,
}


def targets_section(report: dict[str, Any]) -> list[str]:
    found = targets(report)
    lines = [
        "## Targets",
        "",
        "| target | measured | required | verdict |",
        "|---|---:|---:|---|",
        *(
            f"| {t.name} | {t.show(t.value)} | {t.op} {t.show(t.threshold)} | **{t.verdict}** |"
            for t in found
        ),
    ]
    for t in found:
        if not t.met:
            lines += [
                "",
                f"### {t.name}: {t.show(t.value)}, required {t.op} {t.show(t.threshold)}",
                "",
                EXPLANATIONS[t.key](report),
            ]
    return [*lines, ""]


def _cpu(host: dict[str, Any]) -> str:
    if "cpu" not in host:  # a page from before the CPU was recorded
        return ""
    return f"{host['cpu']} (torch CPU capability {host['cpu_capability']}), "


def _others(host: dict[str, Any]) -> str:
    if "other_processes_cores" not in host:  # a page from before the figure was recorded
        return f"load average {host['load_average_1m']:.1f} at the end of the run, this run's own included"
    return (
        f"other processes used {host['other_processes_cores']:.2f} of its cores on average during the run "
        "(the machine is a shared VM: absolute times are noisy, ratios less so)"
    )


def write(out_dir: Path, report: dict[str, Any]) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "wan22.json").write_text(json.dumps(report, indent=2, default=str))
    r, host = report["results"], report["host"]
    rows = [
        ("DiT step, diffusers", r["dit_diffusers"]),
        ("DiT step, ours eager", r["dit_eager"]),
        ("DiT step, ours compiled", r["dit_compiled"]),
        ("VAE decode, diffusers", r["vae_decode_diffusers"]),
        ("VAE decode, ours untiled", r["vae_decode_untiled"]),
        ("VAE decode, ours tiled", r["vae_decode_tiled"]),
        ("VAE decode, diffusers tiled", r["vae_decode_diffusers_tiled"]),
    ]
    n, dit_n = report["repeats"], report.get("dit_repeats", report["repeats"])
    runs = (
        "one timed run and one memory process"
        if n == 1
        else f"the median of {n} timed runs ({dit_n} for a DiT step) and {n} memory processes"
    )
    lines = [
        "# Wan2.2 benchmark (CPU mode)",
        "",
        "Written by `nox -s bench-wan22` (`python -m benchmarks.wan22`). FP32 on CPU: how our graphs",
        "compare with diffusers on the same host, not NeuronCore figures. Config: a 4-layer DiT of width 512",
        "on 17 frames of 128x128 (320 tokens, 64 text tokens); a VAE of base width 32 decoding that video,",
        "untiled and tiled into 64 px tiles every 48 px.",
        "",
        *targets_section(report),
        f"Host: {_cpu(host)}{host['cpus']} CPUs ({host['threads']} torch threads); {_others(host)}; "
        f"torch {host['torch']}; {runs} per case (timing after a warm-up)"
        + (" (`--quick`)." if report.get("quick") else "."),
        "",
        "Time is measured in two fresh processes, one for the three DiT cases and one for the four VAE",
        "cases, each timing its cases round by round (each once per round, in a rotating order), so a slow",
        "spell of the shared machine falls on every case compared rather than on whichever ran at the time.",
        "Both fix glibc's allocator the same for every case (`MALLOC_MMAP_THRESHOLD_` at its 32 MiB cap,",
        "`MALLOC_TRIM_THRESHOLD_` at 1 GiB: large buffers from the heap, freed memory kept for reuse, as in",
        "a long-running server): with the default, moving thresholds a case's time depended on the cases run",
        "before it in the process (the untiled VAE decode 1.18× diffusers' after the DiT cases, 0.96–1.00×",
        "alone). Memory is measured",
        "with each case alone in a fresh process (its imports done first), from the RSS high-water mark",
        "(`VmHWM`, reset before each phase), with glibc's mmap threshold fixed at 64 KiB",
        "(`MALLOC_MMAP_THRESHOLD_`) so freed tensors go back to the OS and a peak is that of live memory,",
        "repeatable from run to run (with the default, growing threshold one case varied by up to 50%).",
        "*model* is the RSS the loaded model and its inputs hold above",
        "the post-import baseline; *pass peak* is the most the first pass (one DiT step, one whole decode)",
        "adds above that, its activations and first-call caches; *peak added* is the highest RSS of loading",
        "and the pass above the baseline; *process peak* is the whole process's high-water mark, Python,",
        "torch and diffusers included. Between the load and the pass, every loaded library's read-only",
        "pages (its code) are made resident (`fault_in_library_code`), so a pass peak is the memory the",
        "pass allocates and not the kernels it happens to call first: an op's first call maps the library",
        "code that runs it (torch's first `sum()` alone adds 2.3 MB of RSS, file-backed, 0.03 MB of it",
        "memory), and measured with it the two VAE decodes' peaks differed by the code of the ops each",
        "calls, not by their tensors. CPU RSS, not NeuronCore memory. diffusers' DiT is built from its",
        "config and then loads its state dict (its `from_pretrained` needs accelerate, not installed), so",
        "while loading it holds the weights twice: its *peak added* is not a fair comparison of loading.",
        "",
        "| what | median s | model (MB) | pass peak (MB) | peak added (MB) | process peak (MB) |",
        "|---|---:|---:|---:|---:|---:|",
        *(
            f"| {name} | {m['seconds']:.3f} | {m['build_added_mb']:.0f} | {m['pass_added_mb']:.0f} "
            f"| {m['peak_added_mb']:.0f} | {m['process_peak_mb']:.0f} |"
            for name, m in rows
        ),
        "",
        f"DiT compile (AOTInductor, one graph): {r['dit_compile_seconds']:.0f} s.",
        "",
        "| ratio | value |",
        "|---|---:|",
        *(f"| {k} | {v:.2f} |" for k, v in report["ratios"].items()),
        "",
        "![ratios](wan22.png)",
        "",
    ]
    (out_dir / "wan22.md").write_text("\n".join(lines))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.2))
    names, values = zip(*report["ratios"].items(), strict=True)
    ax.barh(names, values, color="#4c72b0")
    ax.axvline(1.0, color="k", lw=0.8)
    ax.set_xlabel("ratio (1.0 = parity)")
    ax.set_title("Wan2.2 on CPU: ours vs diffusers, tiled vs untiled")
    fig.tight_layout()
    fig.savefig(out_dir / "wan22.png", dpi=120)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.wan22", description=__doc__.split("\n")[0])
    parser.add_argument("--out-dir", type=Path, default=Path("docs/benchmarks"))
    parser.add_argument("--quick", action="store_true", help="fewer repeats (a smoke run)")
    args = parser.parse_args(argv)
    report = run(args.out_dir, args.quick)
    for k, v in report["ratios"].items():
        print(f"{k:<36} {v:6.2f}")
    print(f"wrote {args.out_dir / 'wan22.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
