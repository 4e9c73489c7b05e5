"""``python -m benchmarks.eval MODEL [--out-dir docs/benchmarks] [--limit N]``: what ``nox -s eval-<model>`` runs.

Every configuration runs the shipped tasks (``L1_TASKS``) through ``lm_eval.simple_evaluate`` with the
same ``max_length``, so the same prompts and the same rolling windows are scored. Writes
``eval-<model>.md`` and ``.json`` and exits 1 if the pass rule fails:

- every FP32 configuration of ours (eager, compiled, TP): each accuracy task within 1 question of HF
  FP32, and the docstring perplexity within 1e-4 relative of HF's;
- BF16: perplexity within 2% relative of HF FP32's;
- compiled: the runner actually ran compiled graphs.

The TP configuration uses TP=2 when the model's attention heads split over two ranks, else the smallest
degree that splits them (SmolLM2-135M has 9 query and 3 KV heads: TP=3, three ranks on the cores there are).
``--render eval-<model>.json`` rewrites the page from a saved JSON without running anything.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from .page import write_page
from .run import configs, evaluate


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.eval", description=__doc__.split("\n")[0])
    parser.add_argument(
        "model", help="plugin name (llama3 evaluates the SmolLM2-135M-Instruct real checkpoint)"
    )
    parser.add_argument(
        "--checkpoint", help="checkpoint folder (default for llama3: `trnmodels real-weights`)"
    )
    parser.add_argument("--out-dir", default="docs/benchmarks")
    parser.add_argument("--batch-size", type=int, default=8, help="the hf model's batch size")
    parser.add_argument("--limit", type=int, help="documents per task (a smoke run; the page says so)")
    parser.add_argument("--cache-dir", help="compiled artifacts (default: the artifact cache's)")
    parser.add_argument(
        "--configs", help="comma-separated subset of " + ",".join(c.name for c in configs("", 1))
    )
    parser.add_argument("--render", metavar="JSON", help="only rewrite the page from a saved JSON")
    args = parser.parse_args(argv)
    if args.render:
        data = json.loads(Path(args.render).read_text())
        write_page(data, Path(args.render).with_suffix(".md"))
        return 0 if data["passed"] else 1

    checkpoint = args.checkpoint
    if checkpoint is None:
        if args.model != "llama3":
            parser.error(f"no real checkpoint ships for {args.model}: pass --checkpoint PATH")
        from trnmodels.core.real_weights import real_checkpoint

        checkpoint = str(real_checkpoint()[0])
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

    data = evaluate(
        args.model,
        checkpoint,
        batch_size=args.batch_size,
        limit=args.limit,
        cache_dir=args.cache_dir,
        only=set(args.configs.split(",")) if args.configs else None,
    )
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = out_dir / f"eval-{args.model}"
    stem.with_suffix(".json").write_text(json.dumps(data, indent=2, default=str) + "\n")
    print(write_page(data, stem.with_suffix(".md")))
    print(f"wrote {stem}.md and {stem}.json: {'PASS' if data['passed'] else 'FAIL'}")
    return 0 if data["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
