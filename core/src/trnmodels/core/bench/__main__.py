"""``python -m trnmodels.core.bench MODEL [--out-dir docs/benchmarks] [--quick]``"""

from __future__ import annotations

import argparse
import sys

from .report import summary, write_report
from .run import QUICK, Settings, run_benchmark


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trnmodels.core.bench", description=__doc__)
    parser.add_argument("model", help="plugin name, e.g. llama3 (see `trnmodels info`)")
    parser.add_argument("--out-dir", default="docs/benchmarks", help="where <model>.md/.json/.png go")
    parser.add_argument("--quick", action="store_true", help="fewer repetitions: a smoke test, same figures")
    args = parser.parse_args(argv)

    from transformers.utils import logging

    logging.set_verbosity_error()
    logging.disable_progress_bar()
    results = run_benchmark(args.model, QUICK if args.quick else Settings())
    paths = write_report(results, args.out_dir)
    print(summary(results))
    print("wrote " + ", ".join(map(str, paths)), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
