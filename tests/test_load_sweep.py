"""An ``engine=vllm`` run end to end through the runner, vLLM replaced by a scripted engine (the default environment
has no vLLM): the paired questions recorded with steps that carry no times, the run under load in load.jsonl (a
line per level and role, compared with AR by digest), and its faults: an interrupted or failed level leaves the
finished lines and the same command measures only what is missing, a request that timed out is a skipped
question, and the engine is closed however the run ends."""

from __future__ import annotations

import json

import pytest

import specbench.runner as runner
from specbench.config import compose
from specbench.engines.base import BASELINE, METHOD, Engine, SkipQuestion
from specbench.engines.vllm import steps_from_counts
from specbench.results.load import token_digest
from specbench.engines.vllm_requests import Completion, top_arrays
from specbench.errors import SpecbenchError
from specbench.results.load import LOAD_FILE, read_load_levels
from specbench.results.readers import read_answers, read_jsonl_records
from specbench.runner import run_benchmark

from conftest import one_line

QUESTIONS = (1013, 1014, 1015)  # task.tasks=[qa], task.limit_per_task=3
VLLM = ["model=tiny-random", "engine=vllm", "drafter=pld", "task.tasks=[qa]", "task.limit_per_task=3",
        "run.max_new_tokens=16"]


class Logprob:
    def __init__(self, logprob, rank):
        self.logprob, self.rank = logprob, rank


def tokens_of(question_id: int) -> list[int]:
    return [question_id % 100, 5, 6, 7, 8, 9]


class ScriptedEngine(Engine):
    """vLLM's part of a run, scripted: every question answered with ``tokens_of`` by both roles, in two verify
    steps of vLLM's counts; under load, every question's tokens with made-up timings. ``fail_at``: (level, role,
    exception) raised by that ``serve``; ``timeout``: a question whose method request times out."""

    model_name, drafter_name, dtype, greedy = "tiny-random", "pld", "float32", True
    decoded_by = {METHOD: "pld@vllm", BASELINE: "ar@vllm"}
    method_suffix = "@vllm"

    def __init__(self, cfg, fail_at=None, timeout=None, fail_answer=None):
        self.paired = bool(cfg.engine.paired)
        self.load_levels = list(cfg.engine.concurrency)
        self.fail_at, self.timeout, self.fail_answer = fail_at, timeout, fail_answer
        self.answered, self.served, self.warmed, self.closed = [], [], [], 0

    def run_settings(self):
        return {"model_source": "scripted", "dtype": "float32", "device": "cpu", "threads": None,
                "placement": "vllm:tp=1", "devices": "cpu", "linear_backend_used": "vllm"}

    def environment(self):
        return {"engine": "vllm (scripted)"}

    def sources(self):
        return {}

    def check_fits(self, prompt):
        pass

    def warm_up(self, pending, run_dir, finished, skip):
        self.warmed.append(pending[0].question_id)
        return pending

    def answer(self, prompt, role, on_step=None):
        from specbench.results.schema import Answer

        self.answered.append((prompt.question_id, role))
        if self.fail_answer is not None:
            raise self.fail_answer
        if prompt.question_id == self.timeout and role == METHOD:
            raise SkipQuestion(f"question {prompt.question_id} (pld@vllm), turn 1: a request to vLLM had not "
                               "finished after 600 s", cause="timeout", details={"timeout_s": 600})
        tokens = tokens_of(prompt.question_id)
        spec = ({"num_spec_steps": 2, "num_draft_tokens": 6, "num_accepted_draft_tokens": 4, "num_spec_tokens": 3,
                 "per_step_drafted": [3, 3], "per_step_accepted": [3, 1]} if role == METHOD else None)
        top = top_arrays([{token: Logprob(-0.1, 1), 0: Logprob(-3.0, 2)} for token in tokens], 2)
        return Answer(texts=[" ".join(map(str, tokens))], token_ids=[tokens],
                      steps=[steps_from_counts(10, len(tokens), spec)],
                      wall_times=[0.5 if role == METHOD else 1.0], top=[top])

    def serve(self, prompts, role, concurrency):
        self.served.append((concurrency, role))
        if self.fail_at is not None and self.fail_at[:2] == (concurrency, role):
            raise self.fail_at[2]
        completions = []
        for index, prompt in enumerate(prompts):
            spec = ({"num_spec_steps": 2, "num_draft_tokens": 6, "num_accepted_draft_tokens": 3, "num_spec_tokens": 3,
                     "per_step_drafted": [3, 3], "per_step_accepted": [2, 1]} if role == METHOD else None)
            completions.append(Completion(prompt.question_id, tokens_of(prompt.question_id), 0.1 * (index + 1),
                                          0.1 * (index + 1) + 0.5, spec, None, "length"))
        return completions, 2.0 if role == BASELINE else 1.0

    def save_state(self, run_dir):
        pass

    def close(self):
        self.closed += 1


def run_with(monkeypatch, tmp_path, overrides=(), **script):
    """One session of the run in ``tmp_path``: its configuration, its scripted engine, what it returned."""
    cfg = compose([*VLLM, *overrides])
    engine = ScriptedEngine(cfg, **script)
    monkeypatch.setattr(runner, "load_engine", lambda *args: engine)
    return engine, lambda: run_benchmark(cfg, str(tmp_path))


def lines_of(tmp_path) -> list[str]:
    return (tmp_path / LOAD_FILE).read_text(encoding="utf-8").splitlines(keepends=True)


def test_a_paired_run_records_answers_summary_and_untimed_steps(monkeypatch, tmp_path):
    import pandas as pd

    engine, run = run_with(monkeypatch, tmp_path)
    summary = run()

    assert engine.closed == 1 and engine.warmed == [QUESTIONS[0]] and engine.served == []
    answers = {record["question_id"]: record for record in read_answers(tmp_path)}
    assert sorted(answers) == list(QUESTIONS)
    record = answers[QUESTIONS[0]]
    assert record["model_id"] == "tiny-random-pld@vllm"
    assert record["specbench"]["identical_to_baseline"] is True
    assert record["choices"][0]["accept_lengths"] == [1, 4, 1]  # the prefill, then 3 + 1 and the cut 1 + 1
    steps = pd.read_parquet(tmp_path / "steps.parquet")
    assert len(steps) == 3 * len(QUESTIONS)
    assert steps["draft_s"].isna().all() and steps["verify_s"].isna().all() and steps["overhead_s"].isna().all()
    assert steps["accepted_tokens"].sum() == 6 * len(QUESTIONS)
    assert summary["method"] == "pld@vllm"
    overall = summary["tasks"]["overall"]
    assert overall["questions"] == 3 and overall["identical_to_baseline"] == 3 and overall["speedup"] == 2.0
    assert not (tmp_path / LOAD_FILE).exists()
    settings = json.loads((tmp_path / "run.json").read_text())
    assert settings["engine"]["name"] == "vllm" and "concurrency" not in settings["engine"]


def test_a_run_under_load_records_a_line_per_level_and_role(monkeypatch, tmp_path):
    engine, run = run_with(monkeypatch, tmp_path, ["engine.concurrency=[1,4]"])
    run()

    assert engine.served == [(1, BASELINE), (1, METHOD), (4, BASELINE), (4, METHOD)]
    levels = read_load_levels(tmp_path)
    assert [(line["concurrency"], line["role"], line["method"]) for line in levels] == [
        (1, BASELINE, "ar@vllm"), (1, METHOD, "pld@vllm"), (4, BASELINE, "ar@vllm"), (4, METHOD, "pld@vllm")]
    for line in levels:
        assert line["requests"] == 3 and line["output_tokens"] == 18 and line["question_ids"] == list(QUESTIONS)
        assert line["token_digests"] == {str(q): token_digest(tokens_of(q)) for q in QUESTIONS}
        if line["role"] == METHOD:
            assert line["identical_to_baseline"] == 3
            assert line["drafts"] == 6 and line["accepted_tokens"] == 9 and line["mean_acceptance_length"] == 2.5
            assert line["acceptance_by_position"] == [1.0, 0.5, 0.0]
            assert line["output_tokens_per_s"] == 18.0
        else:
            assert line["identical_to_baseline"] is None and line["drafts"] is None
            assert line["output_tokens_per_s"] == 9.0
    assert engine.closed == 1


def test_an_interrupted_sweep_keeps_its_finished_levels_and_resumes_at_the_missing_one(monkeypatch, tmp_path):
    engine, run = run_with(monkeypatch, tmp_path, ["engine.concurrency=[1,4]"],
                           fail_at=(4, METHOD, KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):
        run()
    assert engine.closed == 1
    lines = lines_of(tmp_path)
    assert len(lines) == 3 and all(line.endswith("\n") for line in lines)
    assert [(json.loads(line)["concurrency"], json.loads(line)["role"]) for line in lines] == [
        (1, BASELINE), (1, METHOD), (4, BASELINE)]

    again, run = run_with(monkeypatch, tmp_path, ["engine.concurrency=[1,4]"])
    run()
    assert again.answered == [] and again.served == [(4, METHOD)]  # the paired questions were all done
    levels = read_load_levels(tmp_path)
    assert [(line["concurrency"], line["role"]) for line in levels] == [
        (1, BASELINE), (1, METHOD), (4, BASELINE), (4, METHOD)]
    assert levels[-1]["identical_to_baseline"] == 3  # compared with the earlier session's baseline line
    assert again.closed == 1


def test_a_level_that_fails_is_one_line_naming_it_and_the_run_resumes(monkeypatch, tmp_path):
    engine, run = run_with(monkeypatch, tmp_path, ["engine.concurrency=[1,4]"],
                           fail_at=(4, BASELINE, SpecbenchError("vLLM's engine process (ar) died while decoding")))
    with pytest.raises(SpecbenchError) as error:
        run()
    line = one_line(error)
    assert "4 requests in flight (ar@vllm)" in line and "died while decoding" in line and "resumes" in line
    assert engine.closed == 1
    assert len(lines_of(tmp_path)) == 2

    again, run = run_with(monkeypatch, tmp_path, ["engine.concurrency=[1,4]"])
    run()
    assert again.served == [(4, BASELINE), (4, METHOD)]
    assert len(read_load_levels(tmp_path)) == 4


def test_more_levels_later_are_measured_in_the_same_run_directory(monkeypatch, tmp_path):
    _, run = run_with(monkeypatch, tmp_path, ["engine.concurrency=[1]"])
    run()
    again, run = run_with(monkeypatch, tmp_path, ["engine.concurrency=[1,2]"])
    run()
    assert again.answered == [] and again.served == [(2, BASELINE), (2, METHOD)]
    assert [(line["concurrency"], line["role"]) for line in read_load_levels(tmp_path)] == [
        (1, BASELINE), (1, METHOD), (2, BASELINE), (2, METHOD)]
    third, run = run_with(monkeypatch, tmp_path, ["engine.concurrency=[2,1]"])
    run()  # every level there: nothing is measured again
    assert third.served == [] and third.answered == []


def test_a_line_cut_by_a_killed_session_is_measured_again_and_not_merged_with_the_next(monkeypatch, tmp_path):
    _, run = run_with(monkeypatch, tmp_path, ["engine.concurrency=[1,4]"])
    run()
    lines = lines_of(tmp_path)
    (tmp_path / LOAD_FILE).write_text("".join(lines[:3]) + lines[3][:40], encoding="utf-8")  # killed mid-write

    again, run = run_with(monkeypatch, tmp_path, ["engine.concurrency=[1,4]"])
    run()
    assert again.served == [(4, METHOD)]
    lines = lines_of(tmp_path)
    assert len(lines) == 4 and [json.loads(line)["role"] for line in lines] == [BASELINE, METHOD, BASELINE, METHOD]


def test_a_run_under_load_only_measures_no_paired_question(monkeypatch, tmp_path):
    engine, run = run_with(monkeypatch, tmp_path, ["engine.concurrency=[2]", "engine.paired=false"])
    run()
    assert engine.answered == [] and engine.served == [(2, BASELINE), (2, METHOD)]
    assert read_answers(tmp_path) == []
    assert len(read_load_levels(tmp_path)) == 2


def test_a_request_that_timed_out_is_a_skipped_question_and_the_run_goes_on(monkeypatch, tmp_path):
    engine, run = run_with(monkeypatch, tmp_path, ["engine.concurrency=[1]"], timeout=QUESTIONS[1])
    summary = run()

    [skipped] = read_jsonl_records(tmp_path / "skipped.jsonl")
    assert skipped["question_id"] == QUESTIONS[1] and skipped["cause"] == "timeout" and skipped["timeout_s"] == 600
    assert sorted(record["question_id"] for record in read_answers(tmp_path)) == [QUESTIONS[0], QUESTIONS[2]]
    assert summary["tasks"]["overall"]["questions"] == 2 and summary["skipped_by_cause"] == {"timeout": 1}
    assert [line["question_ids"] for line in read_load_levels(tmp_path)] == [[QUESTIONS[0], QUESTIONS[2]]] * 2

    again, run = run_with(monkeypatch, tmp_path, ["engine.concurrency=[1]"])
    run()  # resumed: the skipped question stays skipped
    assert again.answered == [] and again.served == []


def test_the_engine_is_closed_when_a_question_fails(monkeypatch, tmp_path):
    engine, run = run_with(monkeypatch, tmp_path, fail_answer=SpecbenchError("vLLM (pld) failed a request: boom"))
    with pytest.raises(SpecbenchError, match="boom"):
        run()
    assert engine.closed == 1 and read_answers(tmp_path) == []


def test_a_vllm_run_directory_refuses_another_context_but_takes_more_levels(monkeypatch, tmp_path):
    _, run = run_with(monkeypatch, tmp_path)
    run()
    refused, run = run_with(monkeypatch, tmp_path, ["engine.max_model_len=2048"])
    with pytest.raises(SpecbenchError) as error:
        run()
    assert "engine.max_model_len: 4096 -> 2048" in one_line(error)
    assert refused.closed == 0  # refused before the engine loads
    more, run = run_with(monkeypatch, tmp_path, ["engine.concurrency=[2]"])
    run()
    assert more.served == [(2, BASELINE), (2, METHOD)] and more.answered == []
