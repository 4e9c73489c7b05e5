"""``trnmodels plan CKPT_OR_CONFIG --instance NAME``: Step 5 of onboarding on paper, the memory of every mesh
of an instance (``onboarding.plan``)."""

from __future__ import annotations

import argparse
from typing import Any

from ..argtypes import positive_int
from ..errors import ConfigError
from ..runtime_config import DTYPES

GIB = 1 << 30


LLM_FLAGS = ("max_model_len", "max_num_seqs")
DIFFUSION_FLAGS = ("num_frames", "height", "width", "max_sequence_length", "vae_dtype", "vae_patch_parallel")


def _refuse_flags(args: argparse.Namespace, names: tuple[str, ...], kind: str) -> None:
    given = [f"--{n.replace('_', '-')}" for n in names if getattr(args, n) is not None]
    if kind == "an LLM" and args.vae_tiling:
        given.append("--vae-tiling")
    if given:
        raise ConfigError(f"{', '.join(given)}: not an option for {kind} ({args.source})")


def cmd_plan(args: argparse.Namespace) -> dict[str, Any]:
    from ..omni.registry import refuse_pipeline_without_index
    from ..onboarding.plan import DEFAULT_MAX_NUM_SEQS, plan
    from ..onboarding.plan_diffusion import diffusion_folder, plan_diffusion

    refuse_pipeline_without_index(args.source)
    folder = diffusion_folder(args.source)
    if folder is not None:
        _refuse_flags(args, LLM_FLAGS, "a diffusion pipeline")
        return plan_diffusion(
            folder,
            args.instance,
            num_frames=args.num_frames,
            height=args.height,
            width=args.width,
            max_sequence_length=args.max_sequence_length,
            dtype=args.dtype,
            vae_dtype=args.vae_dtype or "float32",
            vae_tiling=args.vae_tiling,
            vae_patch_parallel=args.vae_patch_parallel or 1,
        )
    _refuse_flags(args, DIFFUSION_FLAGS, "an LLM")
    return plan(
        args.source,
        args.instance,
        max_model_len=args.max_model_len,
        max_num_seqs=args.max_num_seqs or DEFAULT_MAX_NUM_SEQS,
        dtype=args.dtype,
    )


def _gib(n: int) -> str:
    return f"{n / GIB:.2f}"


def _print_instance(inst: dict[str, Any]) -> None:
    print(
        f"instance: {inst['name']}: {inst['chips']} x {inst['chip']}, {inst['cores']} NeuronCores "
        f"(LNC={inst['logical_neuroncore_config']}), {_gib(inst['hbm_bytes_per_core'])} GiB and "
        f"{inst['hbm_bandwidth_per_core'] / 1e9:.0f} GB/s HBM per core"
    )
    print(f"  source: {inst['source']}")


def print_plan(result: dict[str, Any]) -> None:
    if result["kind"] == "diffusion":
        print_diffusion_plan(result)
        return
    inst, settings = result["instance"], result["settings"]
    print(f"model: {result['source']}  [plugin {result['plugin']}: {result['architecture']}]")
    _print_instance(inst)
    print(
        f"settings: {settings['dtype']}, max_model_len {settings['max_model_len']}, max_num_seqs "
        f"{settings['max_num_seqs']}, {settings['kv_blocks']} KV blocks of {settings['block_size']} tokens"
    )
    print("\nper core, GiB" + " " * 44 + "decode step")
    header = (
        f"  {'TP':>3} {'EP':>3} {'DP':>3}  {'weights':>8} {'KV':>8} {'working':>8} {'total':>8} {'HBM':>7}"
    )
    print(f"{header}  {'fits':<4}  {'weights':>8} {'bound ms':>9}")
    for m in result["meshes"]:
        print(
            f"  {m['tp']:>3} {m['ep']:>3} {m['dp']:>3}  {_gib(m['weight_bytes_per_core']):>8} "
            f"{_gib(m['kv_cache_bytes_per_core']):>8} {_gib(m['working_bytes_per_core']):>8} "
            f"{_gib(m['total_bytes_per_core']):>8} {_gib(m['hbm_bytes_per_core']):>7}  "
            f"{'yes' if m['fits'] else 'no':<4}  {_gib(m['decode_weight_bytes_per_core']):>8} "
            f"{m['decode_ms_bound']:>9.2f}"
        )
    if not result["meshes"]:
        print("  none: the plugin refuses every mesh of this instance")
    for r in result["refused"]:
        print(f"  refused TP {r['tp']} x EP {r['ep']}: {r['reason']}")
    print(
        "\nworking = one max_model_len prefill's activations + the logits (an estimate; the runtime's own "
        "reservation is not counted). bound = decode weights / the core's HBM bandwidth."
    )


def print_diffusion_plan(result: dict[str, Any]) -> None:
    s = result["settings"]
    print(f"pipeline: {result['source']}  [plugin {result['plugin']}: {result['architecture']}]")
    _print_instance(result["instance"])
    vae = "tiled" if s["vae_tiling"] else "untiled"
    print(
        f"settings: {s['num_frames']} frames of {s['height']}x{s['width']}, prompts of "
        f"{s['max_sequence_length']} tokens, {s['dtype']} (VAE {s['vae_dtype']}, {vae}, patch parallel "
        f"{s['vae_patch_parallel']})"
    )
    names = [c["name"] for c in result["meshes"][0]["components"]] if result["meshes"] else []
    print("\nper core, GiB: weights + working of each component; total on a VAE rank (the fullest)")
    print(
        f"  {'TP':>3} {'CP':>3} {'CFG':>3} {'DP':>3}  "
        + " ".join(f"{n:>22}" for n in names)
        + f"  {'total':>7} {'others':>7} {'HBM':>6}  fits"
    )
    for m in result["meshes"]:
        cells = " ".join(
            f"{_gib(c['weight_bytes']) + ' + ' + _gib(c['working_bytes']):>22}" for c in m["components"]
        )
        mark = "  <- release mesh" if m["release"] else ""
        print(
            f"  {m['tp']:>3} {m['cp']:>3} {m['cfg']:>3} {m['dp']:>3}  {cells}  "
            f"{_gib(m['total_bytes_per_core']):>7} {_gib(m['other_ranks_total_bytes']):>7} "
            f"{_gib(m['hbm_bytes_per_core']):>6}  {'yes' if m['fits'] else 'no':<4}{mark}"
        )
    if not result["meshes"]:
        print("  none: the pipeline refuses every mesh of this instance")
    by_reason: dict[str, list[str]] = {}
    for r in result["refused"]:
        by_reason.setdefault(r["reason"], []).append(f"{r['tp']}x{r['cp']}x{r['cfg']}")
    for reason, meshes in by_reason.items():
        print(f"  refused TPxCPxCFG {', '.join(meshes)}: {reason}")
    if result["meshes"]:
        print("")
        for c in result["meshes"][0]["components"]:
            where = "the VAE ranks" if c["vae_ranks_only"] else "every rank"
            print(f"  {c['name']} (on {where}): working = {c['working']}")
        print(
            "  total = every component's weights + the largest working set (components run in turn); "
            "others = a rank without the VAE"
        )


def add_plan_parser(sub: Any) -> None:
    """Register ``trnmodels plan`` on the CLI's subparsers."""
    from ..onboarding.instances import INSTANCES  # plain figures: no torch, so --help stays quick

    plan = sub.add_parser(
        "plan",
        help="Step 5 on paper: every mesh of an instance, its memory per NeuronCore and decode bound",
        description="For an LLM, every TP x EP (x DP) mesh of the instance's NeuronCores the model's plugin "
        "accepts, and for each the weights, KV cache and working memory per core against the core's HBM, "
        "whether it fits, and the decode step's weight bytes per core with its bandwidth bound. The bytes are "
        "the plugin's own model's, built on the meta device. For a diffusion pipeline (a folder holding "
        "model_index.json), every TP x CP x CFG mesh with each component's weights and working memory per "
        "core. Offline; no weights.",
    )
    plan.add_argument(
        "source", metavar="CKPT_OR_CONFIG", help="checkpoint folder, config.json path or bundled config name"
    )
    plan.add_argument(
        "--instance", required=True, metavar="NAME", help=f"the instance: {', '.join(INSTANCES)}"
    )
    plan.add_argument(
        "--max-model-len",
        type=positive_int,
        default=None,
        metavar="N",
        help="longest sequence (prompt + output) the KV cache holds "
        "(default: the config's max_position_embeddings, capped at 8192)",
    )
    plan.add_argument(
        "--max-num-seqs",
        type=positive_int,
        default=None,
        metavar="N",
        help="sequences in flight, each with a full-length KV cache (default: 8)",
    )
    plan.add_argument(
        "--dtype",
        choices=sorted(DTYPES),
        default="bfloat16",
        help="weights and KV cache dtype (default: bfloat16)",
    )
    video = plan.add_argument_group("diffusion pipelines (defaults: what the pipeline generates untold)")
    for flag, what in (
        ("--num-frames", "frames of the video"),
        ("--height", "video height in pixels"),
        ("--width", "video width in pixels"),
        ("--max-sequence-length", "prompt tokens the text encoder runs on"),
    ):
        video.add_argument(flag, type=positive_int, default=None, metavar="N", help=what)
    video.add_argument(
        "--vae-dtype", choices=sorted(DTYPES), default=None, help="the VAE's dtype (default: float32)"
    )
    video.add_argument("--vae-tiling", action="store_true", help="the VAE decodes in spatial tiles")
    video.add_argument(
        "--vae-patch-parallel",
        type=positive_int,
        default=None,
        metavar="P",
        help="the first P ranks decode the tiles together (default: 1)",
    )
    plan.add_argument("--json", action="store_true", help="machine-readable output (one JSON object)")
    plan.set_defaults(run=cmd_plan, print_human=print_plan)
