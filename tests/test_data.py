import json

import pytest

from specbench.data import (
    MT_BENCH_CATEGORIES,
    TASKS,
    parse_questions,
    read_questions,
    select_questions,
    task_of,
)
from specbench.errors import SpecbenchError


def line(question_id, category, turns):
    return json.dumps({"question_id": question_id, "category": category, "turns": turns})


def test_mt_bench_categories_map_to_one_task():
    assert {task_of(c) for c in MT_BENCH_CATEGORIES} == {"mt_bench"}
    assert [task_of(t) for t in TASKS[1:]] == list(TASKS[1:])
    assert task_of("poetry") is None


def test_errors_name_the_file_and_line(tmp_path):
    path = tmp_path / "q.jsonl"
    path.write_text(line(1, "qa", ["a?"]) + "\n{not json\n")
    with pytest.raises(SpecbenchError, match=r"q\.jsonl, line 2: not valid JSON"):
        read_questions(str(path))
    path.write_text(line(1, "qa", ["a?"]) + "\n" + json.dumps({"question_id": 2, "turns": ["b"]}) + "\n")
    with pytest.raises(SpecbenchError, match="line 2: missing category"):
        read_questions(str(path))
    path.write_text(line(1, "poetry", ["a?"]) + "\n")
    with pytest.raises(SpecbenchError, match="line 1: category 'poetry' belongs to no task"):
        read_questions(str(path))
    path.write_text(line(1, "qa", []) + "\n")
    with pytest.raises(SpecbenchError, match="turns must be a non-empty list"):
        read_questions(str(path))
    path.write_text(line(1, "qa", ["a"]) + "\n" + line(1, "qa", ["b"]) + "\n")
    with pytest.raises(SpecbenchError, match="question_id 1 appears twice"):
        read_questions(str(path))


def test_missing_file_and_empty_file(tmp_path):
    with pytest.raises(SpecbenchError, match="no such file"):
        read_questions(str(tmp_path / "nope.jsonl"))
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(SpecbenchError, match="holds no questions"):
        read_questions(str(tmp_path / "empty.jsonl"))


def test_select_keeps_file_order_and_limits_each_task():
    prompts = parse_questions([
        line(1, "writing", ["a", "b"]), line(2, "qa", ["c"]), line(3, "coding", ["d", "e"]),
        line(4, "qa", ["f"]), line(5, "rag", ["g"]),
    ], "test")
    assert [p.question_id for p in select_questions(prompts, ["mt_bench", "qa"], 1)] == [1, 2]
    assert [p.question_id for p in select_questions(prompts, list(TASKS), None)] == [1, 2, 3, 4, 5]
    with pytest.raises(SpecbenchError, match="unknown task"):
        select_questions(prompts, ["chess"], None)
    with pytest.raises(SpecbenchError, match="limit_per_task"):
        select_questions(prompts, ["qa"], 0)
    with pytest.raises(SpecbenchError, match="no questions for task"):
        select_questions(prompts, ["translation"], None)


def test_built_in_sample_set_covers_every_task_with_realistic_lengths():
    prompts = read_questions(None)
    by_task = {task: [p for p in prompts if p.task == task] for task in TASKS}
    assert all(len(by_task[task]) >= 3 for task in TASKS)
    assert all(len(p.turns) == 2 for p in by_task["mt_bench"])
    assert all(len(p.turns) == 1 for p in prompts if p.task != "mt_bench")
    for task in ("summarization", "rag"):
        assert all(2500 <= len(p.turns[0]) <= 3500 for p in by_task[task])
    assert all(p.turns[0].startswith("Translate German to English:") for p in by_task["translation"])
