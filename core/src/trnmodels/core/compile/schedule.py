"""A queue of work shared by compilers that each take the next item as soon as they are free."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Sequence
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")


def share_queue(
    items: Iterable[T],
    compilers: Sequence[Callable[[T], R]],
    deliver: Callable[[T, R], None],
) -> None:
    """Run every item through one of ``compilers``, each taking the next item in order as soon as it is
    free: the first compiler runs in this thread and takes the first item before the others start; each
    other runs in a thread of its own (its work is a call that waits on another process).

    ``deliver`` is called once per item, one call at a time. The first failure stops every compiler from
    taking another item and is raised once the others have finished theirs.
    """
    queue = list(items)
    lock = threading.Lock()
    failures: list[BaseException] = []

    def take() -> list[T]:
        """The next item (as a list of one), or none once the queue is empty or a compiler failed."""
        with lock:
            return [queue.pop(0)] if queue and not failures else []

    def run(compile_one: Callable[[T], R], taken: list[T]) -> None:
        try:
            while taken:
                result = compile_one(taken[0])
                with lock:
                    deliver(taken[0], result)
                taken = take()
        except BaseException as e:  # re-raised below once the other compilers stop
            with lock:
                failures.append(e)

    first = take()
    others = [
        threading.Thread(target=run, args=(compile_one, take()), name=f"compiler-{i}", daemon=True)
        for i, compile_one in enumerate(compilers[1:], start=1)
    ]
    for thread in others:
        thread.start()
    try:
        run(compilers[0], first)
    finally:
        for thread in others:
            thread.join()
    if failures:
        raise failures[0]
