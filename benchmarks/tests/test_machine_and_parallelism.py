"""What the pages record about the host, and the TP degree a checkpoint's heads split into."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.machine import (
    busy_cpu_seconds,
    compiler_side_by_side_slowdown,
    machine_info,
    proc_bytes,
    side_by_side_slowdown,
    wait_until_quiet,
)
from benchmarks.parallelism import tp_degree


def test_proc_bytes_reads_kb_lines_as_bytes(tmp_path: Path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       24641520 kB\nHugePages_Total:       0\nVmHWM:\t  1024 kB\n")
    assert proc_bytes(str(meminfo)) == {"MemTotal": 24641520 * 1024, "VmHWM": 1024 * 1024}


def test_machine_info_records_the_packages_asked_for() -> None:
    import safetensors

    info = machine_info(("safetensors",))
    assert info["safetensors"] == safetensors.__version__ and "transformers" not in info
    assert len(info["load_average_start"]) == 3 and info["cores"] >= 1


def test_side_by_side_probes_time_each_copy_alone_and_together() -> None:
    for figures in (
        side_by_side_slowdown(copies=2, iterations=200_000, repeats=1),
        # The compiler probe compiles with the real compiler: a source the headers reject fails here.
        compiler_side_by_side_slowdown(copies=2, kernels=2, repeats=1),
    ):
        assert figures["copies"] == 2 and figures["alone_seconds"] > 0 and figures["together_seconds"] > 0
        assert figures["slowdown"] == pytest.approx(figures["together_seconds"] / figures["alone_seconds"])
        assert figures["speedup_ceiling"] == pytest.approx(2 / figures["slowdown"])


def test_a_failing_probe_names_its_command(monkeypatch: pytest.MonkeyPatch) -> None:
    import benchmarks.machine as machine

    monkeypatch.setattr(machine, "_SPIN", "raise SystemExit(3)")
    with pytest.raises(RuntimeError, match=r"raise SystemExit\(3\) failed \(exit code 3\)"):
        side_by_side_slowdown(copies=2, repeats=1)


@pytest.mark.parametrize(
    ("heads", "kv_heads", "tp"),
    [(4, 2, 2), (9, 3, 3), (12, 4, 2), (6, 1, 2), (5, 5, 5), (7, 7, 7)],
)
def test_tp_degree_is_the_smallest_that_splits_the_heads(
    tmp_path: Path, heads: int, kv_heads: int, tp: int
) -> None:
    config = {"model_type": "llama", "num_attention_heads": heads, "num_key_value_heads": kv_heads}
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert tp_degree(tmp_path) == tp


def test_tp_degree_reads_a_multimodal_config_s_text_config(tmp_path: Path) -> None:
    text = {"num_attention_heads": 9, "num_key_value_heads": 3}
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "x", "text_config": text}))
    assert tp_degree(tmp_path) == 3


class FakeMachine:
    """Busy CPU seconds that grow by ``busy_cores`` per second slept, one entry per window."""

    def __init__(self, busy_cores: list[float]):
        self.busy_cores, self.total, self.windows = busy_cores, 0.0, 0

    def busy_seconds(self) -> float:
        return self.total

    def sleep(self, seconds: float) -> None:
        self.total += self.busy_cores[min(self.windows, len(self.busy_cores) - 1)] * seconds
        self.windows += 1


def test_wait_until_quiet_returns_at_the_first_quiet_window() -> None:
    machine = FakeMachine([1.0, 0.9, 0.05, 1.0])
    quiet = wait_until_quiet(0.15, window=0.5, busy_seconds=machine.busy_seconds, sleep=machine.sleep)
    assert quiet == {"seconds": 1.5, "quiet": True, "busy_cores": pytest.approx(0.05)}


def test_wait_until_quiet_gives_up_at_its_timeout_and_says_so() -> None:
    machine = FakeMachine([1.0])
    quiet = wait_until_quiet(
        0.15, window=0.5, timeout=2.0, busy_seconds=machine.busy_seconds, sleep=machine.sleep
    )
    assert quiet == {"seconds": 2.0, "quiet": False, "busy_cores": pytest.approx(1.0)}
    assert machine.windows == 4


def test_busy_cpu_seconds_reads_the_machine_and_grows_while_it_works() -> None:
    before = busy_cpu_seconds()
    sum(i * i for i in range(3_000_000))
    assert busy_cpu_seconds() > before > 0
