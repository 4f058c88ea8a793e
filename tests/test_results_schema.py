"""specbench.results: the schema the loop imports loads neither pandas nor pyarrow; a step may come without
timings (an engine that runs its own loop reports counts, not phase times) and is stored, read and summarized
without any time made up; the resume comparison and its refusal are written once."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from specbench.errors import SpecbenchError
from specbench.questions import Prompt
from specbench.results.readers import read_run_results
from specbench.results.resumable import resume_refusal, settings_differences
from specbench.results.run_directory import RunDirectory
from specbench.results.schema import STEP_COLUMNS, SUMMARY_KEYS, TIMING_FIELDS, Answer, StepRecord
from specbench.results.steps_file import read_steps_file

ROOT = Path(__file__).resolve().parents[1]
SETTINGS = {"model": "m", "drafter": {"name": "pld"}}
# One turn: the prefill (the first token, no draft), then three steps verifying a 3-token draft and appending
# 3, 2 and 1 tokens (the bonus token included).
ACCEPTED = (1, 3, 2, 1)
DEPTHS = (0, 3, 3, 3)


def run_python(code: str) -> subprocess.CompletedProcess:
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=environment, capture_output=True, text=True,
                          timeout=300)


@pytest.mark.parametrize("module", ["specbench.decoding.loop", "specbench.results.schema"])
def test_the_loop_and_the_schema_import_neither_pandas_nor_pyarrow(module):
    result = run_python(f"import {module}, sys; loaded = [name for name in ('pandas', 'pyarrow') if name in "
                        "sys.modules]; print(loaded); assert not loaded, loaded")
    assert result.returncode == 0, result.stdout + result.stderr


def steps(timed: bool) -> list[StepRecord]:
    seconds = (lambda step: (0.001 * step, 0.01, 0.0005)) if timed else (lambda step: (None, None, None))
    return [StepRecord(step, depth, 1 + depth, accepted, *seconds(step), 10 + step, draft_depth=depth,
                       candidate_tokens=depth)
            for step, (accepted, depth) in enumerate(zip(ACCEPTED, DEPTHS))]


def add_question(run_dir: RunDirectory, question_id, timed: bool) -> None:
    prompt = Prompt(question_id, "qa", "qa", ("q",))
    method = Answer(texts=["x"], token_ids=[list(range(7))], wall_times=[0.5], steps=[steps(timed)])
    baseline = Answer(texts=["x"], token_ids=[list(range(7))], wall_times=[1.0],
                      steps=[[StepRecord(step, 0, 1, 1, 0.01, 0.01, 0.0, 10 + step) for step in range(7)]])
    run_dir.add(method.to_record(prompt, "m", True), baseline.to_record(prompt, "ar", None),
                method.step_rows(question_id))


def make_run(path: Path, timed: bool, ids=(1, 2)) -> RunDirectory:
    run_dir = RunDirectory(path, with_baseline=True)
    run_dir.open(SETTINGS)
    for question_id in ids:
        add_question(run_dir, question_id, timed)
    return run_dir


def test_a_step_without_timings_is_stored_as_null_and_read_back_as_missing(tmp_path):
    make_run(tmp_path, timed=False)
    schema = pq.read_schema(tmp_path / "steps.parquet")
    assert all(schema.field(name).type == pa.float64() for name in TIMING_FIELDS)  # a float column of nulls
    assert all(pq.read_table(tmp_path / "steps.parquet").column(name).null_count == 2 * len(ACCEPTED)
               for name in TIMING_FIELDS)
    frame = read_steps_file(tmp_path / "steps.parquet")
    assert list(frame.columns) == STEP_COLUMNS
    assert all(frame[name].isna().all() for name in TIMING_FIELDS)  # never a 0 made up
    assert frame.accepted_tokens.tolist() == [*ACCEPTED] * 2 and frame.draft_depth.tolist() == [*DEPTHS] * 2


def test_a_run_without_timings_resumes_with_every_step_counted(tmp_path):
    make_run(tmp_path, timed=False)
    reopened = RunDirectory(tmp_path, with_baseline=True)
    assert reopened.open(SETTINGS) == {1, 2}
    add_question(reopened, 3, timed=False)  # the rewritten file (read back as NaN) and a new question's None
    results = read_run_results(tmp_path, with_baseline=True)
    assert results.finished == {1, 2, 3} and results.warnings == []
    assert len(results.steps) == 3 * len(ACCEPTED)
    assert all(results.steps[name].isna().all() for name in TIMING_FIELDS)


def test_a_run_with_timings_keeps_them_exactly(tmp_path):
    make_run(tmp_path, timed=True)
    frame = read_steps_file(tmp_path / "steps.parquet")
    assert all(frame[name].dtype == "float64" for name in TIMING_FIELDS)
    expected = [(0.001 * step, 0.01, 0.0005) for step in range(len(ACCEPTED))] * 2
    assert list(zip(frame.draft_s, frame.verify_s, frame.overhead_s)) == expected


def test_the_summary_of_a_run_without_timings_gives_mat_and_acceptance_but_no_phase_time(tmp_path):
    untimed = make_run(tmp_path / "untimed", timed=False).write_summary({"model": "m"})
    timed = make_run(tmp_path / "timed", timed=True).write_summary({"model": "m"})
    overall = untimed["tasks"]["overall"]
    assert overall["mean_accepted_tokens"] == pytest.approx((1 + 3 + 2 + 1) / 4)  # MAT: prefill and bonus in
    assert overall["acceptance_rate"] == pytest.approx((2 + 1 + 0) / (3 + 3 + 3))  # accepted / drafted
    assert overall["speedup"] == pytest.approx(2.0)
    assert set(overall) == set(SUMMARY_KEYS)
    assert not [key for key in overall if any(phase in key for phase in ("draft_s", "verify", "overhead"))]
    assert untimed["tasks"] == timed["tasks"]  # the answers decide the summary; step times never enter it
    written = json.loads((tmp_path / "untimed" / "summary.json").read_text())
    assert written["tasks"] == untimed["tasks"] and not math.isnan(written["tasks"]["overall"]["tokens_per_s"])


def test_the_resume_refusal_names_each_difference_and_passes_the_record_only_ones():
    earlier = {"model": "m", "run": {"seed": 1, "max_new_tokens": 128}, "environment": {"git_sha": "a"}}
    assert resume_refusal("runs/x", earlier, {**earlier, "environment": {"git_sha": "b"}}) is None
    refusal = resume_refusal("runs/x", earlier, {**earlier, "run": {"seed": 2, "max_new_tokens": 64}})
    assert isinstance(refusal, SpecbenchError)
    assert str(refusal) == ("runs/x holds results of a run with other settings (run.max_new_tokens: 128 -> 64; "
                            "run.seed: 1 -> 2); choose another hydra.run.dir or remove that directory")
    # Over the given keys only: the runner compares what the configuration fixes before loading the model.
    assert resume_refusal("runs/x", earlier, {"model": "m", "run": earlier["run"]}, ["model", "run"]) is None
    assert settings_differences(earlier, {"model": "n"}, ["model"]) == ["model: 'm' -> 'n'"]


def test_both_resume_checks_refuse_with_the_one_message(tmp_path):
    from specbench.run.identity import PLACEMENT_KEYS, check_resumable

    RunDirectory(tmp_path, True).open({"model": "m", "max_new_tokens": 128})
    earlier = json.loads((tmp_path / "run.json").read_text())
    with pytest.raises(SpecbenchError) as by_runner:
        check_resumable(tmp_path, {**earlier, **{key: "recorded" for key in PLACEMENT_KEYS}},
                        {"model": "m", "max_new_tokens": 64})
    with pytest.raises(SpecbenchError) as by_directory:
        RunDirectory(tmp_path, True).open({"model": "m", "max_new_tokens": 64})
    assert str(by_runner.value) == str(by_directory.value) == str(resume_refusal(tmp_path, earlier, {
        "model": "m", "max_new_tokens": 64}))
    sources = [path.read_text() for path in (ROOT / "specbench").rglob("*.py")]
    assert sum(text.count("holds results of a run with other settings") for text in sources) == 1
