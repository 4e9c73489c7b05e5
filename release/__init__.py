"""Per-package releases of the trnmodels monorepo: plan, gates, build, verify, publish to a local index,
install as a user would, compatibility matrix, record.

Run from the repository root through nox (``nox -s release-plan``, ``nox -s release-<package>``) or as
``python -m release``. Like ``benchmarks/``, this folder is part of no wheel.
"""
