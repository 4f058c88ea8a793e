"""Cached databases are keyed by what they are built from, heal when damaged, and are checked against the
target's vocabulary; a database given by path fails in one line naming it and a fix that works."""

from __future__ import annotations

import json
import logging
import os
import re
import runpy
import shlex
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import warnings_of

from specbench.datastores import suffix_automaton as sa
from specbench.artefacts.model_database import model_db
from specbench.artefacts.statistics_datastore import build_datastore, statistics_datastore
from specbench.datastores.model_db import save_model_db
from specbench.datastores.suffix_array import SEPARATOR, TokenDatastore
from specbench.datastores.suffix_automaton import StaticSuffixAutomaton
from specbench.artefacts.corpus_automaton import corpus_automaton
from specbench.drafters.samd import SuffixAutomatonDrafter
from specbench.errors import SpecbenchError
from specbench.artefacts.target_answers import target_answers

ROOT = Path(__file__).resolve().parents[1]
TEXT = "the cat sat on the mat. the cat sat on the hat. the dog sat on the log."
EDITED = "a bird flew over the tree. a bird flew over the sea."
BUILD = {"prompts": None, "exclude_questions": None, "max_prompts": None, "max_new_tokens": 6, "batch_size": 2,
         "max_ngrams": 1000, "include_final_ngram": True}


@pytest.fixture
def cache(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    monkeypatch.setenv("SPECBENCH_CACHE", str(root))
    return root


@pytest.fixture
def corpus_file(tmp_path):
    file = tmp_path / "corpus.txt"
    file.write_text(TEXT)
    return file


def vocab_size(target) -> int:
    """The embedding rows, which every database token id must stay below."""
    return target.weights.module.config.get_text_config().vocab_size


def encode(target, text: str) -> list[int]:
    return list(target.tokenizer.encode(text, add_special_tokens=False))


def published(directory: Path) -> list[Path]:
    """The artefacts in a cache folder, without their versions and locks (``.<name>.versions``)."""
    return sorted(path for path in directory.iterdir() if not path.name.startswith("."))


def only_entry(directory: Path) -> Path:
    [entry] = published(directory)
    return entry


# ---- caches keyed by content --------------------------------------------------------------------------


def test_an_edited_corpus_file_or_directory_gets_a_new_datastore(tiny, cache, corpus_file, tmp_path):
    assert statistics_datastore(tiny, "auto", str(corpus_file)).tokens.tolist() == encode(tiny, TEXT) + [SEPARATOR]
    corpus_file.write_text(EDITED)
    assert statistics_datastore(tiny, "auto", str(corpus_file)).tokens.tolist() == encode(tiny, EDITED) + [SEPARATOR]

    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "a.txt").write_text("one two")
    (folder / "b.txt").write_text("three")
    assert statistics_datastore(tiny, "auto", str(folder)).tokens.tolist() == (
        encode(tiny, "one two") + [SEPARATOR] + encode(tiny, "three") + [SEPARATOR])
    (folder / "b.txt").write_text("four")
    assert statistics_datastore(tiny, "auto", str(folder)).tokens.tolist() == (
        encode(tiny, "one two") + [SEPARATOR] + encode(tiny, "four") + [SEPARATOR])


def test_an_edited_corpus_file_gets_a_new_automaton(tiny, cache, corpus_file):
    first = corpus_automaton(tiny, str(corpus_file))
    assert first.tokens[1 : 1 + len(encode(tiny, TEXT))].tolist() == encode(tiny, TEXT)
    corpus_file.write_text(EDITED)
    second = corpus_automaton(tiny, str(corpus_file))
    assert second.tokens[1 : 1 + len(encode(tiny, EDITED))].tolist() == encode(tiny, EDITED)


def test_edited_prompt_or_question_files_get_a_new_model_db(tiny, cache, tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("Explain in a few plain words why the sky is blue.\nCount to five.\n")
    questions = tmp_path / "questions.jsonl"
    questions.write_text(json.dumps({"question_id": 1, "category": "writing", "turns": ["Write a poem."]}) + "\n")
    build = {**BUILD, "prompts": str(prompts), "exclude_questions": str(questions)}

    def manifests():
        return sorted((json.loads((d / "manifest.json").read_text()) for d in published(cache / "model_db")),
                      key=lambda m: m["prompts_overlapping_questions"])

    model_db(tiny, "auto", 1, 2, 7, build)
    prompts.write_text("Explain in a few plain words why the sea is blue.\nCount to six.\n")
    model_db(tiny, "auto", 1, 2, 7, build)
    assert len(manifests()) == 2
    # The question now shares a word 8-gram with the first prompt, which a new database must leave out.
    questions.write_text(json.dumps({"question_id": 1, "category": "writing",
                                     "turns": ["Explain in a few plain words why the sea is blue."]}) + "\n")
    model_db(tiny, "auto", 1, 2, 7, build)
    assert [m["prompts_overlapping_questions"] for m in manifests()] == [0, 0, 1]
    assert manifests()[-1]["prompts_used"] == 1


def test_target_answers_follow_the_prompt_file_content_and_heal(tiny, cache, tmp_path, caplog):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("Name three colours.\n")
    first = target_answers(tiny, str(prompts), max_new_tokens=4, batch_size=2)
    assert first[0][0] == tiny.encode_conversation(["Name three colours."], [])
    prompts.write_text("Count to five.\n")
    second = target_answers(tiny, str(prompts), max_new_tokens=4, batch_size=2)
    assert second[0][0] == tiny.encode_conversation(["Count to five."], [])

    for file in (cache / "answers").glob("*/answers.jsonl"):
        file.write_text("garbage\n")
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        assert target_answers(tiny, str(prompts), max_new_tokens=4, batch_size=2) == second
    [warning] = warnings_of(caplog)
    assert "damaged" in warning and "again" in warning


# ---- damaged auto caches are rebuilt ----------------------------------------------------------------


def _truncate(file: Path) -> None:
    data = file.read_bytes()
    file.write_bytes(data[: len(data) - 8])


def _overwrite_suffixes_same_size(directory: Path, target) -> None:
    suffixes = np.load(directory / "suffixes.npy")
    np.save(directory / "suffixes.npy", suffixes[::-1].copy())  # same size, wrong order: silently wrong matches


def _out_of_vocabulary(directory: Path, target) -> None:
    manifest = json.loads((directory / "manifest.json").read_text())
    TokenDatastore.build([[1, 2, vocab_size(target) + 3]], {"tokenizer": manifest["tokenizer"]}).save(directory)


DATASTORE_DAMAGE = {
    "truncated tokens.npy": lambda directory, target: _truncate(directory / "tokens.npy"),
    "suffixes.npy overwritten, same size": _overwrite_suffixes_same_size,
    "garbage manifest.json": lambda directory, target: (directory / "manifest.json").write_text("{not json"),
    "manifest.json a list": lambda directory, target: (directory / "manifest.json").write_text("[1, 2]"),
    "out-of-vocabulary ids": _out_of_vocabulary,
}


@pytest.mark.parametrize("damage", DATASTORE_DAMAGE.values(), ids=DATASTORE_DAMAGE.keys())
def test_a_damaged_auto_datastore_is_rebuilt_with_one_warning(tiny, cache, corpus_file, caplog, damage):
    fresh = statistics_datastore(tiny, "auto", str(corpus_file))
    tokens, suffixes = fresh.tokens.tolist(), fresh.suffixes.tolist()  # copies: the damage rewrites the files
    query = np.array(encode(tiny, "sat on the"))
    matches = fresh.find(query)
    directory = only_entry(cache / "datastores")
    del fresh
    damage(directory, tiny)
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        healed = statistics_datastore(tiny, "auto", str(corpus_file))
    [warning] = warnings_of(caplog)
    assert "damaged" in warning and "rebuilt" in warning and str(directory) in warning
    assert healed.tokens.tolist() == tokens and healed.suffixes.tolist() == suffixes
    assert healed.find(query) == matches and matches[1] - matches[0] == 3
    assert only_entry(cache / "datastores") == directory
    caplog.clear()
    statistics_datastore(tiny, "auto", str(corpus_file))
    assert warnings_of(caplog) == []


AUTOMATON_DAMAGE = {
    "truncated hash_keys.npy": lambda directory: _truncate(directory / "hash_keys.npy"),
    "edge_token.npy overwritten, same size": lambda directory: np.save(
        directory / "edge_token.npy", np.zeros_like(np.load(directory / "edge_token.npy"))),
    "garbage manifest.json": lambda directory: (directory / "manifest.json").write_text("\x00\x01"),
}


@pytest.mark.parametrize("damage", AUTOMATON_DAMAGE.values(), ids=AUTOMATON_DAMAGE.keys())
def test_a_damaged_auto_automaton_is_rebuilt_with_one_warning(tiny, cache, corpus_file, caplog, damage):
    fresh = corpus_automaton(tiny, str(corpus_file))
    arrays = {name: np.array(getattr(fresh, name)) for name in sa._ARRAYS}  # copies, as above
    directory = only_entry(cache / "sam")
    del fresh
    damage(directory)
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        healed = corpus_automaton(tiny, str(corpus_file))
    [warning] = warnings_of(caplog)
    assert "damaged" in warning and "rebuilt" in warning and str(directory) in warning
    used = arrays["hash_keys"] != -1  # free hash slots hold whatever np.empty gave
    for name, array in arrays.items():
        if name == "hash_values":
            assert np.array_equal(healed.hash_values[used], array[used])
        else:
            assert np.array_equal(getattr(healed, name), array), name
    healed.reset()
    healed.transfer_tokens(encode(tiny, "the cat sat on"))
    assert healed.lookup(encode(tiny, " ")[0])[1] == len(encode(tiny, "the cat sat on "))


def test_a_damaged_auto_model_db_is_rebuilt_with_one_warning(tiny, cache, tmp_path, caplog):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("Name three colours.\nCount to five.\n")
    build = {**BUILD, "prompts": str(prompts)}
    fresh = model_db(tiny, "auto", 1, 2, 7, build)
    directory = only_entry(cache / "model_db")
    _truncate(directory / "ngrams.npz")
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        healed = model_db(tiny, "auto", 1, 2, 7, build)
    [warning] = warnings_of(caplog)
    assert "damaged" in warning and "rebuilt" in warning and str(directory) in warning
    assert healed.table == fresh.table and fresh.table


# ---- databases given by path ------------------------------------------------------------------------


def _cut_in_half(file: Path) -> None:
    text = file.read_text()
    file.write_text(text[: len(text) // 2])


EXPLICIT_DAMAGE = {
    "truncated tokens.npy": lambda directory: _truncate(directory / "tokens.npy"),
    "manifest.json cut short": lambda directory: _cut_in_half(directory / "manifest.json"),
}


@pytest.mark.parametrize("damage", EXPLICIT_DAMAGE.values(), ids=EXPLICIT_DAMAGE.keys())
def test_a_damaged_datastore_given_by_path_names_it_and_a_command_that_rebuilds_it(
        tiny, cache, corpus_file, tmp_path, monkeypatch, damage):
    """The command rebuilds it from the corpus it was built from (its manifest says, even cut short), not from
    the drafter's corpus setting, which is what ``auto`` would build from (python-docs by default)."""
    directory = tmp_path / "my datastore"  # a space: the suggested command must quote it
    build_datastore(tiny, str(corpus_file), directory, cache)
    damage(directory)
    with pytest.raises(SpecbenchError) as caught:
        statistics_datastore(tiny, str(directory))  # the drafter's default corpus
    message = str(caught.value)
    assert "\n" not in message and message.startswith(f"{directory}: damaged datastore")
    command = shlex.split(re.search(r"`([^`]+)`", message).group(1))
    assert command[:2] == ["python", "scripts/build_datastore.py"] and command[-2:] == ["--out", str(directory)]
    monkeypatch.setattr(sys, "argv", command[1:])
    runpy.run_path(str(ROOT / command[1]), run_name="__main__")
    rebuilt = statistics_datastore(tiny, str(directory), str(corpus_file))
    assert rebuilt.tokens.tolist() == encode(tiny, TEXT) + [SEPARATOR]


def test_a_datastore_whose_manifest_is_garbage_names_no_corpus_it_was_not_built_from(tiny, cache, corpus_file,
                                                                                     tmp_path):
    directory = tmp_path / "ds"
    build_datastore(tiny, str(corpus_file), directory, cache)
    (directory / "manifest.json").write_text("\x00\x01")
    with pytest.raises(SpecbenchError) as caught:
        statistics_datastore(tiny, str(directory), "python-docs")
    command = shlex.split(re.search(r"`([^`]+)`", str(caught.value)).group(1))
    assert command[command.index("--corpus") + 1] == "WHAT_IT_WAS_BUILT_FROM"


def test_a_damaged_model_db_given_by_path_names_the_prompts_it_was_built_from(tiny, cache, tmp_path):
    from specbench.artefacts.model_database import build_model_db

    built_from, configured = tmp_path / "built from.txt", tmp_path / "configured.txt"
    built_from.write_text("Name three colours.\nCount to five.\n")
    configured.write_text("Say hello.\n")
    build_model_db(tiny, tmp_path / "db", {**BUILD, "prompts": str(built_from)}, 1, 2)
    for damage in (lambda: _truncate(tmp_path / "db" / "ngrams.npz"),
                   lambda: _cut_in_half(tmp_path / "db" / "manifest.json")):
        damage()
        with pytest.raises(SpecbenchError) as caught:
            model_db(tiny, str(tmp_path / "db"), 1, 2, 7, {**BUILD, "prompts": str(configured)})
        command = shlex.split(re.search(r"`([^`]+)`", str(caught.value)).group(1))
        assert command[command.index("--prompts") + 1] == str(built_from), command


def test_damaged_model_db_and_automaton_given_by_path_are_one_line_with_a_fix(tiny, cache, corpus_file, tmp_path):
    from specbench.datastores.prompts import MODEL_DB_PROMPTS

    tables = {1: (np.array([[1, 2, 3]], np.int32), np.array([2], np.int64))}
    save_model_db(tmp_path / "db", tables, {"tokenizer": {"fingerprint": tiny.tokenizer_fingerprint},
                                            "key_tokens": 1, "continuation_length": 2,
                                            "prompts": str(MODEL_DB_PROMPTS)})
    _truncate(tmp_path / "db" / "ngrams.npz")
    with pytest.raises(SpecbenchError) as caught:
        model_db(tiny, str(tmp_path / "db"), 1, 2, 7, BUILD)
    message = str(caught.value)
    assert "\n" not in message and message.startswith(f"{tmp_path / 'db'}: damaged model database")
    assert f"`python scripts/build_model_db.py --model tiny-random --out {tmp_path / 'db'}`" in message

    StaticSuffixAutomaton.build([[1, 2, 3]], eos_token=0, progress=False).save(tmp_path / "sam")
    _truncate(tmp_path / "sam" / "link.npy")
    drafter = SuffixAutomatonDrafter(auxiliary="none", corpus=str(corpus_file), automaton=str(tmp_path / "sam"))
    with pytest.raises(SpecbenchError) as caught:
        drafter.prepare(tiny)
    message = str(caught.value)
    assert "\n" not in message and message.startswith(f"{tmp_path / 'sam'}: damaged suffix automaton (link.npy")
    assert "drafter.automaton=null" in message
    following_the_fix = SuffixAutomatonDrafter(auxiliary="none", corpus=str(corpus_file), automaton=None)
    following_the_fix.prepare(tiny)
    assert following_the_fix.static.num_tokens > 0


def test_out_of_vocabulary_ids_stop_the_load_with_the_path_and_the_id(tiny, tmp_path):
    vocab, fingerprint = vocab_size(tiny), tiny.tokenizer_fingerprint
    for bad in (vocab + 5, -7):
        directory = tmp_path / f"ds{bad}"
        TokenDatastore.build([[1, 2, 3], [4, bad]], {"tokenizer": {"fingerprint": fingerprint}}).save(directory)
        with pytest.raises(SpecbenchError, match=rf"^{re.escape(str(directory))}: token id {bad} in tokens.npy "
                                                 rf"is outside the target's vocabulary \(ids 0..{vocab - 1}"):
            statistics_datastore(tiny, str(directory))

    tables = {1: (np.array([[1, 2, 3], [4, vocab, 5]], np.int32), np.array([2, 1], np.int64))}
    save_model_db(tmp_path / "db", tables, {"tokenizer": {"fingerprint": fingerprint}, "key_tokens": 1,
                                            "continuation_length": 2})
    with pytest.raises(SpecbenchError, match=rf"^{re.escape(str(tmp_path / 'db'))}: token id {vocab} in ngrams_1"):
        model_db(tiny, str(tmp_path / "db"), 1, 2, 7, BUILD)

    StaticSuffixAutomaton.build([[1, 2, vocab + 1]], eos_token=0, progress=False).save(tmp_path / "sam")
    drafter = SuffixAutomatonDrafter(auxiliary="none", corpus=None, automaton=str(tmp_path / "sam"))
    with pytest.raises(SpecbenchError, match=rf"^{re.escape(str(tmp_path / 'sam'))}: token id {vocab + 1} in "
                                             rf"tokens.npy"):
        drafter.prepare(tiny)


# ---- a cache that cannot be written -----------------------------------------------------------------


def _builders(target, corpus_file: Path, prompts: Path):
    return {
        "datastore": lambda: statistics_datastore(target, "auto", str(corpus_file)),
        "automaton": lambda: corpus_automaton(target, str(corpus_file)),
        "model database": lambda: model_db(target, "auto", 1, 2, 7, {**BUILD, "prompts": str(prompts)}),
        "answers": lambda: target_answers(target, str(prompts), max_new_tokens=4),
    }


def test_a_read_only_cache_is_one_line_naming_the_directory(tiny, tmp_path, monkeypatch, corpus_file):
    cache = tmp_path / "cache"
    cache.mkdir()
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("Count to five.\n")
    monkeypatch.setenv("SPECBENCH_CACHE", str(cache))
    cache.chmod(0o555)
    try:
        if os.access(cache, os.W_OK):
            pytest.skip("chmod does not stop this user (root) from writing")
        for what, call in _builders(tiny, corpus_file, prompts).items():
            with pytest.raises(SpecbenchError) as caught:
                call()
            message = str(caught.value)
            assert "\n" not in message and f"{cache} is not a writable directory" in message, what
            assert "SPECBENCH_CACHE" in message and "cache_dir" in message, what
    finally:
        cache.chmod(0o755)


def test_a_cache_path_that_is_a_file_is_one_line_naming_it(tiny, tmp_path, monkeypatch, corpus_file):
    blocker = tmp_path / "cache"
    blocker.write_text("not a directory")
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("Count to five.\n")
    monkeypatch.setenv("SPECBENCH_CACHE", str(blocker))
    for what, call in _builders(tiny, corpus_file, prompts).items():
        with pytest.raises(SpecbenchError) as caught:
            call()
        message = str(caught.value)
        assert "\n" not in message and f"{blocker} is not a writable directory" in message, what
        assert "SPECBENCH_CACHE" in message, what


# ---- what the checks cost ---------------------------------------------------------------------------


def test_a_copied_database_is_hashed_once_its_times_differ_and_still_loads(tiny, cache, corpus_file, tmp_path):
    import shutil

    fresh = statistics_datastore(tiny, "auto", str(corpus_file))
    copy = tmp_path / "copy"
    shutil.copytree(only_entry(cache / "datastores"), copy, copy_function=shutil.copyfile)  # new mtimes
    assert statistics_datastore(tiny, str(copy)).tokens.tolist() == fresh.tokens.tolist()
    suffixes = np.load(copy / "suffixes.npy")
    np.save(copy / "suffixes.npy", suffixes[::-1].copy())
    with pytest.raises(SpecbenchError, match="suffixes.npy is not the file that was written"):
        statistics_datastore(tiny, str(copy))
