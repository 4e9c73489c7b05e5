"""The compile queue: compilers take the next graph as soon as they are free; a failure stops the rest."""

from __future__ import annotations

import threading

import pytest

from trnmodels.core.compile.schedule import share_queue


class Recorder:
    """A compiler that records what it compiled, in which thread, and can hold its first item."""

    def __init__(self, name: str, hold: threading.Event | None = None):
        self.name, self.hold, self.items, self.threads = name, hold, [], set()

    def __call__(self, item: int) -> str:
        self.threads.add(threading.get_ident())
        if self.hold is not None and not self.items:
            assert self.hold.wait(timeout=30), "the held compiler was never released"
        self.items.append(item)
        return f"{self.name}:{item}"


def test_a_free_compiler_takes_the_next_item_and_the_caller_compiles_the_first():
    release = threading.Event()
    worker = Recorder("worker", hold=release)  # stuck on its first item until the caller is done

    def here(item: int) -> str:
        if item == 4:
            release.set()
        return caller(item)

    caller = Recorder("caller")
    delivered: dict[int, str] = {}
    share_queue(range(5), [here, worker], lambda item, result: delivered.__setitem__(item, result))
    assert caller.items == [0, 2, 3, 4] and worker.items == [1]
    assert caller.threads == {threading.get_ident()} and threading.get_ident() not in worker.threads
    assert delivered == {0: "caller:0", 1: "worker:1", 2: "caller:2", 3: "caller:3", 4: "caller:4"}


def test_a_failure_stops_every_compiler_taking_more_and_is_raised_after_the_others_finish():
    release = threading.Event()
    worker = Recorder("worker", hold=release)

    def failing(item: int) -> str:
        # The worker finishes its item well after this failure is recorded (microseconds after the raise).
        threading.Timer(0.5, release.set).start()
        raise RuntimeError(f"graph {item} failed")

    delivered: list[int] = []
    with pytest.raises(RuntimeError, match="graph 0 failed"):
        share_queue(range(6), [failing, worker], lambda item, _: delivered.append(item))
    assert worker.items == [1] and delivered == [1]  # its item delivered; nothing after the failure taken


def test_a_failure_in_another_compiler_is_raised_in_the_caller():
    def failing(item: int) -> str:
        raise ValueError(f"worker failed on {item}")

    caller = Recorder("caller")
    with pytest.raises(ValueError, match="worker failed on 1"):
        share_queue(range(2), [caller, failing], lambda *_: None)
    assert caller.items == [0]


def test_fewer_items_than_compilers_and_no_items():
    caller, worker = Recorder("caller"), Recorder("worker")
    delivered: list[int] = []
    share_queue([7], [caller, worker, Recorder("idle")], lambda item, _: delivered.append(item))
    assert caller.items == [7] and worker.items == [] and delivered == [7]
    share_queue([], [caller], lambda *_: pytest.fail("nothing to deliver"))
