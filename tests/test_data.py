import json

import pytest

from specbench.questions import (
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


# blank turns: refused for every source (a local file, a hub dataset, the built-in set), like an empty list

@pytest.mark.parametrize("turns, blank", [([""], 1), (["   "], 1), (["\n\t "], 1), (["first", ""], 2),
                                          (["first", " \u3000 "], 2)])
def test_a_blank_turn_is_refused_naming_the_question_and_turn(tmp_path, turns, blank):
    path = tmp_path / "q.jsonl"
    path.write_text(line(1, "qa", ["fine"]) + "\n" + line("q7", "writing", turns) + "\n")
    with pytest.raises(SpecbenchError) as error:
        read_questions(str(path))
    assert str(error.value) == (f"{path}, line 2: question 'q7' turn {blank} is empty (no text but whitespace); "
                                "every turn must hold the text of a question")


def test_a_hub_dataset_with_a_blank_turn_is_refused_too(tmp_path, monkeypatch):
    import specbench.questions as data

    path = tmp_path / "question.jsonl"
    path.write_text(line(3, "qa", [" "]) + "\n")
    monkeypatch.setattr(data, "_download_hub_questions", lambda spec: str(path))
    with pytest.raises(SpecbenchError, match=r"line 1: question 3 turn 1 is empty"):
        read_questions("hf:someone/questions")


def test_turns_with_text_are_kept_as_written():
    prompts = parse_questions([line(1, "writing", ["  a  ", "b"])], "test")
    assert prompts[0].turns == ("  a  ", "b")
    assert all(turn.strip() for prompt in read_questions(None) for turn in prompt.turns)


# a turn that outgrows the context: the message says by how much, whether the prompt fills or passes it

class StubModel:
    """The little of a LoadedModel that the context checks read: a prompt of ``lengths[turn]`` tokens."""

    name = "stub"

    def __init__(self, max_context, lengths):
        self.max_context = max_context
        self.lengths = lengths

    def encode_conversation(self, questions, answers):
        return [0] * self.lengths[len(questions) - 1]

    def decode(self, ids):
        return "x" * len(ids)


@pytest.mark.parametrize("length, message", [
    (200, "question 7 turn 1: the prompt has 200 tokens, as many as stub's context of 200 holds, leaving no room "
          "for an answer; a prompt may have at most 199 tokens (1 fewer), so that at least 1 token can be generated"),
    (250, "question 7 turn 1: the prompt has 250 tokens, more than stub's context of 200, leaving no room for an "
          "answer; a prompt may have at most 199 tokens (51 fewer), so that at least 1 token can be generated"),
])
def test_a_first_turn_too_long_for_the_context_is_explained(length, message):
    from specbench.questions import Prompt
    from specbench.engines.conversation import TurnTooLong, first_turn_ids

    prompt = Prompt(7, "qa", "qa", ("question",))
    with pytest.raises(TurnTooLong) as error:
        first_turn_ids(StubModel(200, [length]), prompt)
    assert str(error.value) == message
    assert len(first_turn_ids(StubModel(200, [199]), prompt)) == 199  # one token of room is enough


def test_a_later_turn_too_long_for_the_context_is_explained():
    from types import SimpleNamespace

    import numpy as np

    from specbench.questions import Prompt
    from specbench.engines.conversation import TurnTooLong, answer_question

    class StubDecoder:
        sampling = SimpleNamespace(seed=0)

        def forget_learning(self):
            pass

        def generate(self, prompt_ids, drafter, max_new_tokens, on_step=None, seed=None):
            return SimpleNamespace(token_ids=[1] * max_new_tokens, steps=[], wall_s=0.0,
                                   top_ids=np.zeros((0, 2)), top_logits=np.zeros((0, 2)))

    prompt = Prompt(7, "writing", "mt_bench", ("first", "second"))
    with pytest.raises(TurnTooLong) as error:
        answer_question(StubModel(100, [40, 100]), StubDecoder(), None, prompt, max_new_tokens=8)
    assert str(error.value) == ("question 7 turn 2: the prompt has 100 tokens (the earlier turns and answers "
                                "included), as many as stub's context of 100 holds, leaving no room for an answer; a "
                                "prompt may have at most 99 tokens (1 fewer), so that at least 1 token can be generated")


def test_an_id_python_cannot_read_is_one_line():
    # Valid JSON, but an integer of 5,000 digits is beyond Python's int parsing limit (a ValueError, not a
    # JSONDecodeError).
    line = '{"question_id": ' + "9" * 5000 + ', "category": "qa", "turns": ["hi"]}'
    with pytest.raises(SpecbenchError, match="questions.jsonl, line 1: unreadable"):
        parse_questions([line], "questions.jsonl")
