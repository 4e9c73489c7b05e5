"""The Wan2.2 pipelines as vLLM-Omni's diffusion engine serves them (the classes ``PIPELINE_REGISTRY`` names).

Each wraps the diffusers-style pipeline (``pipeline_class``) in core's engine adapter; vLLM-Omni looks up
the pre/post-process functions by name in this module, so core's are re-exported here.
"""

from __future__ import annotations

from trnmodels.core.omni.engine import (
    OmniDiffusionPipeline,
    get_post_process_func,
    get_pre_process_func,
)

from .pipeline_i2v import Wan22ImageToVideoPipeline
from .pipeline_t2v import Wan22Pipeline


class Wan22OmniPipeline(OmniDiffusionPipeline):
    pipeline_class = Wan22Pipeline


class Wan22I2VOmniPipeline(OmniDiffusionPipeline):
    pipeline_class = Wan22ImageToVideoPipeline


__all__ = ["Wan22I2VOmniPipeline", "Wan22OmniPipeline", "get_post_process_func", "get_pre_process_func"]
