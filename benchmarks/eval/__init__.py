"""The L1 comparison page behind ``nox -s eval-<model>``: lm_eval's own ``hf`` model in FP32 against ours FP32,
BF16, compiled and TP>1. ``run`` measures (every configuration through ``trnmodels.core.eval.run`` and the pass
rule), ``page`` writes the markdown; ``python -m benchmarks.eval MODEL`` does both.
"""
