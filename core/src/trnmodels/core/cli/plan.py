"""``trnmodels plan CKPT_OR_CONFIG --instance NAME``: Step 5 of onboarding on paper, the memory of every mesh
of an instance (``onboarding.plan``)."""

from __future__ import annotations

import argparse
from typing import Any

from ..argtypes import positive_int
from ..runtime_config import DTYPES

GIB = 1 << 30


def cmd_plan(args: argparse.Namespace) -> dict[str, Any]:
    from ..onboarding.plan import plan

    return plan(
        args.source,
        args.instance,
        max_model_len=args.max_model_len,
        max_num_seqs=args.max_num_seqs,
        dtype=args.dtype,
    )


def _gib(n: int) -> str:
    return f"{n / GIB:.2f}"


def print_plan(result: dict[str, Any]) -> None:
    inst, settings = result["instance"], result["settings"]
    print(f"model: {result['source']}  [plugin {result['plugin']}: {result['architecture']}]")
    print(
        f"instance: {inst['name']}: {inst['chips']} x {inst['chip']}, {inst['cores']} NeuronCores "
        f"(LNC={inst['logical_neuroncore_config']}), {_gib(inst['hbm_bytes_per_core'])} GiB and "
        f"{inst['hbm_bandwidth_per_core'] / 1e9:.0f} GB/s HBM per core"
    )
    print(f"  source: {inst['source']}")
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


def add_plan_parser(sub: Any) -> None:
    """Register ``trnmodels plan`` on the CLI's subparsers."""
    from ..onboarding.instances import INSTANCES  # plain figures: no torch, so --help stays quick

    plan = sub.add_parser(
        "plan",
        help="Step 5 on paper: every mesh of an instance, its memory per NeuronCore and decode bound",
        description="For an LLM, every TP x EP (x DP) mesh of the instance's NeuronCores the model's plugin "
        "accepts, and for each the weights, KV cache and working memory per core against the core's HBM, "
        "whether it fits, and the decode step's weight bytes per core with its bandwidth bound. The bytes are "
        "the plugin's own model's, built on the meta device. Offline; no weights.",
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
        default=8,
        metavar="N",
        help="sequences in flight, each with a full-length KV cache (default: 8)",
    )
    plan.add_argument(
        "--dtype",
        choices=sorted(DTYPES),
        default="bfloat16",
        help="weights and KV cache dtype (default: bfloat16)",
    )
    plan.add_argument("--json", action="store_true", help="machine-readable output (one JSON object)")
    plan.set_defaults(run=cmd_plan, print_human=print_plan)
