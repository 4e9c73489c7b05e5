"""lm_eval's own command line, with the ``trnmodels`` model registered and the project's tasks included.

    python -m trnmodels.core.eval --model trnmodels --model_args pretrained=CKPT,tp=2 --tasks trnmodels_l1
    trnmodels-lm-eval --model trnmodels --model_args pretrained=CKPT,dtype=bfloat16 --tasks trnmodels_facts

lm_eval 0.4 finds models only in its own registry (no entry-point group), so the plain ``lm_eval``
script cannot see an out-of-tree model. This registers ``trnmodels`` in that registry, adds
``--include_path`` for the shipped tasks unless one is given, and runs ``lm_eval.__main__.cli_evaluate``
unchanged: every other argument and behaviour is lm_eval's.
"""

from __future__ import annotations

import sys

from . import TASKS_DIR, register


def lm_eval_argv(argv: list[str]) -> list[str]:
    """``argv`` with ``--include_path TASKS_DIR`` added unless one is given (after the subcommand; lm_eval
    inserts ``run`` when there is none, and so does this)."""
    args = list(argv)
    if "--include_path" in args or any(a.startswith("--include_path=") for a in args):
        return args
    if args and args[0] in ("run", "ls", "validate"):
        args[1:1] = ["--include_path", str(TASKS_DIR)]
    elif args and args[0] not in ("-h", "--help"):
        args = ["run", "--include_path", str(TASKS_DIR), *args]
    return args


def main(argv: list[str] | None = None) -> None:
    register()
    from lm_eval.__main__ import cli_evaluate

    sys.argv = ["lm-eval", *lm_eval_argv(list(sys.argv[1:] if argv is None else argv))]
    cli_evaluate()


if __name__ == "__main__":
    main()
