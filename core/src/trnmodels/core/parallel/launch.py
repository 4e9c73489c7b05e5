"""Run a function on N local ranks over gloo (the CPU stand-in for a Trainium instance's cores).

``run_on_ranks(fn, world, *args)`` spawns the ranks, initialises torch.distributed on loopback and
the parallel state, and returns rank 0's result. ``world`` is a rank count (all TP) or a
``ParallelLayout`` (TP x EP x CP x CFG mesh). A failing rank's traceback is raised in the caller.
World size 1 runs in-process with no process group.
"""

from __future__ import annotations

import os
import socket
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from ..errors import TrnModelsError
from .state import ParallelLayout, destroy_parallel_state, init_parallel_state

T = TypeVar("T")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _init_layout(layout: ParallelLayout) -> None:
    init_parallel_state(layout.tp, ep_degree=layout.ep, cp_degree=layout.cp, cfg_degree=layout.cfg)


def _rank_main(
    rank: int, layout: ParallelLayout, port: int, result_path: str, fn: Callable[..., Any], args: tuple
) -> None:
    world_size = layout.world_size
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    # Ranks share the host's cores; more threads than that per rank only contend.
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world_size))
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        _init_layout(layout)
        try:
            result = fn(rank, world_size, *args)
        except TrnModelsError as e:
            # A user error (bad config, bad checkpoint): hand it to the caller as itself, not as a
            # traceback from a child process. Every rank raises the same one; the first write wins.
            if not os.path.exists(_error_path(result_path)):
                torch.save(e, _error_path(result_path))
            raise
        if rank == 0:
            torch.save(result, result_path)
        # Tear down together: a rank that exits while a peer still talks to it aborts the peer.
        dist.barrier()
    finally:
        destroy_parallel_state()
        dist.destroy_process_group()


def _error_path(result_path: str) -> str:
    return result_path + ".error"


def run_on_ranks(fn: Callable[..., T], world: int | ParallelLayout, *args: Any) -> T:
    """Call ``fn(rank, world_size, *args)`` on every rank; ``fn`` must be importable (module level)."""
    layout = world if isinstance(world, ParallelLayout) else ParallelLayout(tp=world)
    world_size = layout.world_size
    if world_size == 1:
        _init_layout(layout)
        return fn(0, 1, *args)
    with tempfile.TemporaryDirectory(prefix="trnmodels-ranks-") as tmp:
        result_path = str(Path(tmp) / "rank0.pt")
        try:
            mp.start_processes(
                _rank_main,
                args=(layout, _free_port(), result_path, fn, args),
                nprocs=world_size,
                join=True,
                start_method="spawn",
            )
        except mp.ProcessRaisedException:
            if os.path.exists(_error_path(result_path)):
                raise torch.load(_error_path(result_path), weights_only=False) from None
            raise
        return torch.load(result_path, weights_only=False)
