"""The LLM benchmark's helpers on tiny inputs: measurements, ratios and verdicts, the page. No full run."""

from __future__ import annotations

import copy
import importlib.util
import json
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from benchmarks.llm import measure, report, run
from benchmarks.llm.report import Target
from trnmodels.core.testing.markers import needs_cpu_extension

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")


def _graphs(*seconds: float) -> list[dict]:
    names = ("prefill_256", "decode_1x256", "decode_8x256")
    return [{"name": n, "seconds": s, "cache": "miss"} for n, s in zip(names, seconds, strict=True)]


def _bench_workload() -> dict:
    """Hand-made figures of the bench config: decode and TP=2 RSS miss their targets, the rest meet them."""
    load = {"hwm_reset": True, "baseline_rss": 600e6}
    return {
        "workload": "bench",
        "checkpoint": {
            "architecture": "ToyForCausalLM",
            "num_parameters": 100e6,
            "parameter_bytes": 400e6,
            "bytes": 400e6,
            "largest_tensor_bytes": 100e6,
            "shards": 3,
            "weight_bytes_per_token": 300e6,
        },
        "loading": {
            "repeats": 1,
            "tp": 2,
            "plain": {**load, "rank": 0, "seconds": 0.25, "bytes": 400e6, "peak_rss": 1000e6}
            | {"peak_added": 400e6, "anon_added": 398e6, "file_added": 2e6},
            "ours_tp1": {**load, "rank": 0, "seconds": 0.2, "bytes": 400e6, "peak_rss": 1040e6}
            | {"peak_added": 440e6, "anon_added": 420e6, "file_added": 20e6},
            "ours_tp": [
                {**load, "rank": r, "seconds": 0.15, "bytes": 200e6, "peak_rss": 1200e6}
                | {"peak_added": 600e6 - r * 1e6, "anon_added": 280e6, "file_added": 320e6}
                for r in (0, 1)
            ],
        },
        "compile": {
            "jobs": 2,
            "cold_seconds": 100.0,
            "warm_seconds": 0.5,
            "load_seconds": 1.8,
            "loaded_graphs": 3,
            "graphs": [{"name": "decode_1x256", "cold_seconds": 36.0, "cold": "miss", "warm": "hit"}],
            # One at a time 150 s; two queues of at best 90 s (60 | 55 + 35): at most a 1.67× speed-up.
            "cold_by_jobs": {
                "1": {"jobs": 1, "seconds": 150.0, "cpu_seconds": 165.0, "graphs": _graphs(60.0, 55.0, 35.0)},
                "2": {"jobs": 2, "seconds": 100.0, "graphs": _graphs(70.0, 66.0, 40.0)},
            },
            "side_by_side": {
                "copies": 2,
                "alone_seconds": 2.0,
                "together_seconds": 2.5,
                "slowdown": 1.25,
                "speedup_ceiling": 1.6,
            },
            "compiler_side_by_side": {
                "copies": 2,
                "alone_seconds": 4.0,
                "together_seconds": 4.4,
                "slowdown": 1.1,
                "speedup_ceiling": 2 / 1.1,
                "kernels": 120,
            },
            "cli": {
                "info": {"cpu_seconds": 3.0, "wall_seconds": 3.5},
                "compile_warm": {"cpu_seconds": 3.3, "wall_seconds": 3.75},
                "generate_cached": {"cpu_seconds": 9.25, "wall_seconds": 8.5},
                "generate_eager": {"cpu_seconds": 7.25, "wall_seconds": 6.5},
                "repeats": 3,
            },
        },
        "throughput": {
            "ours_eager": {"prefill": 1500.0, "decode_b1": 42.0, "decode_b8": 110.0},
            "ours_compiled": {"prefill": 1600.0, "decode_b1": 60.0, "decode_b8": 158.0},
            "hf": {"prefill": 1620.0, "decode_b1": 56.0, "decode_b8": 204.0},
        },
    }


def _real_workload() -> dict:
    """A real-weights workload at TP=3 (9 heads), every figure distinct from the bench config's."""
    w = copy.deepcopy(_bench_workload())
    w["workload"] = "real"
    w["checkpoint"] |= {"architecture": "LlamaForCausalLM", "source": "SmolLM2-135M-Instruct"}
    w["checkpoint"] |= {
        "num_parameters": 134.5e6,
        "bytes": 538e6,
        "shards": 1,
        "weight_bytes_per_token": 538e6,
    }
    w["loading"]["tp"] = 3
    w["compile"]["cold_by_jobs"] = {"2": w["compile"]["cold_by_jobs"]["2"]}
    w["loading"]["ours_tp"] = [dict(w["loading"]["ours_tp"][0], rank=r, peak_added=300e6) for r in (0, 1, 2)]
    w["throughput"] = {
        "ours_eager": {"prefill": 900.5, "decode_b1": 21.5, "decode_b8": 77.5},
        "ours_compiled": {"prefill": 950.5, "decode_b1": 33.5, "decode_b8": 99.5},
        "hf": {"prefill": 990.5, "decode_b1": 22.5, "decode_b8": 88.5},
    }
    return w


def _results(*workloads: dict) -> dict:
    """A run of the given workloads (default: the bench config alone)."""
    return {
        "model": "toy",
        "date": "2025-01-01 00:00 UTC",
        "machine": {
            "cpu": "Test CPU",
            "cores": 2,
            "torch_threads": 2,
            "memory_bytes": 8 * 2**30,
            "platform": "Linux",
            "python": "3.11",
            "torch": "2.13",
            "transformers": "5.19",
            "safetensors": "0.8",
            "load_average_start": [0.5, 0.4, 0.3],
            "load_average_end": [2.0, 1.5, 1.0],
            "run_seconds": 300.0,
            "other_processes_cores": 0.25,
        },
        "settings": {
            "load_repeats": 1,
            "repeats": 1,
            "new_tokens": 9,
            "prefill_len": 256,
            "decode_prompt_len": 32,
            "batch": 8,
            "jobs": 2,
            "bandwidth_bytes": 2**30,
        },
        "runner": {
            "max_num_seqs": 8,
            "max_model_len": 256,
            "block_size": 32,
            "num_batched_tokens_buckets": [256],
            "num_seqs_buckets": [1, 8],
            "context_len_buckets": [256],
        },
        "bandwidth_bytes_per_s": 24e9,
        "workloads": list(workloads) or [_bench_workload()],
    }


def test_memory_bandwidth_counts_the_bytes_read_and_written(monkeypatch: pytest.MonkeyPatch) -> None:
    times = iter([0.004, 0.002, 0.003])
    monkeypatch.setattr(measure, "timed", lambda fn: next(times))
    # 8 MiB of float32 copied: 8 MiB read and 8 MiB written in the best time, 2 ms.
    assert measure.memory_bandwidth(8 << 20, repeats=3) == pytest.approx(2 * (8 << 20) / 0.002)


def test_read_bandwidth_counts_the_bytes_read(monkeypatch: pytest.MonkeyPatch) -> None:
    times = iter([0.004, 0.001, 0.003])
    monkeypatch.setattr(measure, "timed", lambda fn: next(times))
    # 8 MiB of float32 summed: 8 MiB read in the best time, 1 ms.
    assert measure.read_bandwidth(8 << 20, repeats=3) == pytest.approx((8 << 20) / 0.001)


def test_the_page_sets_the_step_against_a_read_only_stream_too() -> None:
    r = _results()
    r["read_bandwidth_bytes_per_s"] = 30e9
    page = report.markdown(r, chart="toy.png")
    assert "read only: 30.0 GB/s" in page
    # 300 MB a step: a 100.0 tok/s read-only roofline; 60 tok/s compiled read 18.0 GB/s, 60% of it.
    assert "30.0 GB/s here (the copy: 24.0)" in page and "bandwidth (100.0 tok/s)" in page
    assert "(60.0 tok/s, 18.0 GB/s of weights) is at 60%" in page
    # A run from before the read-only probe still renders.
    assert "read only" not in report.markdown(_results(), chart="toy.png")


def test_decode_split_times_the_recorded_step_and_the_models_matrices_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from trnmodels.core.parallel.layers import ReplicatedLinear

    # Two linear layers, one sharing the other's weight (as a tied head does): one matrix of 8 x 16.
    model = torch.nn.Sequential(ReplicatedLinear(16, 8), ReplicatedLinear(16, 8), torch.nn.LayerNorm(16))
    for p in model.parameters():
        torch.nn.init.normal_(p)
    model[1].weight = model[0].weight
    calls: list[tuple] = []
    graph = measure.RecordingGraph(lambda *inputs: calls.append(inputs) or len(calls))
    with pytest.raises(RuntimeError, match="has not run"):
        measure.decode_split(graph, model, rounds=1)
    step_inputs = (torch.ones(2), torch.zeros(3))
    assert graph(*step_inputs) == 1 and graph.inputs == step_inputs
    monkeypatch.setattr(measure, "read_bandwidth", lambda nbytes: 25e9)
    split = measure.decode_split(graph, model, rounds=3, calls=4)
    # One warm-up call, then 4 in each of 3 rounds, every one on the recorded step's inputs.
    assert len(calls) == 1 + 1 + 3 * 4
    assert all(a is b for c in calls for a, b in zip(c, step_inputs, strict=True))
    assert split["matrices"] == 1 and split["matrix_bytes"] == 8 * 16 * 4 and split["rounds"] == 3
    assert split["read_bandwidth_bytes_per_s"] == 25e9
    assert split["graph_seconds"] > 0 and split["products_seconds"] > 0


@needs_cpu_extension()
def test_decode_split_reads_the_packed_weights_of_a_model_bound_to_packed_graphs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Binding FP32 graphs packs the linear layers and gives their plain weights back: the products alone
    must read the packed copies, as the decode graphs do, not the released weights."""
    from trnmodels.core.cpu.packed import released
    from trnmodels.core.cpu.packed_layers import pack_for_graphs
    from trnmodels.core.parallel.layers import ReplicatedLinear

    model = torch.nn.Sequential(ReplicatedLinear(16, 8), ReplicatedLinear(8, 40))
    for p in model.parameters():
        torch.nn.init.normal_(p)
    first = model[0].weight.detach().clone()
    assert pack_for_graphs(model) == 2 and released(model[0].weight)
    graph = measure.RecordingGraph(lambda *inputs: None)
    graph(torch.ones(1))
    monkeypatch.setattr(measure, "read_bandwidth", lambda nbytes: 25e9)
    split = measure.decode_split(graph, model, rounds=1, calls=1)
    assert split["matrices"] == 2 and split["matrix_bytes"] == (8 * 16 + 40 * 8) * 4
    products = measure.MatrixProducts(measure.weight_layers(model))
    rows = products.example_rows(torch.float32)  # one per width: 8, 16
    torch.testing.assert_close(products(*rows)[0], rows[1] @ first.T)


@needs_cpu_extension()
def test_the_eager_runner_runs_a_model_the_graphs_did_not_pack() -> None:
    """Binding FP32 graphs packs the layers, and eager steps on that model run the packed GEMM: the eager
    figures must come from a model as ``trnmodels generate --eager`` builds it."""
    from trnmodels.core.cpu.packed import packed_gemm, released
    from trnmodels.core.cpu.packed_layers import pack_for_graphs
    from trnmodels.core.parallel.layers import ReplicatedLinear

    def build() -> torch.nn.Module:
        model = torch.nn.Sequential(ReplicatedLinear(16, 8), ReplicatedLinear(8, 40))
        for p in model.parameters():  # the layers start as torch.empty, and a NaN weight is kept unreleased
            torch.nn.init.normal_(p)
        return model

    def bind(model: torch.nn.Module) -> dict[str, int]:
        return {"packed": pack_for_graphs(model)}

    eager, bound, graphs, seconds = run.eager_and_bound_models(build, bind)
    assert graphs == {"packed": 2} and seconds >= 0
    assert all(released(layer.weight) and packed_gemm(layer.weight) is not None for layer in bound)
    assert not any(released(layer.weight) or packed_gemm(layer.weight) is not None for layer in eager)


def test_the_roofline_section_splits_the_step_when_the_run_timed_its_pieces() -> None:
    r = _results()
    r["read_bandwidth_bytes_per_s"] = 30e9
    w = r["workloads"][0]
    # 300 MB a step; the graph alone 12 ms (25.0 GB/s), 33 matrices of 280 MB in 10 ms (28.0 GB/s).
    w["decode_split"] = {
        "graph_seconds": 0.012,
        "products_seconds": 0.010,
        "read_bandwidth_bytes_per_s": 32e9,
        "rounds": 5,
        "matrices": 33,
        "matrix_bytes": 280e6,
    }
    page = report.markdown(r, chart="toy.png")
    assert (
        "(5 rounds taking turns, with a read-only stream between them at 32.0 GB/s; in the throughput "
        "rounds it ran at 30.0): the compiled graph alone, called on a step's own inputs with nothing of "
        "the runner around it, took 12.0 ms (the step in the rounds: 16.7 ms), reading the step's weights "
        "at 25.0 GB/s, 78% of that stream. Of it, the matrix-vector products alone (every linear layer's "
        "weight and the LM head's against one row: 33 matrices, 280 MB; core's one-row linear in one graph "
        "compiled as the decode graphs are) took 10.0 ms, reading at 28.0 GB/s, 88% of the stream; the "
        "rest of the graph (attention over the cached context, norms, rotary, sampling) took the other "
        "2.0 ms."
    ) in page
    assert "does not quite reach" not in page
    # A run from before the step was timed piece by piece still renders, with the old clause.
    old = report.markdown(_results(), chart="toy.png")
    assert "piece by piece" not in old and "which a GEMM reading the weight once" in old


SMOLLM2 = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "head_dim": 64,
    "vocab_size": 49152,
    "tie_word_embeddings": True,
    "pad_token_id": 2,
    "eos_token_id": 2,
}


@pytest.mark.parametrize("tied", [True, False])
def test_checkpoint_info_counts_smollm2s_parameters(tmp_path: Path, tied: bool) -> None:
    (tmp_path / "config.json").write_text(json.dumps(SMOLLM2 | {"tie_word_embeddings": tied}))
    save_file({"x": torch.zeros(1000)}, str(tmp_path / "model.safetensors"))
    info = measure.checkpoint_info(tmp_path)
    # By hand: q and o 576x576, k and v 576x(3x64), gate/up/down 576x1536, two norms per layer.
    layer = 2 * 576 * 576 + 2 * 576 * 192 + 3 * 576 * 1536 + 2 * 576
    embedding = 49152 * 576
    params = 30 * layer + 576 + embedding * (1 if tied else 2)
    assert params == (134_515_008 if tied else 134_515_008 + 28_311_552)  # SmolLM2's published 135M
    assert info["num_parameters"] == params and info["parameter_bytes"] == 4 * params
    # A decode step reads every weight but the input embedding; tied, the LM head reads that same table.
    assert info["weight_bytes_per_token"] == 4 * (params - (0 if tied else embedding))
    assert info["largest_tensor_bytes"] == 4 * embedding
    assert info["shards"] == 1 and info["bytes"] == (tmp_path / "model.safetensors").stat().st_size
    assert info["vocab_size"] == 49152 and info["pad_token_id"] == 2 and info["experts"] is None


@linux_only
def test_cpu_seconds_count_this_process() -> None:
    machine, own = measure.cpu_seconds()
    sum(range(3_000_000))
    machine2, own2 = measure.cpu_seconds()
    assert own2 > own and machine2 >= machine


def test_target_verdicts() -> None:
    assert Target("k", "n", 1.6, ">=", 1.5).met
    assert not Target("k", "n", 1.4, ">=", 1.5).met
    assert Target("k", "n", 0.05, "<=", 0.1).met
    assert not Target("k", "n", 0.2, "<=", 0.1).verdict == "met"
    assert Target("k", "n", 0.0123, "<=", 0.1, percent=True).show(0.0123) == "1.23%"
    missed = Target("k", "n", 281 / 398, "<=", 0.7)
    assert not missed.met and missed.show(missed.value) == "0.706×" and missed.show(0.7) == "0.7×"


def test_targets_are_ratios_of_the_same_run() -> None:
    got = {t.key: t for t in report.targets(report.views(_results())[0])}
    assert got["decode"].value == pytest.approx(60 / 56) and not got["decode"].met
    assert got["decode_batch"].value == pytest.approx(158 / 204) and not got["decode_batch"].met
    assert got["eager_decode"].value == pytest.approx(42 / 56) and not got["eager_decode"].met
    assert got["eager_decode_batch"].value == pytest.approx(110 / 204) and not got["eager_decode_batch"].met
    assert got["warm_start"].value == pytest.approx(0.5 / 100) and got["warm_start"].met
    assert got["load_speed"].value == pytest.approx((400e6 / 0.2) / (400e6 / 0.25)) and got["load_speed"].met
    assert got["rss_tp1"].value == pytest.approx(1.1) and got["rss_tp1"].met
    assert got["rss_tp"].value == pytest.approx(1.5) and not got["rss_tp"].met  # worst rank
    assert report.roofline(report.views(_results())[0]) == pytest.approx(80.0)
    assert got["roofline_share"].value == pytest.approx(60 / 80) and not got["roofline_share"].met
    assert got["compile_jobs"].value == pytest.approx(1.5) and not got["compile_jobs"].met
    assert got["warm_cli"].value == pytest.approx(1.1) and got["warm_cli"].met


def test_a_moe_model_has_no_compiled_batch_target_and_its_eager_misses_point_to_the_moe_section() -> None:
    moe = _bench_workload()
    moe["checkpoint"]["experts"] = {"num_experts": 8, "experts_per_token": 2, "expert_bytes": 200e6}
    r = _results(moe)
    assert {"decode_batch", "roofline_share"}.isdisjoint(t.key for t in report.targets(report.views(r)[0]))
    page = report.markdown(r, chart="toy.png")
    # Eager at batch 8: 8 × 1000 / 110 = 72.7 ms a step against HF's 8 × 1000 / 204 = 39.2 ms.
    assert "Ours took 72.7 ms per decode step at batch 8, HF 39.2 ms; matching HF needs 39.2 ms." in page
    assert "The MoE section above gives the expert work per step" in page


def test_a_moe_roofline_counts_the_chosen_experts_and_the_section_names_what_the_graph_reads() -> None:
    moe = _bench_workload()
    moe["checkpoint"]["experts"] = {"num_experts": 8, "experts_per_token": 2, "expert_bytes": 200e6}
    r = _results(moe)
    # 300 MB a step can touch, 200 MB of it experts: a token reads 100 MB + 2/8 x 200 MB = 150 MB.
    assert report.roofline(report.views(r)[0]) == pytest.approx(24e9 / 150e6)
    page = report.markdown(r, chart="toy.png")
    assert "reads 150 MB of weights" in page and "= 160.0 tok/s" in page
    # Batch 1: 2 pairs <= 8 experts, gathered; batch 8: 16 pairs, all experts.
    assert "| 2 of 8 (gathered) |" in page and "| 8 of 8 (all) |" in page
    assert "here up to batch 4" in page


def test_best_schedule_of_graphs_on_workers() -> None:
    assert report.best_schedule([60.0, 55.0, 35.0], 2) == 90.0
    assert report.best_schedule([10.0, 10.0, 10.0, 10.0], 2) == 20.0
    assert report.best_schedule([7.0], 2) == 7.0
    assert report.best_schedule([3.0, 4.0], 1) == 7.0


def test_markdown_has_every_figure_and_explains_each_miss() -> None:
    r = _results()
    page = report.markdown(r, chart="toy.png")
    for text in [
        "Test CPU",
        "2.13",
        "2.00 / 1.50 / 1.00",
        "0.25 of the 2 cores",
        "24.0 GB/s",
        "80.0 tok/s",
        "2.00 GB/s",  # ours TP=1
        "1.60 GB/s",  # plain read
        "1.33 GB/s",  # TP=2 rank
        "440 MB = 1.10× checkpoint",
        "600 MB = 1.50× checkpoint",
        "1500.0",
        "1600.0",
        "1620.0",
        "42.0",
        "60.0",
        "56.0",
        "110.0",
        "158.0",
        "204.0",
        "100.0",
        "0.500",
        "1.80",
        "![",
    ]:
        assert text in page, text
    for t in report.targets(report.views(r)[0]):
        assert t.name in page
    assert page.count("**missed**") == 7 and page.count("**met**") == 4
    # Batch 1 compiled: 1000 / 60 = 16.7 ms a step; the roofline's 12.5 ms ÷ 0.85 = 14.7 ms.
    assert "our compiled step took 16.7 ms (4.2 ms more)" in page and "a step of 14.7 ms: 2.2 ms" in page
    # Compiled at batch 8: 8 × 1000 / 158 = 50.6 ms a step; 1.2× HF's 204 tok/s is a step of 32.7 ms.
    assert "Ours took 50.6 ms per decode step at batch 8, HF 39.2 ms; 1.2× HF needs 32.7 ms." in page
    assert "attention reads each sequence's real length where core's decode-attention kernel" in page
    assert "MoE section" not in page
    # Set-up 60 - median(55, 35) = 15 s; graph work 45, 55, 35 = 135 s in queues of at best 80 s (45 + 35 | 55).
    assert "the run 150.0 s (the first graph also paid the process's one-time set-up, about 15.0 s" in page
    assert "1.7× that speed is 88.2 s" in page
    assert (
        "split the 135.0 s of graph work (the set-up left out) into queues of 80.0 s: at most 1.69×" in page
    )
    assert (
        "a CPU-bound loop took 1.25× as long with 2 copies running at once as alone (2.50 s against 2.00 s): "
        "this machine caps any 2-way parallel work at 1.60× now." in page
    )
    assert (
        "the C++ compiler (on kernels like Inductor's) took 1.10× as long with 2 copies running at once as "
        "alone (4.40 s against 4.00 s): this machine caps a 2-way parallel compile at 1.82× now." in page
    )
    # One job: 165 CPU s in 150 s = 1.1 cores; 2 ÷ (1.1 × 1.1) = 1.65.
    assert (
        "With `--jobs 1` the compile kept 1.10 cores busy on average (165.0 CPU seconds in 150.0 s): with 2 "
        "compilers each slowed 1.10× by the other, the speed-up cannot pass 1.65×" in page
    )
    r["workloads"][0]["compile"]["side_by_side"] |= {
        "together_seconds": 1.9,
        "slowdown": 0.95,
        "speedup_ceiling": 2.1,
    }
    page = report.markdown(r, chart="toy.png")
    assert (
        "(1.90 s against 2.00 s): each copy got a whole core, so the machine set no cap here." in page
        and "2.10×" not in page
    )
    for text in [
        "3.00",
        "3.30",
        "9.25",
        "7.25",
        "1.10× `info`'s CPU time",
        "cold `compile_all`, 3 graphs, 1 job |",
    ]:
        assert text in page, text
    assert "### compiled decode at batch 1 ÷ HF eager" in page  # 1.5 × 56 > the 80 tok/s roofline
    assert "No implementation can reach it" in page
    assert "### peak RSS of loading ÷ checkpoint bytes, per rank at TP=2" in page
    assert "### weight loading" not in page
    assert "| workload |" not in page and "## Model and workload\n" in page  # one workload: no column


def test_a_second_workload_adds_its_rows_to_every_table() -> None:
    r = _results(_bench_workload(), _real_workload())
    page = report.markdown(r, chart="toy.png")
    assert "## Model and workloads" in page and "REAL_WEIGHTS" in page
    for table in (report.targets_table(r), report.loading_table(r), report.throughput_table(r)):
        assert table.startswith("| workload |")
        assert "| bench config |" in table and "| SmolLM2-135M-Instruct |" in table
    assert report.compile_table(r).count("| SmolLM2-135M-Instruct |") == 7  # no jobs-1 compile
    # Its own figures, its own TP degree and roofline (24 GB/s ÷ 538 MB = 44.6 tok/s).
    for text in [
        "900.5",
        "33.5",
        "88.5",
        "TP=3, rank 2",
        "44.6 tok/s",
        "80.0 tok/s",
        "TP=3 for SmolLM2-135M-Instruct",
    ]:
        assert text in page, text
    assert "per rank at TP=3 (worst rank)" in page and "per rank at TP=2 (worst rank)" in page
    # 33.5 / 22.5 = 1.49 misses 1.5× HF; 440 MB and 300 MB per rank of a 538 MB checkpoint meet 1.2× and 0.7×.
    assert "### SmolLM2-135M-Instruct: compiled decode at batch 1 ÷ HF eager: 1.49×" in page
    assert "### SmolLM2-135M-Instruct: peak RSS" not in page
    # Its compiled batch-8 (99.5 ÷ 88.5 = 1.12×), eager decode (0.96×, 0.88×) and roofline share
    # (33.5 ÷ 44.6 = 75%) miss as well.
    assert page.count("**missed**") == 7 + 5 and page.count("**met**") == 4 + 5


@pytest.mark.parametrize("workloads", [1, 2])
def test_write_report(tmp_path: Path, workloads: int) -> None:
    pytest.importorskip("matplotlib")
    paths = report.write_report(_results(*[_bench_workload(), _real_workload()][:workloads]), tmp_path)
    assert [p.name for p in paths] == ["toy.json", "toy.png", "toy.md"]
    assert json.loads(paths[0].read_text())["model"] == "toy"
    assert paths[1].read_bytes().startswith(b"\x89PNG")


def fresh_process_probe(name: str) -> dict:
    """A probe of ``_memory_probes`` run in a fresh process with the benchmark's allocator settings."""
    return measure.run_in_fresh_process(f"benchmarks.tests._memory_probes:{name}", env=measure.EXACT_RSS_ENV)


@linux_only
def test_peak_memory_sees_an_allocation() -> None:
    result = fresh_process_probe("peak_of_a_64mib_block")
    assert result["peak_added"] > 48 << 20
    assert result["anon_added"] > 48 << 20


@linux_only
def test_case_memory_splits_the_model_from_the_pass() -> None:
    memory = fresh_process_probe("case_memory_of_a_64mib_model")
    assert 48 << 20 < memory["build_added"] < 96 << 20
    assert 24 << 20 < memory["pass_added"] < 64 << 20
    assert memory["peak_added"] >= memory["build_added"] + memory["pass_added"] - (4 << 20)
    assert memory["process_peak"] >= memory["baseline_rss"] + memory["peak_added"]


@linux_only
def test_case_memory_does_not_count_the_library_code_a_pass_calls_first() -> None:
    memory = fresh_process_probe("case_memory_of_first_calls_on_a_tiny_tensor")
    assert memory["library_code"] > 64 << 20  # torch's own code, made resident before the pass
    assert memory["library_code_again"] < 1 << 20
    assert memory["pass_added"] < 1 << 20  # a 256-float tensor's ops: no memory to speak of


def test_run_in_fresh_process_returns_the_result_and_raises_the_error() -> None:
    assert measure.run_in_fresh_process("os.path:join", "a", "b") == "a/b"
    env = measure.EXACT_RSS_ENV
    assert measure.run_in_fresh_process("os:getenv", "MALLOC_MMAP_THRESHOLD_", env=env) == "65536"
    with pytest.raises(RuntimeError, match="math domain error"):
        measure.run_in_fresh_process("math:sqrt", -1)


def test_left_pad_and_medians() -> None:
    ids, mask = measure.left_pad([[5, 6, 7], [8]], pad_id=0)
    assert ids.tolist() == [[5, 6, 7], [0, 0, 8]] and mask.tolist() == [[1, 1, 1], [0, 0, 1]]
    runs = [{"seconds": s, "name": "x", "ok": True} for s in (3.0, 1.0, 2.0)]
    assert measure.median_fields(runs) == {"seconds": 2.0, "name": "x", "ok": True}


def test_throughput_excludes_the_prefill() -> None:
    def fake(step: float) -> measure.Generate:
        def generate(prompts: list[list[int]], n: int) -> None:
            time.sleep(0.02 + step * (n - 1))  # 20 ms prefill, then `step` per decode step

        return generate

    systems = {"fast": fake(0.004), "slow": fake(0.008)}
    got = measure.throughput(systems, [1] * 64, {"decode_b2": [[1], [2]]}, new_tokens=6, repeats=1)
    assert 0.5 * (2 / 0.004) < got["fast"]["decode_b2"] < 1.5 * (2 / 0.004)
    assert 0.5 * (2 / 0.008) < got["slow"]["decode_b2"] < 1.5 * (2 / 0.008)
    assert 0.5 * (64 / 0.02) < got["fast"]["prefill"] < 1.2 * (64 / 0.02)


def test_throughput_runs_its_between_rounds_measurement_after_every_round() -> None:
    calls: list[str] = []

    def system(name: str):
        def generate(prompts, n):
            calls.append(name)
            # Time that grows with n: two calls taking the same time would leave no decode time to divide by.
            time.sleep(0.001 * n)

        return generate

    systems = {"a": system("a"), "b": system("b")}
    measure.throughput(
        systems, [1], {"decode_b1": [[1]]}, 3, repeats=2, between_rounds=lambda: calls.append("|")
    )
    # Warm-up (prefill, one decode call each), then per round 3 calls each (prefill, 1 token, 3 tokens).
    assert calls == ["a"] * 2 + ["b"] * 2 + (["a"] * 3 + ["b"] * 3 + ["|"]) * 2


def test_a_workloads_bandwidth_from_its_rounds_sets_its_roofline() -> None:
    r = _results()
    r["workloads"][0] |= {
        "bandwidth_bytes_per_s": 30e9,
        "read_bandwidth_bytes_per_s": 36e9,
        "bandwidth_in_rounds": 5,
    }
    view = report.views(r)[0]
    assert report.roofline(view) == pytest.approx(100.0)  # 30 GB/s ÷ 300 MB, not the run's 24 GB/s
    got = {t.key: t for t in report.targets(view)}
    assert got["roofline_share"].value == pytest.approx(60 / 100)
    page = report.markdown(r, chart="toy.png")
    assert "measured at the start of this run: 24.0 GB/s" in page
    assert "a roofline uses the same streams measured between its workload's throughput rounds" in page
    assert (
        "30.0 GB/s (the copy, the median of its 5 measurements between the throughput rounds) ÷ 300 MB"
        in page
    )
    assert "36.0 GB/s here (the copy: 30.0)" in page
    assert "between its workload's throughput rounds" not in report.markdown(_results(), chart="toy.png")


def test_only_a_plugin_with_a_real_checkpoint_has_the_real_workload() -> None:
    from benchmarks.llm import run

    assert run.workloads("llama3") == ("bench", "real")
    assert run.workloads("gpt_oss") == ("bench",)
    with pytest.raises(ValueError, match="gpt_oss has the workloads bench; asked for"):
        run.run_benchmark("gpt_oss", run.QUICK, only=["real"])


def test_checkpoint_info_leaves_out_gemma4s_per_layer_input_table(tmp_path: Path) -> None:
    # Gemma 4's bench config: a tied head, and a per-layer-input table a step only looks rows up in.
    bench = Path(importlib.util.find_spec("trnmodels.gemma4").submodule_search_locations[0]) / "bench"
    config = json.loads((bench / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(config))
    save_file({"x": torch.zeros(1000)}, str(tmp_path / "model.safetensors"))
    info = measure.checkpoint_info(tmp_path)
    assert config["tie_word_embeddings"] is True
    # By hand: 32000 rows of 8 layers x 64 per-layer inputs, read one row per token.
    per_layer_table = config["vocab_size_per_layer_input"] * config["num_hidden_layers"] * 64
    assert config["hidden_size_per_layer_input"] == 64 and per_layer_table == 16_384_000
    assert info["weight_bytes_per_token"] == info["parameter_bytes"] - 4 * per_layer_table
