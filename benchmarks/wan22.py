"""``python -m benchmarks.wan22 [--out-dir docs/benchmarks] [--quick]``: what ``nox -s bench-wan22`` runs.

On one small config (CPU mode, FP32), seven cases: a DiT step of ours eager, ours compiled (AOTInductor)
and diffusers' ``WanTransformer3DModel``; a VAE decode of ours and diffusers', untiled and tiled. For each:

- time: median over repeats after a warm-up, all cases in this process, one after the other;
- peak memory: median over repeats of the case alone in a fresh process (``run_in_fresh_process`` and
  ``case_memory`` of ``benchmarks.llm.measure``, glibc's mmap threshold fixed by ``EXACT_RSS_ENV``):
  the RSS its model holds, the peak its first pass adds, the peak above the process's post-import
  baseline, and the process's peak. In one process the allocator keeps the pages of earlier cases and
  warm-ups, and later cases reuse them, which hides their peaks.

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


def run(out_dir: Path, quick: bool) -> dict[str, Any]:
    from .llm.measure import EXACT_RSS_ENV, median_fields, run_in_fresh_process

    repeats = 1 if quick else 3
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="wan22-bench-") as tmp:
        work_dir = Path(tmp)
        save_checkpoints(work_dir)
        for name in CASES:
            if name == "dit_compiled":
                from trnmodels.wan22.transformer import WanDiT

                dit = WanDiT.from_pretrained(work_dir / "transformer", dtype=torch.float32)
                start = time.perf_counter()
                compile_ours(dit, work_dir / "cache")
                results["dit_compile_seconds"] = time.perf_counter() - start
                del dit
            seconds = measure(build_case(name, work_dir), repeats)
            # Right after the timing: the cache key holds a digest of the sources, so the child finds the
            # graph compiled above unless a source file changes in between.
            memory = median_fields(
                [
                    run_in_fresh_process("benchmarks.wan22:memory_case", name, tmp, env=EXACT_RSS_ENV)
                    for _ in range(repeats)
                ]
            )
            results[name] = {"seconds": seconds, "hwm_reset": memory.pop("hwm_reset")} | {
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
    report = {
        "config": {"dit": DIT, "vae": VAE, "latent": LATENT, "text_len": TEXT_LEN, "tiles": TILES},
        "host": {
            "machine": platform.machine(),
            "cpus": os.cpu_count(),
            "threads": torch.get_num_threads(),
            "load_average_1m": os.getloadavg()[0],
            "torch": torch.__version__,
        },
        "repeats": repeats,
        "quick": quick,
        "results": results,
        "ratios": ratios,
    }
    write(out_dir, report)
    return report


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
    n = report["repeats"]
    runs = (
        "one timed run and one memory process"
        if n == 1
        else f"the median of {n} timed runs and {n} memory processes"
    )
    lines = [
        "# Wan2.2 benchmark (CPU mode)",
        "",
        "Written by `nox -s bench-wan22` (`python -m benchmarks.wan22`). FP32 on CPU: how our graphs",
        "compare with diffusers on the same host, not NeuronCore figures. Config: a 4-layer DiT of width 512",
        "on 17 frames of 128x128 (320 tokens, 64 text tokens); a VAE of base width 32 decoding that video,",
        "untiled and tiled into 64 px tiles every 48 px.",
        "",
        f"Host: {host['cpus']} CPUs ({host['threads']} torch threads), load average {host['load_average_1m']:.1f} "
        f"at the end of the run (the machine is shared: absolute times are noisy, ratios less so), "
        f"torch {host['torch']}; {runs} per case (timing after a warm-up)"
        + (" (`--quick`)." if report.get("quick") else "."),
        "",
        "Time is measured in the benchmark's process, the cases one after the other. Memory is measured",
        "with each case alone in a fresh process (its imports done first), from the RSS high-water mark",
        "(`VmHWM`, reset before each phase), with glibc's mmap threshold fixed at 64 KiB",
        "(`MALLOC_MMAP_THRESHOLD_`) so freed tensors go back to the OS and a peak is that of live memory,",
        "repeatable from run to run (with the default, growing threshold one case varied by up to 50%).",
        "*model* is the RSS the loaded model and its inputs hold above",
        "the post-import baseline; *pass peak* is the most the first pass (one DiT step, one whole decode)",
        "adds above that, its activations and first-call caches; *peak added* is the highest RSS of loading",
        "and the pass above the baseline; *process peak* is the whole process's high-water mark, Python,",
        "torch and diffusers included. CPU RSS, not NeuronCore memory. diffusers' DiT is built from its",
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
