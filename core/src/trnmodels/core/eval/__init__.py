"""L1 task-level accuracy through lm-evaluation-harness (``lm_eval``, the ``eval`` dependency group).

- :mod:`.lm_eval_model`: ``TrnModelsLM``, registered with lm_eval as ``trnmodels``;
- :mod:`.ranks`: one model per rank for a whole run (scoring and generation service);
- ``tasks/``: the offline tasks the project ships (``TASKS_DIR``, lm_eval's ``--include_path``);
- :mod:`.run`: one lm_eval run of a model configuration over the L1 tasks, and the pass rule's limits
  (``trnmodels validate``'s L1 level; the ``eval-<model>`` page, ``benchmarks/eval``, runs it too);
- ``python -m trnmodels.core.eval ARGS`` (or ``trnmodels-lm-eval ARGS``): lm_eval's own command line with
  the ``trnmodels`` model registered and ``TASKS_DIR`` included.

Importing this package does not import lm_eval; ``register()`` does.
"""

from __future__ import annotations

from pathlib import Path

TASKS_DIR = Path(__file__).with_name("tasks")
L1_TASKS = ("trnmodels_facts", "trnmodels_facts_gen", "trnmodels_pydoc_ppl")


def register() -> type:
    """Import lm_eval and register the ``trnmodels`` model with it; returns the model class."""
    try:
        from .lm_eval_model import TrnModelsLM
    except ImportError as e:  # lm_eval is an optional dependency (the `eval` group)
        if e.name is not None and e.name.split(".")[0] == "lm_eval":
            raise ImportError(
                "lm-evaluation-harness is not installed: `uv sync --group eval` (or `pip install lm-eval`)"
            ) from e
        raise
    return TrnModelsLM


__all__ = ["L1_TASKS", "TASKS_DIR", "register"]
