"""The lines of a run's result files are checked, never trusted: every reader (resuming, the summary, analysis)
counts only well-formed records of the run's own questions, once each, with one warning per file naming the
others; question ids of either JSON type and any size are written and compared one way; a filesystem that
refuses a write is one line, and nothing half-written is left for a later read to trust."""

import errno
import json
import logging
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
from conftest import answer

from specbench.storage.manifest import file_digest
from specbench.questions import Prompt
from specbench.errors import SpecbenchError
from specbench.results import run_directory, steps_file
from specbench.results.run_directory import append_line
from specbench.storage.atomic import write_atomically
from specbench.results.question_keys import question_key
from specbench.results.readers import read_answers
from specbench.results.run_directory import RunDirectory
from specbench.results.schema import Answer, StepRecord
from specbench.results.steps_file import read_steps_file

SETTINGS = {"model": "m", "drafter": {"name": "pld"}}
BIG = 2**70  # beyond int64: no Arrow integer column holds it


def add_question(run_dir: RunDirectory, question_id, seconds=1.0):
    """One finished question: method twice as fast as the baseline."""
    prompt = Prompt(question_id, "qa", "qa", ("q",))
    method, base = answer(seconds=seconds), answer(seconds=2 * seconds, accepted=(1,) * 5)
    run_dir.add(method.to_record(prompt, "m", True), base.to_record(prompt, "ar", None), method.step_rows(question_id))


def make_run(path: Path, ids=(1, 2, 3), settings=SETTINGS) -> RunDirectory:
    run_dir = RunDirectory(path, with_baseline=True)
    run_dir.open(settings)
    for question_id in ids:
        add_question(run_dir, question_id)
    return run_dir


def lines_of(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


def file_warnings(caplog, path: Path) -> list[str]:
    return [record.getMessage() for record in caplog.records
            if record.levelno == logging.WARNING and record.getMessage().startswith(f"{path}:")]


def insert_line(path: Path, index: int, text: str) -> None:
    kept = lines_of(path)
    path.write_text("\n".join([*kept[:index], text, *kept[index:]]) + "\n", encoding="utf-8")


# 1. every line that is not a well-formed record of the run is named, never counted, never fatal


def test_a_repeated_answer_line_counts_once_on_resume_and_in_the_summary(tmp_path, caplog):
    make_run(tmp_path)
    for name in ("answers.jsonl", "baseline_answers.jsonl"):
        with (tmp_path / name).open("a", encoding="utf-8") as handle:
            handle.write(lines_of(tmp_path / name)[0] + "\n")  # question 1 again, as `cat a >> answers.jsonl` leaves it
    reopened = RunDirectory(tmp_path, with_baseline=True)
    with caplog.at_level(logging.WARNING):
        assert reopened.open(SETTINGS) == {1, 2, 3}
    [warning] = file_warnings(caplog, tmp_path / "answers.jsonl")
    assert "line 4 repeats question 1 of line 1 (the first is kept)" in warning
    assert len(lines_of(tmp_path / "answers.jsonl")) == 3  # rewritten without it: appends continue cleanly
    summary = reopened.write_summary({"model": "m", "drafter": "pld"})
    assert summary["tasks"]["overall"]["questions"] == 3
    assert summary["tasks"]["overall"]["speedup"] == pytest.approx(2.0)


FIRST = {"question_id": 2, "category": "qa", "choices": [{"turns": ["x"], "new_tokens": [5], "wall_time": [1.0],
                                                          "accept_lengths": [1, 2, 2]}],
         "specbench": {"task": "qa", "identical_to_baseline": True, "drafted_tokens": 4, "mismatch": None}}


def changed(path: str, value):
    """FIRST with the value at a dotted ``path`` (``choices.0.new_tokens``) replaced, or removed for ``...``."""
    record = json.loads(json.dumps(FIRST))
    *parents, last = path.split(".")
    node = record
    for key in parents:
        node = node[int(key)] if isinstance(node, list) else node[key]
    if value is ...:
        del node[last]
    else:
        node[last] = value
    return json.dumps(record)


@pytest.mark.parametrize("line, why", [
    ("{}", "has no question_id"),
    ("[1, 2]", "is a JSON array, not an object"),
    ("42", "is a JSON number, not an object"),
    ('"answer"', "is a JSON string, not an object"),
    ("null", "is a JSON null, not an object"),
    ('{"question_id": 1, "categ', "is not valid JSON"),
    (changed("question_id", True), "has a question_id true that is not an integer or a string"),
    (changed("question_id", [2]), "has a question_id [2] that is not an integer or a string"),
    (changed("choices", ...), "has no choices"),
    (changed("choices", {}), "has no choices"),
    (changed("category", 5), "has no category"),
    (changed("choices.0.new_tokens", "abc"), "has no choices[0].new_tokens"),
    (changed("choices.0.new_tokens", [-3]), "has a choices[0].new_tokens that is not a list of token counts"),
    (changed("choices.0.wall_time", ["1.0"]), "has a choices[0].wall_time that is not a list of seconds"),
    (changed("choices.0.wall_time", [0.0]), "has no positive wall_time"),
    (changed("choices.0.wall_time", [0.5, 0.5]), "has 1 new_tokens but 2 wall_time entries"),
    (changed("choices.0.accept_lengths", []), "has a choices[0].accept_lengths that is not a non-empty list"),
    (changed("specbench.draft_depths", [0]), "has a specbench.draft_depths that is not a list of draft depths, one per"),
    (changed("specbench.draft_depths", "deep"), "has a specbench.draft_depths that is not a list of draft depths"),
    # A step appends at most its draft's depth + the bonus token: depths that say otherwise were recorded wrong.
    (changed("specbench.draft_depths", [0, 0, 3]), "has a step (accept_lengths[1]) that appends 2 tokens after a "
                                                   "draft 0 deep (specbench.draft_depths): at most depth + 1"),
    (changed("specbench", ...), "has no specbench object"),
    (changed("specbench.task", "poetry"), "has no known specbench.task"),
    (changed("specbench.identical_to_baseline", "yes"), "has a specbench.identical_to_baseline that is not true, false or null"),
    (changed("specbench.mismatch", {"kind": "violation"}), "has a specbench.mismatch violation without its tokens and margins"),
])
def test_a_malformed_answer_line_is_named_in_one_warning_and_never_fatal(tmp_path, caplog, line, why):
    make_run(tmp_path, ids=(1, 3))
    insert_line(tmp_path / "answers.jsonl", 1, line)
    with caplog.at_level(logging.WARNING):
        assert RunDirectory(tmp_path, with_baseline=True).finished_ids() == {1, 3}  # a read-only look
        summary_run = RunDirectory(tmp_path, with_baseline=True)
        assert summary_run.open(SETTINGS) == {1, 3}
    warnings = file_warnings(caplog, tmp_path / "answers.jsonl")
    assert len(warnings) == 2 and warnings[0] == warnings[1]  # one per read, each naming line and why
    assert f"line 2 {why}" in warnings[0] and "(1 line(s) left out, not counted)" in warnings[0], warnings[0]
    assert summary_run.write_summary({"model": "m", "drafter": "pld"})["tasks"]["overall"]["questions"] == 2
    assert [record["question_id"] for record in read_answers(tmp_path)] == [1, 3]


def question_file(path: Path, ids) -> dict:
    """A question file of ``ids`` and the task settings run.json records for it."""
    path.write_text("".join(json.dumps({"question_id": q, "category": "qa", "turns": ["q"]}) + "\n" for q in ids))
    return {**SETTINGS, "task": {"path": str(path), "content_sha256": file_digest(path)}}


def test_lines_and_step_rows_of_a_question_outside_the_run_are_left_out_with_a_warning(tmp_path, caplog):
    settings = question_file(tmp_path / "questions.jsonl", [1, 2])
    run = tmp_path / "run"
    make_run(run, ids=(1, 2), settings=settings)
    stranger = RunDirectory(tmp_path / "other", with_baseline=True)
    stranger.open(SETTINGS)
    add_question(stranger, 999)
    for name in ("answers.jsonl", "baseline_answers.jsonl"):  # a whole question of another run, pasted in
        with (run / name).open("a", encoding="utf-8") as handle:
            handle.write((tmp_path / "other" / name).read_text())
    steps = pd.concat([read_steps_file(run / "steps.parquet"), read_steps_file(tmp_path / "other" / "steps.parquet")])
    steps_file.write_steps_file(steps, run / "steps.parquet")
    with caplog.at_level(logging.WARNING):
        RunDirectory(run, with_baseline=True).skip(Prompt(999, "qa", "qa", ("q",)), "too long")
        assert RunDirectory(run, with_baseline=True).open(settings) == {1, 2}
    assert "line 3 is of question 999, not one of this run's questions" in file_warnings(caplog, run / "answers.jsonl")[0]
    assert "line 1 is of question 999" in file_warnings(caplog, run / "skipped.jsonl")[0]
    [rows] = file_warnings(caplog, run / "steps.parquet")
    assert rows.startswith(f"{run / 'steps.parquet'}: rows 7-9 are of question 999, not one of this run's questions")
    assert sorted(pd.read_parquet(run / "steps.parquet").question_id.unique()) == [1, 2]
    assert RunDirectory(run, with_baseline=True).skipped_ids() == set()


def test_unfinished_and_repeated_skip_lines_are_named_and_not_counted(tmp_path, caplog):
    run_dir = make_run(tmp_path, ids=(1,))
    run_dir.skip(Prompt(7, "qa", "qa", ("q",)), "too long for the context")
    with (tmp_path / "skipped.jsonl").open("a", encoding="utf-8") as handle:
        handle.write(lines_of(tmp_path / "skipped.jsonl")[0] + "\n{}\n")
        handle.write(json.dumps({"question_id": 8, "reason": "r", "cause": "bored"}) + "\n")
    # the baseline line of question 2 written, the method's not yet: a kill between the two
    with (tmp_path / "baseline_answers.jsonl").open("a", encoding="utf-8") as handle:
        handle.write(lines_of(tmp_path / "baseline_answers.jsonl")[0].replace('"question_id": 1', '"question_id": 2')
                     + "\n")
    reopened = RunDirectory(tmp_path, with_baseline=True)
    with caplog.at_level(logging.WARNING):
        assert reopened.open(SETTINGS) == {1}
    [skips] = file_warnings(caplog, tmp_path / "skipped.jsonl")
    assert "line 2 repeats question 7 of line 1" in skips and "line 3 has no question_id" in skips
    assert "line 4 has an unknown cause \"bored\"" in skips and "(3 line(s) left out" in skips
    [baseline] = file_warnings(caplog, tmp_path / "baseline_answers.jsonl")
    assert "line 2 is of question 2, which is not finished (no method answer, no steps)" in baseline
    assert [record["question_id"] for record in reopened.skipped] == [7]
    assert reopened.write_summary({"model": "m", "drafter": "pld"})["skipped_by_cause"] == {"too_long": 1}


def test_repeated_step_rows_are_left_out(tmp_path, caplog):
    make_run(tmp_path, ids=(1, 2))
    steps = read_steps_file(tmp_path / "steps.parquet")
    steps_file.write_steps_file(pd.concat([steps, steps[steps.question_id == 2]]), tmp_path / "steps.parquet")
    with caplog.at_level(logging.WARNING):
        RunDirectory(tmp_path, with_baseline=True).open(SETTINGS)
    [rows] = file_warnings(caplog, tmp_path / "steps.parquet")
    assert "rows 7-9 repeat steps of question 2 (the first are kept)" in rows
    assert len(pd.read_parquet(tmp_path / "steps.parquet")) == 6


# 3. question ids of either JSON type and any size


MIXED = [1, "q2", BIG, "1"]  # 1 and "1" are two questions, as the question file says


def test_ids_of_mixed_types_and_beyond_int64_are_written_read_and_paired_consistently(tmp_path):
    settings = question_file(tmp_path / "questions.jsonl", MIXED)
    run = tmp_path / "run"
    make_run(run, ids=MIXED, settings=settings)  # before: ArrowInvalid writing the steps of "q2"
    reopened = RunDirectory(run, with_baseline=True)
    finished = reopened.open(settings)
    assert finished == set(MIXED) and len(finished) == 4
    steps = read_steps_file(run / "steps.parquet")
    assert [question_key(q) for q in steps.question_id.unique()] == [question_key(q) for q in MIXED]
    assert {type(q) for q in steps.question_id} == {int, str}
    summary = reopened.write_summary({"model": "m", "drafter": "pld"})
    assert summary["tasks"]["overall"]["questions"] == 4 and summary["tasks"]["overall"]["speedup"] == pytest.approx(2)
    add_question(reopened, 5)  # appends keep the form: the ids still read back as written
    assert [question_key(q) for q in read_steps_file(run / "steps.parquet").question_id.unique()] == \
        [question_key(q) for q in [*MIXED, 5]]


def test_integer_or_string_ids_keep_their_native_parquet_column(tmp_path):
    make_run(tmp_path / "ints", ids=(1001, 1005))
    make_run(tmp_path / "strings", ids=("a", "b"))
    assert pd.read_parquet(tmp_path / "ints" / "steps.parquet").question_id.tolist() == [1001] * 3 + [1005] * 3
    assert pd.read_parquet(tmp_path / "strings" / "steps.parquet").question_id.tolist() == ["a"] * 3 + ["b"] * 3
    assert pq.read_schema(tmp_path / "ints" / "steps.parquet").metadata.get(steps_file.ID_FORM_KEY) is None


def test_question_key_tells_one_from_the_string_one():
    assert question_key(1) != question_key("1") and question_key(np.int64(7)) == question_key(7) == "7"
    assert question_key(BIG) == str(BIG)


# 6. refused writes: one line naming the file, nothing half-written left


def full_disk(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")


def test_write_atomically_removes_its_staging_file_and_names_the_path(tmp_path):
    target = tmp_path / "summary.json"
    target.write_text("old")

    def half(staging):
        staging.write_text("half of it")
        full_disk()

    with pytest.raises(SpecbenchError) as error:
        write_atomically(target, half)
    assert str(error.value).startswith(f"cannot write {target}: the disk is full (ENOSPC)")
    assert target.read_text() == "old" and list(tmp_path.iterdir()) == [target]


@pytest.mark.parametrize("what", ["steps", "summary", "drafter state", "run.json", "rewrite"])
def test_every_result_file_write_refused_by_the_filesystem_is_one_line(tmp_path, monkeypatch, what):
    run = tmp_path / "run"
    run_dir = make_run(run, ids=(1,))
    before = (run / "steps.parquet").read_bytes()
    if what == "steps":  # half a parquet file written, then the disk is full
        monkeypatch.setattr(steps_file.pq, "write_table", lambda table, where: (Path(where).write_bytes(b"PAR1"),
                                                                             full_disk()))
        act, refused = lambda: add_question(run_dir, 2), run / "steps.parquet"
    elif what == "drafter state":
        monkeypatch.setattr(run_directory.np, "savez", full_disk)
        act, refused = lambda: run_dir.save_drafter_state({"matrix": np.zeros(3)}), run / "drafter_state.npz"
    else:
        monkeypatch.setattr(Path, "write_text", full_disk)
        act, refused = {
            "summary": (lambda: run_dir.write_summary({"model": "m", "drafter": "pld"}), run / "summary.json"),
            "run.json": (lambda: RunDirectory(tmp_path / "new", True).open(SETTINGS), tmp_path / "new" / "run.json"),
            "rewrite": (lambda: RunDirectory(run, True).open(SETTINGS), run / "answers.jsonl"),
        }[what]
    with pytest.raises(SpecbenchError) as error:
        act()
    assert str(error.value).startswith(f"cannot write {refused}: the disk is full (ENOSPC); ")
    assert not list(tmp_path.rglob("*.partial"))
    monkeypatch.undo()
    assert (run / "steps.parquet").read_bytes() == before  # the old file, whole
    assert RunDirectory(run, True).open(SETTINGS) == {1}  # question 2's lines, if any, are not finished


def appending_half_then(refusal: int, monkeypatch, truncate_fails=False):
    """os.write on answers.jsonl writes half of what it is given, then the filesystem refuses."""
    real_write, calls = os.write, []

    def write(handle, data):
        if Path(os.readlink(f"/proc/self/fd/{handle}")).name != "answers.jsonl":
            return real_write(handle, data)
        calls.append(len(data))
        if len(calls) == 1:
            return real_write(handle, data[: len(data) // 2])
        raise OSError(refusal, os.strerror(refusal))

    monkeypatch.setattr(os, "write", write)
    if truncate_fails:
        monkeypatch.setattr(os, "ftruncate", lambda handle, size: full_disk())
    return calls


@pytest.mark.parametrize("refusal, text", [(errno.ENOSPC, "the disk is full"), (errno.EDQUOT, "the disk quota"),
                                           (errno.EROFS, "the filesystem is read-only")])
def test_an_append_cut_short_is_undone_and_named(tmp_path, monkeypatch, refusal, text):
    run_dir = make_run(tmp_path, ids=(1,))
    before = (tmp_path / "answers.jsonl").read_bytes()
    appending_half_then(refusal, monkeypatch)
    with pytest.raises(SpecbenchError, match=f"cannot write {tmp_path / 'answers.jsonl'}: {text}"):
        add_question(run_dir, 2)
    monkeypatch.undo()
    assert (tmp_path / "answers.jsonl").read_bytes() == before  # cut back: no half line for the next append
    assert RunDirectory(tmp_path, True).open(SETTINGS) == {1}


def test_a_half_line_left_by_a_full_disk_is_caught_on_read(tmp_path, monkeypatch, caplog):
    run_dir = make_run(tmp_path, ids=(1,))
    appending_half_then(errno.ENOSPC, monkeypatch, truncate_fails=True)
    with pytest.raises(SpecbenchError, match="the disk is full"):
        add_question(run_dir, 2)
    monkeypatch.undo()
    with caplog.at_level(logging.WARNING):
        reopened = RunDirectory(tmp_path, True)
        assert reopened.open(SETTINGS) == {1}
    assert "the last line is incomplete (line 2" in file_warnings(caplog, tmp_path / "answers.jsonl")[0]
    add_question(reopened, 2)
    assert [json.loads(line)["question_id"] for line in lines_of(tmp_path / "answers.jsonl")] == [1, 2]


def test_appending_writes_a_whole_line_in_one_call(tmp_path, monkeypatch):
    calls = []
    real_write = os.write
    monkeypatch.setattr(os, "write", lambda handle, data: (calls.append(data), real_write(handle, data))[1])
    append_line(tmp_path / "answers.jsonl", {"question_id": 1, "text": "déjà"})
    assert calls == [(json.dumps({"question_id": 1, "text": "déjà"}, ensure_ascii=False) + "\n").encode()]


def test_a_run_directory_that_cannot_be_created_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setattr(Path, "mkdir", lambda self, *a, **k: (_ for _ in ()).throw(OSError(errno.EROFS, "ro")))
    with pytest.raises(SpecbenchError, match=f"cannot create {tmp_path / 'run'}: the filesystem is read-only"):
        RunDirectory(tmp_path / "run", True).open(SETTINGS)


def test_the_drafter_state_lists_its_questions_by_key_and_reads_older_files(tmp_path):
    run_dir = make_run(tmp_path, ids=(1, "q2", BIG))
    run_dir.save_drafter_state({"matrix": np.ones(2)})
    with np.load(tmp_path / "drafter_state.npz") as saved:
        assert saved["_questions"].tolist() == ["1", '"q2"', str(BIG)]
    arrays, seen = run_dir.drafter_state()
    assert seen == {"1", "q2", str(BIG)} and arrays["matrix"].tolist() == [1, 1]
    np.savez(tmp_path / "old.npz", matrix=np.ones(2), _questions=np.array(["1", "q2"]))  # as written before
    (tmp_path / "old.npz").replace(tmp_path / "drafter_state.npz")
    assert run_dir.drafter_state()[1] == {"1", "q2"}
    np.savez(tmp_path / "foreign.npz", matrix=np.ones(2))
    (tmp_path / "foreign.npz").replace(tmp_path / "drafter_state.npz")
    with pytest.raises(SpecbenchError, match="does not list the questions it has seen"):
        run_dir.drafter_state()


@pytest.mark.slow
def test_a_resumed_run_names_a_bad_line_in_one_warning_not_two(tmp_path):
    # Resuming reads the files twice (the finished-run check, then the opening): one bad line, one warning.
    from test_cli import TINY, specbench

    run = tmp_path / "run"
    common = [*TINY, "drafter=pld", "task.tasks=[qa]", f"hydra.run.dir={run}"]
    assert specbench(*common, "task.limit_per_task=1").returncode == 0
    answers = run / "answers.jsonl"
    answers.write_text(answers.read_text() * 2)  # the finished line, repeated
    result = specbench(*common, "task.limit_per_task=2")
    assert result.returncode == 0, result.stderr
    shown = result.stdout + result.stderr
    assert shown.count("left out, not counted") == 1, shown
