"""Question files: a file that is not one (binary, not UTF-8, one pretty-printed JSON document, JSON lines that are
not question records) is refused in one line naming the file, the line and the expected format; a byte order mark
is read (moved from test_errors.py)."""

import json

import pytest
from conftest import one_line

from specbench.errors import SpecbenchError
from specbench.questions import read_questions


RECORD = {"question_id": 1, "category": "qa", "turns": ["What is a suffix array?"]}


def refused(path) -> str:
    with pytest.raises(SpecbenchError) as error:
        read_questions(str(path))
    message = one_line(error)
    assert str(path) in message
    return message


def test_a_binary_file_is_refused_with_the_expected_format(tmp_path):
    path = tmp_path / "weights.bin"
    path.write_bytes(bytes(range(256)) * 64)
    message = refused(path)
    assert "binary file" in message and "one object per line" in message


def test_a_non_utf8_file_is_refused_with_its_line(tmp_path):
    path = tmp_path / "latin1.jsonl"
    second = json.dumps({**RECORD, "question_id": 2, "turns": ["Qu'est-ce qu'un café ?"]}, ensure_ascii=False)
    path.write_bytes((json.dumps(RECORD) + "\n" + second + "\n").encode("latin-1"))
    message = refused(path)
    assert "line 2: not UTF-8 text (byte 0xe9" in message and "one object per line" in message


@pytest.mark.parametrize("document", [[RECORD, {**RECORD, "question_id": 2}], {"questions": [RECORD]}],
                         ids=["list", "object"])
def test_one_pretty_printed_json_document_is_refused(tmp_path, document):
    path = tmp_path / "questions.json"
    path.write_text(json.dumps(document, indent=2))
    message = refused(path)
    assert "not JSON lines" in message and "one object per line" in message


def test_json_lines_that_are_not_question_records_are_refused(tmp_path):
    path = tmp_path / "other.jsonl"
    path.write_text(json.dumps([RECORD]) + "\n")
    assert "line 1: a JSON list, not an object" in refused(path)
    path.write_text(json.dumps({"prompt": "hello", "answer": "hi"}) + "\n")
    message = refused(path)
    assert "line 1: missing question_id, category, turns" in message and "one object per line" in message
    path.write_text(json.dumps({**RECORD, "question_id": [1]}) + "\n")
    assert "line 1: question_id must be an integer or a string, got [1]" in refused(path)
    path.write_text(json.dumps({**RECORD, "category": ["qa"]}) + "\n")
    assert "line 1: category ['qa'] belongs to no task" in refused(path)


def test_a_utf8_file_with_a_byte_order_mark_is_read(tmp_path):
    path = tmp_path / "bom.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + (json.dumps(RECORD) + "\n").encode())
    assert [prompt.question_id for prompt in read_questions(str(path))] == [1]


def _multilingual_copy(root):
    """Multilingual-SpecBench's dataset/eval layout: <pair>_bench/question.jsonl of {question_id, category, turns}."""
    import json

    for pair, language in (("deen", "German"), ("zhen", "Chinese")):
        folder = root / f"{pair}_bench"
        folder.mkdir(parents=True)
        lines = [json.dumps({"question_id": f"wmt_{pair}_{i}", "category": pair,
                             "turns": [f"Translate {language} to English:sentence {i}"]}) for i in (1, 2, 3)]
        (folder / "question.jsonl").write_text("\n".join(lines))  # no newline after the last line, as theirs
    (root / "judge_prompts.jsonl").write_text('{"name": "pair-v2"}\n')  # beside them in dataset/eval, not questions


def test_the_multilingual_sets_are_read_from_a_copy_of_the_repositorys_folder(tmp_path):
    from specbench.questions import select_questions

    _multilingual_copy(tmp_path)
    prompts = read_questions(str(tmp_path))
    assert [prompt.task for prompt in prompts] == ["deen"] * 3 + ["zhen"] * 3
    assert [p.question_id for p in select_questions(prompts, ["zhen"], 2)] == ["wmt_zhen_1", "wmt_zhen_2"]
    one = read_questions(str(tmp_path / "deen_bench"))  # a folder holding question.jsonl
    assert [prompt.question_id for prompt in one] == ["wmt_deen_1", "wmt_deen_2", "wmt_deen_3"]


def test_the_built_in_sets_hold_specbench_own_translation_questions_of_every_pair():
    from specbench.questions import MULTILINGUAL_TASKS, select_questions

    chosen = select_questions(read_questions(None), list(MULTILINGUAL_TASKS), None)
    assert len(chosen) == 20 and {prompt.task for prompt in chosen} == set(MULTILINGUAL_TASKS)
    assert all(prompt.turns[0].startswith("Translate ") and " to English:" in prompt.turns[0] for prompt in chosen)
    assert len(select_questions(read_questions(None), ["qa"], None)) == 4  # Spec-Bench's set as before


def test_a_folder_without_questions_or_with_one_id_twice_is_one_line(tmp_path):
    from conftest import refusal

    assert "no question.jsonl" in refusal(read_questions, str(tmp_path))
    _multilingual_copy(tmp_path / "a")
    (tmp_path / "a" / "zhen_bench" / "question.jsonl").write_text(
        (tmp_path / "a" / "deen_bench" / "question.jsonl").read_text().replace('"deen"', '"zhen"'))
    assert "appears in more than one" in refusal(read_questions, str(tmp_path / "a"))


def test_a_longbench_file_is_read_and_a_record_of_neither_form_is_refused_naming_both(tmp_path):
    """A LongBench record ({"input", "context", "answers", ...}) in <subset>.jsonl is read as LongSpec formats it
    (tests/test_long_context.py pins the templates); a record of neither form is one line naming both."""
    from conftest import refusal

    path = tmp_path / "gov_report.jsonl"
    path.write_text('{"input": "", "context": "A long report ...", "answers": ["..."], "length": 9000}\n')
    [prompt] = read_questions(str(path))
    assert (prompt.question_id, prompt.task) == ("gov_report_1", "gov_report")
    assert prompt.turns[0].startswith("You are given a report by a government agency.") and \
        "\nReport:\nA long report ...\n\n" in prompt.turns[0]
    path = tmp_path / "summaries.jsonl"
    path.write_text('{"input": "", "document": "A long report ...", "answers": ["..."]}\n')
    message = refusal(read_questions, str(path))
    assert "missing question_id, category, turns" in message and '"turns"' in message
    assert "LongBench's records" in message and "gov_report.jsonl" in message


def test_the_multilingual_task_configs_select_the_pairs():
    from specbench.config import compose
    from specbench.questions import MULTILINGUAL_TASKS

    assert tuple(compose(["task=multilingual"]).task.tasks) == MULTILINGUAL_TASKS
    for pair in MULTILINGUAL_TASKS:
        task = compose([f"task={pair}"]).task
        assert list(task.tasks) == [pair] and task.name == pair and task.path is None
