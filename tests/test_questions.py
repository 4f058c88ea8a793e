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
