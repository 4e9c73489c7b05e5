"""A warm compile answers from the manifest of an earlier one, without reading the config through
transformers; any change of input, or an entry gone from the cache, takes the full path again."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from trnmodels.core.compile import CompileTarget, compile_all, driver
from trnmodels.core.compile.cache import RECORDS
from trnmodels.core.errors import ShardingError
from trnmodels.core.runner.config import RunnerConfig

RUNNER = RunnerConfig(
    max_num_seqs=2, max_model_len=32, block_size=8, num_batched_tokens_buckets=(32,), num_seqs_buckets=(1, 2),
    context_len_buckets=(32,),
)  # fmt: skip


@pytest.fixture
def builds(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Compiling replaced by writing the graph's name: the manifest is about keys, not artifacts."""
    built: list[str] = []

    def fake_compile(target, spec, path: Path) -> None:
        built.append(spec.name)
        path.write_text(spec.name)

    monkeypatch.setattr(driver, "_compile_to", fake_compile)
    return built


def forbid_config_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args, **kwargs):
        raise AssertionError("the manifest path must not read the config through transformers")

    monkeypatch.setattr(driver, "check_model_config", refuse)
    monkeypatch.setattr(driver, "load_hf_config", refuse)


def test_a_warm_compile_reads_only_the_manifest(llama_checkpoint, tmp_path, builds, monkeypatch):
    target, cache = CompileTarget(str(llama_checkpoint), RUNNER), str(tmp_path / "cache")
    cold = compile_all(target, cache)
    assert [r.cache for r in cold] == ["miss"] * 3 and sorted(builds) == sorted(r.name for r in cold)
    assert len(list((tmp_path / "cache" / RECORDS).glob("*.json"))) == 1

    forbid_config_reads(monkeypatch)
    reported = []
    warm = compile_all(target, cache, on_result=reported.append)
    assert [r.cache for r in warm] == ["hit"] * 3 and [r.path for r in warm] == [r.path for r in cold]
    assert sorted(r.name for r in reported) == sorted(r.name for r in cold) and len(builds) == 3


def test_the_manifest_keys_are_the_ones_the_full_path_computes(llama_checkpoint, tmp_path, builds):
    target, cache = CompileTarget(str(llama_checkpoint), RUNNER), tmp_path / "cache"
    compile_all(target, str(cache))
    (record,) = (cache / RECORDS).glob("*.json")
    recorded = {name: graph["key"] for name, graph in json.loads(record.read_text())["graphs"].items()}
    computed = driver.graph_keys(target, driver.all_graph_specs(RUNNER))
    assert recorded == {spec.name: key for spec, (key, _) in computed.items()}


def test_an_edited_config_takes_the_full_path(llama_checkpoint, tmp_path, builds, monkeypatch):
    target, cache = CompileTarget(str(llama_checkpoint), RUNNER), str(tmp_path / "cache")
    compile_all(target, cache)
    config_file = llama_checkpoint / "config.json"
    config = json.loads(config_file.read_text())
    config_file.write_text(json.dumps({**config, "rms_norm_eps": config["rms_norm_eps"] * 2}))
    checked = []
    real_check = driver.check_model_config
    monkeypatch.setattr(driver, "check_model_config", lambda *a: checked.append(a) or real_check(*a))
    again = compile_all(target, cache)
    assert checked and [r.cache for r in again] == ["miss"] * 3 and len(builds) == 6


def test_a_runtime_config_the_model_refuses_is_refused_with_a_manifest_present(
    llama_checkpoint, tmp_path, builds
):
    cache = str(tmp_path / "cache")
    compile_all(CompileTarget(str(llama_checkpoint), RUNNER), cache)
    with pytest.raises(ShardingError, match="tp_degree=3"):
        compile_all(CompileTarget(str(llama_checkpoint), RUNNER, tp=3), cache)


def test_an_entry_gone_from_the_cache_is_rebuilt(llama_checkpoint, tmp_path, builds):
    target, cache = CompileTarget(str(llama_checkpoint), RUNNER), str(tmp_path / "cache")
    cold = compile_all(target, cache)
    subprocess.run(["rm", "-rf", str(Path(cold[1].path).parent)], check=True)
    again = compile_all(target, cache)
    assert [r.cache for r in again] == ["hit", "miss", "hit"] and builds[-1] == cold[1].name


def test_a_damaged_manifest_is_ignored(llama_checkpoint, tmp_path, builds):
    target, cache = CompileTarget(str(llama_checkpoint), RUNNER), tmp_path / "cache"
    compile_all(target, str(cache))
    (record,) = (cache / RECORDS).glob("*.json")
    record.write_text('{"graphs": ')
    assert [r.cache for r in compile_all(target, str(cache))] == ["hit"] * 3
    assert json.loads(record.read_text())["graphs"]  # rewritten by the full path


def test_a_failed_compile_records_no_manifest(llama_checkpoint, tmp_path, monkeypatch):
    def broken(target, spec, path):
        raise driver.CompileError(f"{spec.name}: broken")

    monkeypatch.setattr(driver, "_compile_to", broken)
    with pytest.raises(driver.CompileError):
        compile_all(CompileTarget(str(llama_checkpoint), RUNNER), str(tmp_path / "cache"))
    assert not list((tmp_path / "cache").glob(f"{RECORDS}/*.json"))


def test_a_warm_cli_compile_does_not_import_the_model_config_class(llama_checkpoint, tmp_path, builds):
    cache = tmp_path / "cache"
    compile_all(CompileTarget(str(llama_checkpoint), RUNNER), str(cache))
    flags = [
        "--max-num-seqs", "2", "--max-model-len", "32", "--block-size", "8", "--num-batched-tokens-buckets",
        "32", "--num-seqs-buckets", "1,2", "--context-len-buckets", "32",
    ]  # fmt: skip
    code = (
        "import sys; from trnmodels.core.cli import main; main(sys.argv[1:]); "
        "print('LOADED' if 'transformers.models.llama.configuration_llama' in sys.modules else 'NOT LOADED')"
    )
    args = [sys.executable, "-c", code, "compile", str(llama_checkpoint), "--cache-dir", str(cache), *flags]
    out = subprocess.run(args, capture_output=True, text=True, check=True).stdout
    assert "3 graphs, 3 cache hits" in out and out.strip().endswith("NOT LOADED")


def test_whether_sgemm_is_tuned_is_part_of_every_key(llama_checkpoint, monkeypatch):
    """An Intel CPU's graphs swap no operands (``cpu.linear``): artifacts are not shared across that rule."""
    target, specs = CompileTarget(str(llama_checkpoint), RUNNER), driver.all_graph_specs(RUNNER)
    keys = {}
    for tuned in (False, True):
        monkeypatch.setattr(driver, "sgemm_tuned", lambda tuned=tuned: tuned)
        keys[tuned] = {spec: key for spec, (key, _) in driver.graph_keys(target, specs).items()}
    assert all(keys[False][spec] != keys[True][spec] for spec in specs)
