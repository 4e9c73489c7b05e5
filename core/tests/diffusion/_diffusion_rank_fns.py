"""Rank functions for ``test_diffusion_parallel.py`` (a plain module so spawned ranks can import it)."""

from __future__ import annotations

from trnmodels.core.diffusion import (
    CFGParallelMixin,
    allgather_self_attention,
    gather_sequence,
    ring_available,
    ring_self_attention,
    split_sequence,
    use_ring,
)
from trnmodels.core.errors import ConfigError
from trnmodels.core.parallel import destroy_parallel_state, get_cp_group, init_parallel_state


class _Pipe(CFGParallelMixin):
    pass


def cp_and_cfg_checks(rank: int, world_size: int, x, q, k, v, cond, uncond) -> list[dict]:
    """Context parallelism on a CP group of 2, then CFG parallelism on a CFG group of 2."""
    import torch.distributed as dist

    out: dict = {"rank": rank}
    cp = get_cp_group()
    chunk = split_sequence(x, cp, cp.rank_tensor())
    out["chunk"] = chunk
    out["regathered"] = gather_sequence(chunk, cp)
    scale = q.shape[-1] ** -0.5
    ql, kl, vl = (split_sequence(t, cp, cp.rank_tensor()) for t in (q, k, v))
    out["allgather"] = gather_sequence(allgather_self_attention(ql, kl, vl, cp, scale=scale), cp)
    out["ring_available"] = ring_available(cp)
    out["use_ring_auto"] = use_ring(cp, None)
    out["use_ring_off"] = use_ring(cp, False)
    out["ring"] = gather_sequence(ring_self_attention(ql, kl, vl, cp, scale=scale), cp)

    destroy_parallel_state()
    init_parallel_state(1, cfg_degree=2)
    pipe = _Pipe()
    calls = []

    def predict(embeds):
        calls.append(float(embeds.sum()))
        return embeds * 2.0

    out["cfg"] = pipe.predict_noise_with_cfg(predict, cond, uncond, 3.5)
    out["cfg_calls"] = calls
    try:
        pipe.predict_noise_with_cfg(predict, cond, None, 1.0)
        out["no_guidance_error"] = None
    except ConfigError as e:
        out["no_guidance_error"] = str(e)
    gathered = [None] * world_size
    dist.all_gather_object(gathered, out)
    return gathered
