"""The shipped L1 tasks load offline and the facts set is well formed."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from trnmodels.core.eval import L1_TASKS, TASKS_DIR
from trnmodels.core.eval.__main__ import lm_eval_argv


def facts() -> list[dict]:
    return [json.loads(line) for line in (TASKS_DIR / "facts.jsonl").read_text().splitlines() if line.strip()]


def test_facts_has_at_least_100_well_formed_questions():
    rows = facts()
    assert len(rows) >= 100
    assert len({r["question"] for r in rows}) == len(rows), "duplicate question"
    assert [r["id"] for r in rows] == list(range(len(rows)))
    for r in rows:
        assert set(r) == {"id", "question", "choices", "answer"}, r
        assert r["question"].strip() and r["question"].endswith("?"), r
        assert len(r["choices"]) == 4 and len(set(r["choices"])) == 4, r
        assert all(isinstance(c, str) and c.strip() == c and c for c in r["choices"]), r
        assert r["answer"] in range(4), r
    # The right answer is not always in the same place.
    positions = Counter(r["answer"] for r in rows)
    assert min(positions.values()) >= len(rows) // 5


def test_tasks_load_offline(monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    from lm_eval.tasks import TaskManager

    manager = TaskManager(include_path=str(TASKS_DIR), include_defaults=False)
    assert "trnmodels_l1" in manager.all_groups
    loaded = manager.load(["trnmodels_l1"])
    assert set(loaded["tasks"]) == set(L1_TASKS)
    tasks = loaded["tasks"]
    facts_task, gen_task, ppl_task = (tasks[name] for name in L1_TASKS)
    n = len(facts())
    assert facts_task.OUTPUT_TYPE == "multiple_choice" and len(list(facts_task.test_docs())) == n
    doc = next(iter(facts_task.test_docs()))
    assert facts_task.doc_to_text(doc) == f"Question: {doc['question']}\nAnswer:"
    assert facts_task.doc_to_choice(doc) == doc["choices"]
    assert gen_task.OUTPUT_TYPE == "generate_until" and len(list(gen_task.test_docs())) == n
    assert gen_task.doc_to_target(doc) == doc["choices"][doc["answer"]]
    assert ppl_task.OUTPUT_TYPE == "loglikelihood_rolling"
    docs = list(ppl_task.test_docs())
    assert docs and all(d["text"] for d in docs)


def test_docstring_text_is_deterministic_and_budgeted():
    import importlib.util

    spec = importlib.util.spec_from_file_location("pydoc_docs", TASKS_DIR / "pydoc_docs.py")
    pydoc_docs = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(pydoc_docs)
    assert list(pydoc_docs.MODULES) == sorted(pydoc_docs.MODULES)
    docs = pydoc_docs.documents()
    assert docs == pydoc_docs.documents()
    assert [d["module"] for d in docs] == sorted(d["module"] for d in docs)
    assert 0 < sum(len(d["text"]) for d in docs) <= pydoc_docs.MAX_CHARS
    assert len(pydoc_docs.documents(2_000)) < len(docs)


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--model", "trnmodels", "--tasks", "x"], ["run", "--include_path", str(TASKS_DIR), "--model", "trnmodels", "--tasks", "x"]),
        (["run", "--tasks", "x"], ["run", "--include_path", str(TASKS_DIR), "--tasks", "x"]),
        (["ls", "tasks"], ["ls", "--include_path", str(TASKS_DIR), "tasks"]),
        (["run", "--include_path", "/elsewhere", "--tasks", "x"], ["run", "--include_path", "/elsewhere", "--tasks", "x"]),
        (["--help"], ["--help"]),
    ],
)  # fmt: skip
def test_command_line_includes_the_shipped_tasks(argv, expected):
    assert lm_eval_argv(argv) == expected


@pytest.mark.slow  # a full lm_eval run of every L1 task, ours and HF
def test_task_accuracy_runs_the_l1_tasks_against_hf(tiny_checkpoint):
    """The accuracy harness's L1 entry point: ours and HF FP32 on the shipped tasks (two documents each)."""
    from trnmodels.core.accuracy import task_accuracy

    report = task_accuracy(
        tiny_checkpoint,
        limit=2,
        model_args={
            "max_model_len": 64,
            "block_size": 8,
            "num_batched_tokens_buckets": "64",
            "context_len_buckets": "64",
        },
    )
    assert set(report.ours) == set(L1_TASKS) == set(report.reference)
    assert report.ours["trnmodels_pydoc_ppl"]["word_perplexity"] == pytest.approx(
        report.reference["trnmodels_pydoc_ppl"]["word_perplexity"], rel=1e-4
    )
    assert report.passed, report.format()
    assert "L1 task accuracy" in report.format()
