"""Every case of ``bad_inputs.py`` against the real ``trnmodels`` entry point (in-process: each run would
otherwise pay a fresh interpreter): exit 2, one error line, no traceback, nothing written, no rank spawned."""

from __future__ import annotations

import json
import os
import shlex
import shutil
from pathlib import Path

import pytest
import torch
import torch.multiprocessing
from safetensors.torch import load_file, save_file

from trnmodels.core import cli
from trnmodels.core.runner.generate import TOKENIZER_FILES
from trnmodels.core.testing import save_random_checkpoint
from trnmodels.core.testing.bad_inputs import BadInput, check_one_line_error, load_cases

CASES = load_cases([Path(__file__).with_name("bad_inputs.py")])
BASE_ARGS = {
    "logits": "--token-ids 1,2,3 --out OUT",
    "generate": "--prompt Hello --max-new-tokens 2 --eager --cache-dir CACHE",
    "compile": "--cache-dir CACHE",
    "validate": "--new-tokens 2",
}


def _edit_tensors(ckpt: Path, key: str, change) -> None:
    tensors = load_file(ckpt / "model.safetensors")
    tensors[key] = change(tensors[key])
    save_file(tensors, str(ckpt / "model.safetensors"), metadata={"format": "pt"})


def _with_nan(t: torch.Tensor) -> torch.Tensor:
    t = t.clone()
    t.view(-1)[0] = float("nan")
    return t


def _set_model_type(ckpt: Path, model_type: str) -> None:
    config = json.loads((ckpt / "config.json").read_text())
    (ckpt / "config.json").write_text(json.dumps({**config, "model_type": model_type}))


DEFECTS = {
    "NAN_WEIGHT_CKPT": lambda c: _edit_tensors(c, "model.norm.weight", _with_nan),
    "INT8_WEIGHT_CKPT": lambda c: _edit_tensors(
        c, "model.layers.0.mlp.up_proj.weight", lambda t: t.to(torch.int8)
    ),
    "MODEL_TYPE_GEMMA4_CKPT": lambda c: _set_model_type(c, "gemma4"),
    "NO_TOKENIZER_CKPT": lambda c: [(c / name).unlink(missing_ok=True) for name in TOKENIZER_FILES],
}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    from trnmodels.llama3 import PLUGIN

    root = tmp_path_factory.mktemp("ckpts")
    ckpts = {"CKPT": save_random_checkpoint(PLUGIN.bundled_config_dir("tiny"), root / "tiny")}
    for name, defect in DEFECTS.items():
        ckpts[name] = Path(shutil.copytree(ckpts["CKPT"], root / name.lower()))
        defect(ckpts[name])
    return ckpts


@pytest.fixture
def no_rank_processes(monkeypatch):
    """Bad input is refused in the parent: starting rank processes is a failure in itself."""

    def refuse(*args, **kwargs):
        raise AssertionError("rank processes were started for bad input")

    monkeypatch.setattr(torch.multiprocessing, "start_processes", refuse)


def run(argv: list[str], capsys) -> tuple[int, str, str]:
    try:
        code = cli.main(argv)
    except SystemExit as e:  # argparse
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


def argv_for(case: BadInput, ckpts: dict[str, Path], tmp: Path) -> list[str]:
    """``COMMAND CKPT BASE_ARGS INPUT`` with the placeholders filled (a ``*_CKPT`` input replaces CKPT)."""
    (tmp / "EXISTING_DIR").mkdir()
    (tmp / "FILE").write_text("a regular file")
    places = {
        "OUT": str(tmp / "out.safetensors"),
        "CACHE": str(tmp / "cache"),
        "EXISTING_DIR": str(tmp / "EXISTING_DIR"),
        "FILE": str(tmp / "FILE"),
        "MISSING_DIR": str(tmp / "MISSING_DIR"),
        "LONG_IDS": ",".join(["5"] * 129),
        "LONG_TEXT": "hi " * 200,
    }

    def fill(word: str) -> str:
        head, sep, rest = word.partition("/")
        return places[head] + sep + rest if head in places else word

    words = shlex.split(case.input)
    ckpt = ckpts[words.pop(0)] if words and words[0] in ckpts else ckpts["CKPT"]
    return [case.command, str(ckpt), *map(fill, [*shlex.split(BASE_ARGS[case.command]), *words])]


def test_every_numeric_flag_is_probed_at_the_edges_of_its_type():
    """The generated cases reach each kind of argument type (a generator that found no flag would leave
    these flags untested without failing)."""
    inputs = {f"{c.command} {c.input}" for c in CASES}
    expected = {
        "logits --prefill-len 0",
        "compile --jobs 0",
        "generate --tp 0",
        "generate --top-k -1",
        "generate --seed 18446744073709551616",
        "generate --temperature nan",
        "generate --temperature -1",
        "generate --top-p 0",
        "generate --top-p 1.5",
        "generate --top-p inf",
    }
    assert expected <= inputs, sorted(expected - inputs)


@pytest.mark.parametrize("case", CASES, ids=[f"{c.command} {c.input}" for c in CASES])
def test_bad_input_is_one_line_and_leaves_nothing(case, checkpoints, tmp_path, capsys, no_rank_processes):
    code, _, err = run(argv_for(case, checkpoints, tmp_path), capsys)
    check_one_line_error(code, err, case)
    leftovers = sorted(p.name for p in tmp_path.iterdir() if p.name not in ("EXISTING_DIR", "FILE", "cache"))
    assert leftovers == [], f"{case.input}: left {leftovers} behind"
    assert list((tmp_path / "EXISTING_DIR").iterdir()) == []


def test_a_failed_run_keeps_the_existing_output_and_a_good_one_replaces_it(checkpoints, tmp_path, capsys):
    out = tmp_path / "logits.safetensors"
    out.write_bytes(b"previous result")
    argv = ["logits", "--token-ids", "1,2,3", "--out", str(out)]
    code, _, err = run([argv[0], str(checkpoints["NAN_WEIGHT_CKPT"]), *argv[1:]], capsys)
    assert code == 2 and "(checkpoint key model.norm.weight holds NaN or inf)" in err
    assert out.read_bytes() == b"previous result" and sorted(os.listdir(tmp_path)) == [out.name]
    code, _, err = run([argv[0], str(checkpoints["CKPT"]), *argv[1:], "--json"], capsys)
    assert code == 0, err
    assert load_file(out)["logits"].shape == (3, 320) and sorted(os.listdir(tmp_path)) == [out.name]


def test_a_replaced_output_keeps_its_mode_and_a_new_one_follows_the_umask(checkpoints, tmp_path, capsys):
    # safetensors creates its files 0o600 whatever the umask: the result must not take that mode.
    kept = tmp_path / "kept.safetensors"
    kept.write_bytes(b"previous result")
    kept.chmod(0o640)
    mask = os.umask(0o022)
    try:
        for out in (kept, tmp_path / "new.safetensors"):
            argv = ["logits", str(checkpoints["CKPT"]), "--token-ids", "1,2", "--out", str(out)]
            code, _, err = run(argv, capsys)
            assert code == 0, err
    finally:
        os.umask(mask)
    assert load_file(kept)["logits"].shape == (2, 320)
    assert (kept.stat().st_mode & 0o777, (tmp_path / "new.safetensors").stat().st_mode & 0o777) == (
        0o640,
        0o644,
    )


@pytest.mark.skipif(
    hasattr(os, "geteuid") and os.geteuid() == 0, reason="root writes into read-only directories"
)
def test_an_unwritable_output_directory_is_refused_before_any_work(
    checkpoints, tmp_path, capsys, monkeypatch
):
    import trnmodels.core.runner.score as score

    monkeypatch.setattr(
        score, "score_checkpoint", lambda *a, **k: pytest.fail("scored before checking --out")
    )
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    try:
        argv = [
            "logits",
            str(checkpoints["CKPT"]),
            "--token-ids",
            "1,2",
            "--out",
            str(locked / "x.safetensors"),
        ]
        code, _, err = run(argv, capsys)
    finally:
        locked.chmod(0o755)
    check_one_line_error(code, err, BadInput("logits", "--out READ_ONLY_DIR/x.safetensors", "cannot write"))
    assert list(locked.iterdir()) == []
