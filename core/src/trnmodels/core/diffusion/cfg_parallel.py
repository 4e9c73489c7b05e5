"""Classifier-free guidance, sequential or split over the CFG group.

A pipeline's denoising loop asks for the guided noise prediction through
``predict_noise_with_cfg(predict, cond, uncond, guidance_scale)``, where ``predict(embeds)`` runs the
denoiser on one branch's conditioning. ``SequentialCFG`` runs both branches one after the other;
``CFGParallelMixin``, placed ahead of the upstream pipeline in the MRO
(``class P(CFGParallelMixin, UpstreamPipeline)``), runs one branch per rank of a CFG group of 2, gathers
both predictions and combines them on every rank, so every rank steps the scheduler identically. With a
CFG group of 1 it defers to the sequential form.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..errors import ConfigError, ShardingError
from ..parallel.state import ProcessGroupHandle, get_cfg_group

Predict = Callable[[Any], torch.Tensor]


def combine_cfg(cond: torch.Tensor, uncond: torch.Tensor, guidance_scale: float) -> torch.Tensor:
    """The guided prediction, in the order diffusers computes it (so FP32 results agree bit for bit)."""
    return uncond + guidance_scale * (cond - uncond)


class SequentialCFG:
    """Both branches on this rank; ``uncond=None`` means guidance is off (one branch)."""

    def predict_noise_with_cfg(
        self, predict: Predict, cond: Any, uncond: Any | None, guidance_scale: float
    ) -> torch.Tensor:
        noise = predict(cond)
        if uncond is None:
            return noise
        return combine_cfg(noise, predict(uncond), guidance_scale)


class CFGParallelMixin(SequentialCFG):
    """CFG rank 0 computes the conditional branch, rank 1 the unconditional one."""

    @property
    def cfg_group(self) -> ProcessGroupHandle:
        return get_cfg_group()

    @property
    def cfg_parallel_size(self) -> int:
        return self.cfg_group.world_size

    def check_cfg_parallel(self, do_classifier_free_guidance: bool) -> None:
        """Refuse a CFG group that has nothing to split (call before the denoising loop)."""
        size = self.cfg_parallel_size
        if size > 2:
            raise ShardingError(
                f"cfg_parallel_size={size}: classifier-free guidance has 2 branches, use 1 or 2"
            )
        if size == 2 and not do_classifier_free_guidance:
            raise ConfigError(
                "cfg_parallel_size=2 needs classifier-free guidance, but guidance is disabled "
                "(guidance_scale <= 1); raise guidance_scale or use cfg_parallel_size=1"
            )

    def predict_noise_with_cfg(
        self, predict: Predict, cond: Any, uncond: Any | None, guidance_scale: float
    ) -> torch.Tensor:
        cfg = self.cfg_group
        if cfg.world_size == 1:
            return super().predict_noise_with_cfg(predict, cond, uncond, guidance_scale)
        self.check_cfg_parallel(uncond is not None)
        mine = predict(cond if cfg.rank == 0 else uncond)
        both = cfg.all_gather(mine.unsqueeze(0), dim=0)
        return combine_cfg(both[0], both[1], guidance_scale)
