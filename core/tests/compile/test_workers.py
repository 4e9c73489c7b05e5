"""With more than one job, the compile workers start before the model's config is checked and get ready
while it is (imports, the model's code, the C++ compiler's probe of the CPU); the graphs they take go
through them. A compile with nothing to build starts none."""

from __future__ import annotations

import threading
from concurrent.futures import Future
from pathlib import Path

import pytest

from trnmodels.core.compile import CompileTarget, compile_all, driver
from trnmodels.core.runner.config import RunnerConfig

RUNNER = RunnerConfig(
    max_num_seqs=2, max_model_len=32, block_size=8, num_batched_tokens_buckets=(32,), num_seqs_buckets=(1, 2),
    context_len_buckets=(32,),
)  # fmt: skip


class InProcessPool:
    """The worker side of the pool, in this process: each task runs when submitted, and is recorded."""

    def __init__(self, events: list[str], pools: list[int]):
        self.events, self.pools = events, pools
        self.lock = threading.Lock()

    def __call__(self, max_workers: int, mp_context: object) -> InProcessPool:
        self.pools.append(max_workers)
        return self

    def __enter__(self) -> InProcessPool:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def submit(self, fn, *args) -> Future:
        with self.lock:
            self.events.append(f"worker:{fn.__name__}")
        future: Future = Future()
        future.set_result(fn(*args))
        return future


@pytest.fixture
def recorded(monkeypatch: pytest.MonkeyPatch) -> tuple[list[str], list[int]]:
    """Events in order (config checks, worker tasks, graphs built) and the size of every pool started."""
    events: list[str] = []
    pools: list[int] = []
    monkeypatch.setattr(driver, "ProcessPoolExecutor", InProcessPool(events, pools))
    real_check = driver.check_model_config
    monkeypatch.setattr(driver, "check_model_config", lambda *a: events.append("check") or real_check(*a))

    def fake_compile(target, spec, path: Path) -> None:
        path.write_text(spec.name)

    monkeypatch.setattr(driver, "_compile_to", fake_compile)
    return events, pools


@pytest.mark.parametrize("jobs", [2, 3])
def test_workers_get_ready_before_the_config_check_and_take_graphs(
    llama_checkpoint, tmp_path, recorded, jobs
):
    events, pools = recorded
    target = CompileTarget(str(llama_checkpoint), RUNNER)
    results = compile_all(target, str(tmp_path / "cache"), jobs=jobs)
    assert [r.cache for r in results] == ["miss"] * 3
    # One pool of jobs - 1 workers, each told to get ready before this process checks the config.
    assert pools == [jobs - 1]
    assert events[:jobs] == ["worker:_get_ready"] * (jobs - 1) + ["check"]
    assert events.count("worker:compile_graph") >= 1


def test_one_job_starts_no_worker(llama_checkpoint, tmp_path, recorded):
    events, pools = recorded
    compile_all(CompileTarget(str(llama_checkpoint), RUNNER), str(tmp_path / "cache"))
    assert pools == [] and events == ["check"]


def test_a_compile_the_manifest_answers_starts_no_worker(llama_checkpoint, tmp_path, recorded):
    events, pools = recorded
    target, cache = CompileTarget(str(llama_checkpoint), RUNNER), str(tmp_path / "cache")
    compile_all(target, cache, jobs=2)
    events.clear()
    pools.clear()
    assert [r.cache for r in compile_all(target, cache, jobs=2)] == ["hit"] * 3
    assert pools == [] and events == []


def test_workers_are_capped_by_the_graphs_left_to_build(llama_checkpoint, tmp_path, recorded):
    _, pools = recorded
    target, cache = CompileTarget(str(llama_checkpoint), RUNNER), str(tmp_path / "cache")
    first = compile_all(target, cache)
    Path(first[1].path).unlink()
    pools.clear()
    again = compile_all(target, cache, jobs=4)
    # The manifest knew two graphs were still there: one left to build, by this process alone.
    assert [r.cache for r in again] == ["hit", "miss", "hit"] and pools == []
