"""The ``trnmodels`` command line: this package builds the parser and dispatches; one module per subcommand.

- ``trnmodels logits CHECKPOINT_DIR --token-ids 1,2,3 [--prefill-len K] [--tp N] [--ep N] [--dtype D] --out F``
- ``trnmodels generate CHECKPOINT_DIR --prompt TEXT [--prompt TEXT ...] --max-new-tokens N [--tp N]
  [--ep N] [--dtype D] [--temperature T --top-k K --top-p P --seed S] [--eager]``
- ``trnmodels compile CHECKPOINT_DIR [--tp N] [--ep N] [--cache-dir D] [--jobs J]``
- ``trnmodels video CHECKPOINT_DIR --prompt TEXT ... --out OUT.mp4`` (see ``video``)
- ``trnmodels real-weights [NAME] [--out DIR] [--rebuild]`` (see ``real_weights``)
- ``trnmodels info``
- ``trnmodels diff A B`` (Step 0 of a port, the architecture diff; see ``diff``)
- ``trnmodels validate CHECKPOINT_DIR [--prompt TEXT | --token-ids IDS] [--tp N] [--ep N] [--bisect]
  [--tasks]`` (Stage 4: L3, L2 and L1 against transformers; exit 1 when a level fails; see ``validate``);
  on a diffusers pipeline folder, every stage of one generation against diffusers
- ``trnmodels new NAME --from TEMPLATE --architecture HF_ARCH`` (Stages 1-2: the plugin scaffold; see ``new``)
- ``trnmodels plan CKPT_OR_CONFIG --instance NAME`` (Step 5 on paper, mesh memory, for LLMs and diffusion
  pipelines; see ``plan``)

``--ep`` splits MoE experts over ranks; a run uses ``tp * ep`` local ranks.

Every command takes ``--json``. Errors a user can cause print one line naming the problem and exit 2.
The subcommand modules import what they run only when they run, so ``--help`` starts in a moment.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from ..errors import TrnModelsError
from .compile import add_compile_parser
from .diff import add_diff_parser
from .generate import add_generate_parser
from .info import add_info_parser
from .logits import add_logits_parser
from .new import add_new_parser
from .plan import add_plan_parser
from .real_weights import add_real_weights_parser
from .validate import add_validate_parser
from .video import add_video_parser


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="trnmodels", description="Model plugins for vLLM on AWS Trainium.")
    sub = parser.add_subparsers(dest="command", required=True)
    # Each subcommand sets ``run`` (args -> result dict) and ``print_human`` (the output without --json).
    for add_parser in (
        add_logits_parser,
        add_generate_parser,
        add_compile_parser,
        add_video_parser,
        add_real_weights_parser,
        add_info_parser,
        add_diff_parser,
        add_plan_parser,
        add_validate_parser,
        add_new_parser,
    ):
        add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        result = args.run(args)
    except TrnModelsError as e:
        print(f"trnmodels {args.command}: error: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(result))
    else:
        args.print_human(result)
    # A command whose result is a verdict (validate) says so in its exit code.
    return args.exit_code(result) if hasattr(args, "exit_code") else 0
