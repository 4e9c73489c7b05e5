"""Session setup for every member's tests (core/tests, models/*/tests): the seed of the random test configs.

The tests that draw configs no test was written for (the plugin conformance kit, the plugins' logits
and generation tests) seed their ``random.Random`` from ``TRNMODELS_TEST_SEED``. The configs stay
random: a run without the variable gets a fresh seed here, before any test module reads it, so one seed
covers the whole run (and the processes it starts). Every run prints it, in the header and again in the
summary (which ``-q`` keeps), so a failure replays with ``TRNMODELS_TEST_SEED=<seed> pytest ...``.
"""

from __future__ import annotations

import os
import random

SEED_VARIABLE = "TRNMODELS_TEST_SEED"

if not os.environ.get(SEED_VARIABLE):
    os.environ[SEED_VARIABLE] = str(random.randrange(1 << 30))


def _seed_line() -> str:
    seed = os.environ[SEED_VARIABLE]
    return f"random test configs: {SEED_VARIABLE}={seed} (replay with {SEED_VARIABLE}={seed} pytest ...)"


def pytest_report_header(config) -> str:
    return _seed_line()


def pytest_terminal_summary(terminalreporter) -> None:
    terminalreporter.write_line(_seed_line())
