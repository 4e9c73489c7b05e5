"""Run a function on N local ranks over gloo (the CPU stand-in for a Trainium instance's cores).

``run_on_ranks(fn, world, *args)`` starts the ranks, initialises torch.distributed on loopback and
the parallel state, and returns rank 0's result. ``world`` is a rank count (all TP) or a
``ParallelLayout`` (TP x EP x CP x CFG mesh). A failing rank's traceback is raised in the caller.
World size 1 runs in-process with no process group.

Ranks are forked from multiprocessing's fork server, which imports torch and core's runner once per
calling process: a launch then costs a fork instead of fresh interpreters importing torch and
transformers (about 20 s a launch on two cores with ``spawn``), so a process that starts ranks many
times (a test run, an evaluation) pays the imports once. The server keeps the environment it started
with, so every launch hands the caller's current environment to its ranks.
"""

from __future__ import annotations

import multiprocessing
import os
import socket
import sys
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

START_METHOD = "forkserver"
# What the fork server imports before forking any rank: the costly imports every rank makes (building a
# model reads its transformers config class, whose module pulls in most of transformers).
_SERVER_PRELOAD = (
    "torch",
    "torch.distributed",
    "transformers.modeling_utils",
    "transformers.models.auto.modeling_auto",
    "trnmodels.core.runner.engine",
)
# Imported by the server too when the caller has imported them already (a diffusion pipeline's ranks).
_SERVER_PRELOAD_IF_IMPORTED = ("diffusers",)


def rank_context() -> multiprocessing.context.BaseContext:
    """The multiprocessing context ranks start in (queues handed to ranks are made from it)."""
    context = mp.get_context(START_METHOD)
    # Takes effect when the server starts (the first launch); later calls change nothing.
    preload = [*_SERVER_PRELOAD, *(name for name in _SERVER_PRELOAD_IF_IMPORTED if name in sys.modules)]
    context.set_forkserver_preload(preload)
    return context


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _init_layout(layout: ParallelLayout) -> None:
    init_parallel_state(layout.tp, ep_degree=layout.ep, cp_degree=layout.cp, cfg_degree=layout.cfg)


def _rank_main(
    rank: int,
    layout: ParallelLayout,
    port: int,
    result_path: str,
    environ: dict[str, str],
    fn: Callable[..., Any],
    args: tuple,
) -> None:
    world_size = layout.world_size
    # The fork server's environment is the caller's when the server started, not at this launch.
    os.environ.clear()
    os.environ.update(environ)
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
            # traceback from a child process. Ranks raising at once must not interleave their writes (the
            # caller then read a corrupt file): each writes its own file and moves it into place whole.
            own = f"{_error_path(result_path)}.{rank}"
            torch.save(e, own)
            os.replace(own, _error_path(result_path))
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
        rank_context()  # names what the fork server preloads, should this launch start it
        try:
            mp.start_processes(
                _rank_main,
                args=(layout, _free_port(), result_path, dict(os.environ), fn, args),
                nprocs=world_size,
                join=True,
                start_method=START_METHOD,
            )
        except mp.ProcessRaisedException:
            if os.path.exists(_error_path(result_path)):
                raise torch.load(_error_path(result_path), weights_only=False) from None
            raise
        return torch.load(result_path, weights_only=False)
