"""``python -m trnmodels.wan22.bench [--out-dir docs/benchmarks] [--quick]``: what ``nox -s bench-wan22`` runs.

On one small config, in one process (CPU mode, FP32):

- per-step DiT time: ours eager, ours compiled (AOTInductor), diffusers' ``WanTransformer3DModel``;
- VAE decode time, untiled and tiled, ours and diffusers';
- peak memory added by each (RSS high-water mark, ``trnmodels.core.bench.measure.PeakMemory``).

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


def measure(fn: Callable[[], Any], repeats: int) -> dict[str, float]:
    from trnmodels.core.bench.measure import PeakMemory

    with torch.no_grad():
        fn()  # warm-up
        times = []
        with PeakMemory() as mem:
            for _ in range(repeats):
                start = time.perf_counter()
                fn()
                times.append(time.perf_counter() - start)
    return {"seconds": statistics.median(times), "peak_added_mb": mem.result["peak_added"] / 2**20}


def run(out_dir: Path, quick: bool) -> dict[str, Any]:
    from diffusers import AutoencoderKLWan, WanTransformer3DModel

    from trnmodels.wan22.transformer import WanDiT, compile_dit
    from trnmodels.wan22.vae import Wan22VAE

    repeats = 1 if quick else 3
    torch.manual_seed(0)
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="wan22-bench-") as tmp:
        ref_dit = WanTransformer3DModel(**DIT).eval()
        ref_dit.save_pretrained(Path(tmp) / "transformer")
        ours = WanDiT.from_pretrained(Path(tmp) / "transformer", dtype=torch.float32)
        x = torch.randn(1, *LATENT)
        t = torch.tensor([500], dtype=torch.int64)
        text = torch.randn(1, TEXT_LEN, DIT["text_dim"])
        results["dit_diffusers"] = measure(lambda: ref_dit(x, t, text, return_dict=False), repeats)
        results["dit_eager"] = measure(lambda: ours(x, t, text), repeats)
        start = time.perf_counter()
        compile_dit(
            ours,
            model_name="wan22_transformer",
            batch_size=1,
            latent_shape=LATENT[1:],
            text_len=TEXT_LEN,
            cache_dir=Path(tmp) / "cache",
        )
        results["dit_compile_seconds"] = time.perf_counter() - start
        results["dit_compiled"] = measure(lambda: ours(x, t, text), repeats)

        ref_vae = AutoencoderKLWan(**VAE).eval()
        ref_vae.save_pretrained(Path(tmp) / "vae")
        vae = Wan22VAE.from_pretrained(Path(tmp) / "vae").eval()
        z = torch.randn(1, *LATENT)  # the DiT's video: 17 frames of 128x128
        results["vae_decode_diffusers"] = measure(lambda: ref_vae.decode(z), repeats)
        results["vae_decode_untiled"] = measure(lambda: vae.decode(z), repeats)
        vae.enable_tiling(**TILES)
        ref_vae.enable_tiling(**TILES)
        results["vae_decode_tiled"] = measure(lambda: vae.decode(z), repeats)
        results["vae_decode_diffusers_tiled"] = measure(lambda: ref_vae.decode(z), repeats)

    d = results
    ratios = {
        "dit eager / diffusers (time)": d["dit_eager"]["seconds"] / d["dit_diffusers"]["seconds"],
        "dit compiled / diffusers (time)": d["dit_compiled"]["seconds"] / d["dit_diffusers"]["seconds"],
        "vae untiled / diffusers (time)": d["vae_decode_untiled"]["seconds"]
        / d["vae_decode_diffusers"]["seconds"],
        "vae tiled / untiled (time)": d["vae_decode_tiled"]["seconds"] / d["vae_decode_untiled"]["seconds"],
        "vae tiled / untiled (peak memory)": d["vae_decode_tiled"]["peak_added_mb"]
        / max(d["vae_decode_untiled"]["peak_added_mb"], 1e-9),
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
    lines = [
        "# Wan2.2 benchmark (CPU mode)",
        "",
        "Written by `nox -s bench-wan22` (`python -m trnmodels.wan22.bench`). FP32 on CPU: how our graphs",
        "compare with diffusers on the same host, not NeuronCore figures. Config: a 4-layer DiT of width 512",
        "on 17 frames of 128x128 (320 tokens, 64 text tokens); a VAE of base width 32 decoding that video,",
        "untiled and tiled into 64 px tiles every 48 px.",
        "",
        f"Host: {host['cpus']} CPUs ({host['threads']} torch threads), load average {host['load_average_1m']:.1f} "
        f"at the end of the run (the machine is shared: absolute times are noisy, ratios less so), "
        f"torch {host['torch']}; median of {report['repeats']} runs after a warm-up.",
        "",
        "| what | median s | peak RSS added (MB) |",
        "|---|---:|---:|",
        *(f"| {name} | {m['seconds']:.3f} | {m['peak_added_mb']:.0f} |" for name, m in rows),
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
    parser = argparse.ArgumentParser(
        prog="python -m trnmodels.wan22.bench", description=__doc__.split("\n")[0]
    )
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
