"""The CPU model runner: bucketed prefill and decode over the paged KV cache, sampling in the graph.

- :mod:`.config`: ``RunnerConfig`` (limits and bucket lists) and ``SamplingParams``;
- :mod:`.graphs`: the step graphs (one per phase and bucket) and their example inputs;
- :mod:`.engine`: ``Runner``, the scheduling loop;
- :mod:`.generate`: text in, text out, on every TP rank;
- :mod:`.score`: teacher-forced logits, for validation.
"""

from .config import RunnerConfig, SamplingParams
from .engine import Generation, Runner

__all__ = ["Generation", "Runner", "RunnerConfig", "SamplingParams"]
