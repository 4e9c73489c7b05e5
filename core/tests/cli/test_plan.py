"""``trnmodels plan`` (Step 5 on paper): the plan's bytes per rank are what the plugins allocate, its instance
figures are the published ones, and bad input is one line, exit 2.

The check that matters builds each LLM plugin's real model on CPU ranks (gloo) and counts the storage it
allocates and the KV cache allocated from its spec; the plan, which reads a meta-device model, must agree
to the byte.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from trnmodels.core.cli import main
from trnmodels.core.errors import ConfigError
from trnmodels.core.onboarding.instances import GIB, INSTANCES, get_instance
from trnmodels.core.onboarding.plan import kv_blocks, measure_rank, plan
from trnmodels.core.parallel import ParallelLayout
from trnmodels.core.parallel.launch import run_on_ranks
from trnmodels.core.plugins import discover_plugins
from trnmodels.core.published import PUBLISHED_DIR
from trnmodels.core.testing.bad_inputs import BadInput, check_one_line_error, numeric_flag_cases

LLM_PLUGINS = ("gemma4", "gpt_oss", "llama3")
GEMMA4_MOE = {"enable_moe_block": True, "num_experts": 4, "top_k_experts": 2, "moe_intermediate_size": 16}
MAX_MODEL_LEN, MAX_NUM_SEQS = 64, 2  # a tiny cache: 2 sequences of 2 blocks, plus the null block


def tiny_dir(name: str) -> Path:
    return discover_plugins()[name].bundled_config_dir("tiny")


@pytest.fixture(scope="module")
def gemma4_moe_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    config = json.loads((tiny_dir("gemma4") / "config.json").read_text())
    config["text_config"].update(GEMMA4_MOE)
    folder = tmp_path_factory.mktemp("gemma4_moe")
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def mesh(result: dict, tp: int, ep: int) -> dict:
    found = [m for m in result["meshes"] if (m["tp"], m["ep"]) == (tp, ep)]
    assert found, f"TP {tp} x EP {ep} not planned; refused: {result['refused']}"
    return found[0]


# -------------------------------------------------------------------------- the bytes the plugins allocate

CASES = [
    *((name, tp, 1) for name in LLM_PLUGINS for tp in (1, 2)),
    ("gpt_oss", 1, 2),
    ("gemma4_moe", 1, 2),
]
BLOCKS = kv_blocks(MAX_MODEL_LEN, MAX_NUM_SEQS)


@pytest.fixture(scope="module")
def folders(gemma4_moe_dir: Path) -> dict[str, str]:
    return {name: str(tiny_dir(name)) for name in LLM_PLUGINS} | {"gemma4_moe": str(gemma4_moe_dir)}


@pytest.fixture(scope="module")
def measured(folders: dict[str, str]) -> dict[tuple[str, int, int], list[dict[str, int]]]:
    """Every case's per-rank counts from real CPU ranks, one launch per mesh."""
    out = {}
    for tp, ep in sorted({(tp, ep) for _, tp, ep in CASES}):
        names = [name for name, t, e in CASES if (t, e) == (tp, ep)]
        counts = run_on_ranks(
            measure_rank, ParallelLayout(tp=tp, ep=ep), [folders[n] for n in names], "bfloat16", BLOCKS
        )
        out.update({(name, tp, ep): counts[folders[name]] for name in names})
    return out


@pytest.mark.slow
@pytest.mark.parametrize(("name", "tp", "ep"), CASES, ids=[f"{n}-tp{t}-ep{e}" for n, t, e in CASES])
def test_plan_bytes_per_rank_equal_what_the_model_allocates(name, tp, ep, folders, measured):
    result = plan(
        folders[name],
        "trn2.3xlarge",
        max_model_len=MAX_MODEL_LEN,
        max_num_seqs=MAX_NUM_SEQS,
        dtype="bfloat16",
    )
    planned = mesh(result, tp, ep)
    assert result["settings"]["kv_blocks"] == BLOCKS == MAX_NUM_SEQS * math.ceil(MAX_MODEL_LEN / 32) + 1
    ranks = measured[name, tp, ep]
    assert [m["rank"] for m in ranks] == list(range(tp * ep))
    for m in ranks:
        assert planned["weight_bytes_per_core"] == m["weight_bytes"], m
        assert planned["kv_cache_bytes_per_core"] == m["kv_cache_bytes"], m
        assert planned["kv_bytes_per_block"] * BLOCKS == m["kv_cache_bytes"], m


def test_llama_3_1_8b_by_hand():
    """Llama-3.1-8B at TP 1 and 8 against the parameter count written out from its config (BF16)."""
    c = json.loads((PUBLISHED_DIR / "Llama-3.1-8B" / "config.json").read_text())
    h, inter, layers, vocab = (
        c["hidden_size"],
        c["intermediate_size"],
        c["num_hidden_layers"],
        c["vocab_size"],
    )
    heads, kv_heads = c["num_attention_heads"], c["num_key_value_heads"]
    d = h // heads
    result = plan("Llama-3.1-8B", "trn2.48xlarge", max_model_len=4096, max_num_seqs=4)
    for tp in (1, 8):
        per_layer = h * (heads + 2 * kv_heads) * d // tp + heads * d * h // tp + 3 * h * inter // tp + 2 * h
        params = 2 * vocab * h // tp + layers * per_layer + h  # untied embedding and head, final norm
        inv_freq = d // 2 * 4  # the RoPE frequencies, a float32 buffer
        m = mesh(result, tp, 1)
        assert m["weight_bytes_per_core"] == 2 * params + inv_freq
        assert m["decode_weight_bytes_per_core"] == m["weight_bytes_per_core"] - 2 * vocab * h // tp
        token_kv = layers * 2 * (kv_heads // tp) * d * 2
        assert m["kv_cache_bytes_per_core"] == token_kv * 32 * (4 * 4096 // 32 + 1)
        assert m["dp"] == 64 // tp
    assert 16.0e9 < mesh(result, 1, 1)["weight_bytes_per_core"] < 16.1e9  # "8B" parameters in BF16
    bound = mesh(result, 1, 1)["decode_weight_bytes_per_core"] / (2.9e12 / 4) * 1000
    assert mesh(result, 1, 1)["decode_ms_bound"] == pytest.approx(bound)
    # 32 query heads split over at most 32 ranks.
    assert [(r["tp"], r["ep"]) for r in result["refused"]] == [(64, 1)]


def test_expert_parallelism_splits_only_the_experts():
    """gpt-oss-20b: going from EP 1 to EP 2 halves the expert weights and nothing else."""
    c = json.loads((PUBLISHED_DIR / "gpt-oss-20b" / "config.json").read_text())
    h, inter, experts = c["hidden_size"], c["intermediate_size"], c["num_local_experts"]
    expert_params = c["num_hidden_layers"] * experts * (h * 2 * inter + 2 * inter + inter * h + h)
    result = plan("gpt-oss-20b", "trn1.32xlarge", max_model_len=1024)
    one, two = mesh(result, 1, 1), mesh(result, 1, 2)
    assert one["weight_bytes_per_core"] - two["weight_bytes_per_core"] == expert_params  # BF16: 2 bytes / 2
    assert one["kv_cache_bytes_per_core"] == two["kv_cache_bytes_per_core"]  # attention is replicated over EP
    assert {m["tp"] * m["ep"] * m["dp"] for m in result["meshes"]} == {32}


def test_a_dense_model_gets_no_expert_meshes():
    result = plan("Llama-3.2-1B", "trn1.32xlarge")
    assert result["meshes"] and all(m["ep"] == 1 for m in result["meshes"])
    assert result["settings"]["max_model_len"] == 8192  # max_position_embeddings 131072, capped
    assert result["settings"]["kv_blocks"] == kv_blocks(8192, 8)


# ------------------------------------------------------------------------------------------- instances


def test_instance_figures_are_the_published_ones():
    trn1, trn2, small = INSTANCES["trn1.32xlarge"], INSTANCES["trn2.48xlarge"], INSTANCES["trn2.3xlarge"]
    assert (trn1.cores, trn1.hbm_bytes_per_chip * trn1.chips) == (32, 512 * GIB)
    assert trn1.hbm_bandwidth_per_chip * trn1.chips == 13_120 * GIB  # the Trn1 table's instance total
    assert (trn2.cores, trn2.hbm_bytes_per_core) == (64, 24 * GIB)  # LNC=2: 4 logical cores per chip
    assert trn2.hbm_bytes_per_chip * trn2.chips == 1536 * GIB
    assert trn2.hbm_bandwidth_per_chip * trn2.chips == pytest.approx(46.4e12)
    assert (small.chips, small.cores) == (1, 4)
    for instance in INSTANCES.values():
        assert "https://" in instance.source


def test_an_unknown_instance_is_refused_with_the_known_ones():
    with pytest.raises(ConfigError) as e:
        get_instance("trn3.48xlarge")
    assert all(name in str(e.value) for name in INSTANCES)


# -------------------------------------------------------------------------------------------------- CLI


def test_cli_prints_the_table_and_json(capsys):
    assert main(["plan", "Llama-3.2-1B", "--instance", "trn2.3xlarge", "--max-model-len", "2048"]) == 0
    out = capsys.readouterr().out
    assert "trn2.3xlarge" in out and "fits" in out
    assert main(["plan", "Llama-3.2-1B", "--instance", "trn2.3xlarge", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert [m["tp"] for m in result["meshes"]] == [1, 2, 4]
    assert result["settings"]["max_num_seqs"] == 8


BAD = [
    BadInput("plan", "--instance trn9.huge", "unknown instance 'trn9.huge'; known: trn1.32xlarge"),
    BadInput(
        "plan", "Qwen3-8B", "architecture 'Qwen3ForCausalLM' is served by no installed trnmodels plugin"
    ),
    BadInput("plan", "NOT_JSON", "malformed JSON at line 1"),
    BadInput("plan", "no-such-model", "is not a checkpoint folder, a config.json path or a bundled"),
    BadInput(
        "plan", "WAN_DIT_CONFIG", "is one component of a diffusers pipeline: plan the pipeline's folder"
    ),
    BadInput("plan", "--num-frames 5", "--num-frames: not an option for an LLM"),
    BadInput("plan", "WAN_COMPONENTS", "diffusers component folders (transformer_2) but no model_index.json"),
    BadInput("plan", "--max-model-len 200000", "exceeds the model's max_position_embeddings 131072"),
    *numeric_flag_cases("plan"),
]


def components_only(tmp_path: Path) -> Path:
    """A pipeline's component configs without its model_index.json (as the reference set ships Wan2.2)."""
    folder = tmp_path / "wan-components"
    (folder / "transformer_2").mkdir(parents=True)
    source = PUBLISHED_DIR / "Wan2.2-T2V-A14B-Diffusers" / "transformer_2" / "config.json"
    (folder / "transformer_2" / "config.json").write_text(source.read_text())
    return folder


@pytest.mark.parametrize("case", BAD, ids=[c.input for c in BAD])
def test_bad_input_is_one_line_exit_2(case, capsys, tmp_path):
    not_json = tmp_path / "config.json"
    not_json.write_text("{not json")
    argv = ["plan", "Llama-3.2-1B", "--instance", "trn2.48xlarge"]
    placeholders = {
        "NOT_JSON": str(not_json),
        "WAN_DIT_CONFIG": str(PUBLISHED_DIR / "Wan2.2-T2V-A14B-Diffusers" / "transformer_2" / "config.json"),
        "WAN_COMPONENTS": str(components_only(tmp_path)),
    }
    argv += [placeholders.get(word, word) for word in case.input.split()]
    if not case.input.startswith("--"):  # a source replaces the default one
        argv = ["plan", argv[-1], *argv[2:-1]]
    try:
        code = main(argv)
    except SystemExit as e:  # argparse's own refusals
        code = e.code
    check_one_line_error(code, capsys.readouterr().err, case)


def test_numeric_flags_are_covered():
    flags = {c.input.split()[0] for c in numeric_flag_cases("plan")}
    assert flags == {
        "--max-model-len",
        "--max-num-seqs",
        "--num-frames",
        "--height",
        "--width",
        "--max-sequence-length",
        "--vae-patch-parallel",
    }
