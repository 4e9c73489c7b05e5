"""``python -m benchmarks.llm MODEL [--out-dir docs/benchmarks] [--quick] [--workloads bench,real]``"""

from __future__ import annotations

import argparse
import sys

from .report import summary, write_report
from .run import QUICK, WORKLOADS, Settings, run_benchmark


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.llm", description=__doc__)
    parser.add_argument("model", help="plugin name, e.g. llama3 (see `trnmodels info`)")
    parser.add_argument("--out-dir", default="docs/benchmarks", help="where <model>.md/.json/.png go")
    parser.add_argument("--quick", action="store_true", help="fewer repetitions: a smoke test, same figures")
    parser.add_argument(
        "--workloads",
        help=f"comma-separated subset of {','.join(WORKLOADS)} (default: every workload the plugin has)",
    )
    args = parser.parse_args(argv)

    from transformers.utils import logging

    logging.set_verbosity_error()
    logging.disable_progress_bar()
    only = args.workloads.split(",") if args.workloads else None
    results = run_benchmark(args.model, QUICK if args.quick else Settings(), only)
    paths = write_report(results, args.out_dir)
    print(summary(results))
    print("wrote " + ", ".join(map(str, paths)), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
