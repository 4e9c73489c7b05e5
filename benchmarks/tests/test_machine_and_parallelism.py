"""What the pages record about the host, and the TP degree a checkpoint's heads split into."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.machine import machine_info, proc_bytes
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
