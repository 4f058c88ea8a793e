"""An ``engine=vllm`` run end to end through the runner, vLLM replaced by a scripted engine (the default environment
has no vLLM): the paired questions recorded with steps that carry no times, the run under load in load.jsonl (a
line per level and role, compared with AR by digest), and its faults: an interrupted or failed level leaves the
finished lines and the same command measures only what is missing, a request that timed out is a skipped
question, and the engine is closed however the run ends."""

from __future__ import annotations

import json
import logging
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

import specbench.config as config
import specbench.runner as runner
from specbench.config import compose
from specbench.engines.base import BASELINE, METHOD, Engine, SkipQuestion
from specbench.engines.vllm import VllmEngine, steps_from_counts
from specbench.engines.vllm_requests import top_arrays
from specbench.errors import SpecbenchError
from specbench.results.load import LOAD_FILE, ServedRequest, read_load_levels, token_digest
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
    name = "vllm"
    check_config = VllmEngine.check_config  # the configuration is checked as engine=vllm's

    @classmethod
    def load(cls, engine, model_node, drafter_node, settings, processes):
        raise AssertionError("the runner loads the engine run_with gives it")

    def __init__(self, cfg, fail_at=None, timeout=None, fail_answer=None):
        self.paired = bool(cfg.engine.paired)
        self.load_levels = list(cfg.engine.concurrency)
        self.fail_at, self.timeout, self.fail_answer = fail_at, timeout, fail_answer
        self.answered, self.served, self.warmed, self.closed = [], [], [], 0
        self.warm_ups, self.warm = [], set()  # each level's warm-up: (concurrency, role, questions, max tokens)

    def run_settings(self):
        return {"model_source": "scripted", "dtype": "float32", "device": "cpu", "threads": None,
                "placement": "vllm:tp=1", "devices": "cpu", "linear_backend_used": "vllm"}

    def environment(self):
        return {"engine": "vllm (scripted)"}

    def sources(self):
        return {}

    def prompt_tokens(self, prompt):
        return len(tokens_of(prompt.question_id))

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

    def serve(self, prompts, role, concurrency, max_new_tokens=None):
        if max_new_tokens is not None:  # a level's warm-up: untimed, its requests thrown away
            self.warm_ups.append((concurrency, role, [prompt.question_id for prompt in prompts], max_new_tokens))
            self.warm.add((concurrency, role))
            return [], 1.0
        self.served.append((concurrency, role))
        if self.fail_at is not None and self.fail_at[:2] == (concurrency, role):
            raise self.fail_at[2]
        # an engine not warmed at this concurrency (vLLM: compiling for the batch's shapes) takes 0.9 s to a
        # first token, a warmed one 0.1 s per request ahead of it
        cold = (concurrency, role) not in self.warm
        served = []
        for index, prompt in enumerate(prompts):
            # the method: two verify steps of 3 draft tokens, 2 and 1 accepted (accept lengths 3 and 2)
            depths, lengths = ([3, 3], [3, 2]) if role == METHOD else (None, None)
            first = 0.9 if cold else 0.1 * (index + 1)
            served.append(ServedRequest(prompt.question_id, first, first + 0.5, tokens_of(prompt.question_id),
                                        depths, lengths))
        return served, 2.0 if role == BASELINE else 1.0

    def save_state(self, run_dir):
        pass

    def close(self):
        self.closed += 1


def run_with(monkeypatch, tmp_path, overrides=(), **script):
    """One session of the run in ``tmp_path``: its configuration, its scripted engine, what it returned."""
    cfg = compose([*VLLM, *overrides])
    engine = ScriptedEngine(cfg, **script)
    loads = type("Loads", (), {"load": staticmethod(lambda *args: engine), "starts_processes": False})
    # chosen as engine=vllm is (its settings checked by VllmEngine), loaded as the scripted engine
    monkeypatch.setattr(runner, "choose_engine", lambda cfg_: (loads, config.choose_engine(cfg_)[1]))
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
            assert line["per_position_acceptance_rate"] == [1.0, 0.5, 0.0]  # of all 6 drafts
            assert "acceptance_by_position" not in line  # summary.json's other definition has that name
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

    loads = []
    monkeypatch.setattr(runner, "choose_engine", lambda cfg_: (type("Loads", (), {
        "load": staticmethod(lambda *args: loads.append(args)), "starts_processes": False}),
        config.choose_engine(cfg_)[1]))
    run_benchmark(compose([*VLLM, "engine.concurrency=[2]", "engine.paired=false"]), str(tmp_path))
    assert loads == []  # finished: every level is there, and no paired question was asked for; nothing is loaded


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


# --- every level measured as the first was: warmed at its concurrency, over the file's questions ----------------

def test_a_level_measured_in_a_later_session_is_warmed_as_the_first_was(monkeypatch, tmp_path):
    """A session that only extends the sweep (every paired question done) starts engines that nothing warmed: each
    level and role is preceded by the same untimed warm-up at its own concurrency (run.warmup_runs rounds of its
    first questions, run.warmup_max_new_tokens each), so the later level's first tokens come as the first's did
    (the scripted engine takes 0.9 s to a first token when not warmed at that concurrency, 0.1 s per request
    ahead of it warmed) and each line says how it was warmed."""
    engine, run = run_with(monkeypatch, tmp_path, ["engine.concurrency=[2]"])
    run()
    assert engine.warm_ups == [(2, BASELINE, [1013, 1014], 32), (2, METHOD, [1013, 1014], 32)]
    again, run = run_with(monkeypatch, tmp_path, ["engine.concurrency=[2,3]"])
    run()
    assert again.answered == [] and again.served == [(3, BASELINE), (3, METHOD)]
    assert again.warm_ups == [(3, BASELINE, list(QUESTIONS), 32), (3, METHOD, list(QUESTIONS), 32)]
    levels = read_load_levels(tmp_path)
    assert [line["ttft_s"]["mean"] for line in levels] == pytest.approx([0.2] * 4)  # cold: 0.9
    assert [line["warm_up"] for line in levels] == [{"runs": 1, "max_new_tokens": 32}] * 4


def test_the_level_warm_up_follows_the_runs_warm_up_settings(monkeypatch, tmp_path):
    engine, run = run_with(monkeypatch, tmp_path, ["engine.concurrency=[1]", "run.warmup_runs=2",
                                                   "run.warmup_max_new_tokens=8"])
    run()
    assert engine.warm_ups == [(1, BASELINE, [1013], 8)] * 2 + [(1, METHOD, [1013], 8)] * 2
    assert read_load_levels(tmp_path)[0]["warm_up"] == {"runs": 2, "max_new_tokens": 8}


def test_levels_measured_after_another_warm_up_are_refused_before_anything_loads(monkeypatch, tmp_path):
    """A load.jsonl written before levels were warmed (no warm_up on its lines) holds levels that do not compare
    with warmed ones: extending it is one line naming the file, before the engine loads."""
    _, run = run_with(monkeypatch, tmp_path, ["engine.concurrency=[1]"])
    run()
    lines = [json.loads(line) for line in lines_of(tmp_path)]
    (tmp_path / LOAD_FILE).write_text("".join(json.dumps({key: value for key, value in line.items()
                                                          if key != "warm_up"}) + "\n" for line in lines))
    refused, run = run_with(monkeypatch, tmp_path, ["engine.concurrency=[1,2]"])
    with pytest.raises(SpecbenchError) as error:
        run()
    line = one_line(error)
    assert line.startswith(f"{tmp_path / LOAD_FILE} holds load levels measured after no recorded warm-up")
    assert "{\"max_new_tokens\":32,\"runs\":1}" in line and "another run directory" in line
    assert refused.closed == 0 and refused.served == [] and len(lines_of(tmp_path)) == 2


def test_a_load_run_resumed_over_other_questions_is_refused_in_one_line(monkeypatch, tmp_path):
    """task.tasks and task.limit_per_task may change between sessions (a paired run extended to more questions),
    but a load.jsonl holds one question set: more levels over other questions are refused before anything loads."""
    _, run = run_with(monkeypatch, tmp_path, ["engine.concurrency=[1]"])
    run()
    refused, run = run_with(monkeypatch, tmp_path, ["engine.concurrency=[1,2]", "task.limit_per_task=4"])
    with pytest.raises(SpecbenchError) as error:
        run()
    line = one_line(error)
    assert line.startswith(f"{tmp_path / LOAD_FILE} holds load levels over 3 questions; this run would submit 4 "
                           "(1 not in it (1016))")
    assert "task.limit_per_task" in line and "hydra.run.dir" in line
    assert refused.closed == 0 and len(lines_of(tmp_path)) == 2
    same, run = run_with(monkeypatch, tmp_path, ["engine.concurrency=[1,2]"])  # the same questions: extended
    run()
    assert same.served == [(2, BASELINE), (2, METHOD)]


def test_the_reader_leaves_out_a_level_over_other_questions_or_warmed_otherwise_and_names_it(tmp_path):
    from specbench.results.load import read_load_lines, summarise_level

    def level(concurrency, questions, warm_up):
        served = [ServedRequest(question, 0.1, 0.3, tokens_of(question)) for question in questions]
        return json.dumps(summarise_level(concurrency, BASELINE, "ar@vllm", served, 1.0, warm_up=warm_up).to_line())

    warm = {"runs": 1, "max_new_tokens": 32}
    (tmp_path / LOAD_FILE).write_text("\n".join([level(1, QUESTIONS, warm), level(2, QUESTIONS[:2], warm),
                                                 level(4, QUESTIONS[::-1], warm), level(8, QUESTIONS, None),
                                                 level(16, QUESTIONS, {"runs": 0, "max_new_tokens": 32})]) + "\n")
    lines = read_load_lines(tmp_path)
    assert [line["concurrency"] for line in lines.levels] == [1, 4]  # the order of submission aside, one set
    assert lines.left_out == [
        (2, "is over 2 questions other than line 1's 3: a file holds one question set"),
        (4, "was measured after another warm-up (null) than line 1 ({\"max_new_tokens\":32,\"runs\":1})"),
        (5, "was measured after another warm-up ({\"max_new_tokens\":32,\"runs\":0}) than line 1 "
            "({\"max_new_tokens\":32,\"runs\":1})")]


# --- damaged lines: one reader for resuming and analysis --------------------------------------------------------

def damaged(line: str, how: str) -> str:
    """A whole line of load.jsonl (its newline kept) damaged ``how``."""
    record = json.loads(line)
    if how == "no role":
        del record["role"]
    elif how == "concurrency not a number":
        record["concurrency"] = "four"
    elif how == "a list":
        record = [record["concurrency"], record["role"]]
    elif how == "garbled":
        return line[:25] + "\n"
    elif how == "negative throughput":
        record["output_tokens_per_s"] = -9.0
    elif how == "infinite throughput":
        record["output_tokens_per_s"] = float("inf")  # written as Infinity, which Python's json reads back
    elif how == "zero duration":
        record["duration_s"] = 0.0
    elif how == "no requests":
        record["requests"] = 0
    elif how == "negative time to first token":
        record["ttft_s"]["p50"] = -0.1
    elif how == "a throughput that is not its tokens over its time":
        record["output_tokens_per_s"] *= 2
    return json.dumps(record) + "\n"


DAMAGES = {  # how -> what the warning says of the line
    "no role": "has no role (baseline or method)",
    "concurrency not a number": 'has concurrency "four", not a whole number of requests of 1 or more',
    "a list": "is an array, not a level (an object)",
    "garbled": "is not valid JSON",
    "negative throughput": "has output_tokens_per_s -9.0, not a finite number of 0 or more",
    "infinite throughput": "has output_tokens_per_s Infinity, not a finite number of 0 or more",
    "zero duration": "has duration_s 0.0, not a positive number of seconds",
    "no requests": "has requests 0, not a whole number of 1 or more",
    "negative time to first token": "has ttft_s",
    "a throughput that is not its tokens over its time": "has output_tokens_per_s 36.0, which is not its count over "
                                                         "duration_s (18 / 1.0)",
}


@pytest.mark.parametrize("how", DAMAGES)
def test_a_damaged_line_is_left_out_named_and_its_level_measured_again_on_resume(monkeypatch, tmp_path, caplog, how):
    """Line 4 (the method at 4 in flight) damaged: the resume is no traceback before anything loads; the line is
    named (file, line, why) in one warning and left out, and that level alone is measured again."""
    _, run = run_with(monkeypatch, tmp_path, ["engine.concurrency=[1,4]"])
    run()
    lines = lines_of(tmp_path)
    (tmp_path / LOAD_FILE).write_text("".join(lines[:3]) + damaged(lines[3], how))
    again, run = run_with(monkeypatch, tmp_path, ["engine.concurrency=[1,4]"])
    with caplog.at_level(logging.WARNING):
        run()
    assert again.served == [(4, METHOD)]
    warnings = {record.getMessage() for record in caplog.records if LOAD_FILE in record.getMessage()}
    assert len(warnings) == 1
    [warning] = warnings
    assert warning.startswith(f"{tmp_path / LOAD_FILE}: line 4 {DAMAGES[how]}") and "1 line(s) left out" in warning
    levels = read_load_levels(tmp_path)
    assert [(line["concurrency"], line["role"]) for line in levels] == [
        (1, BASELINE), (1, METHOD), (4, BASELINE), (4, METHOD)]
    assert levels[-1]["output_tokens_per_s"] == 18.0 and levels[-1]["identical_to_baseline"] == 3


@pytest.mark.parametrize("how", DAMAGES)
def test_analysis_reads_a_damaged_line_through_the_same_reader(monkeypatch, tmp_path, how):
    """Analysis leaves the same line out with the same words (the one reader), and shows no figure of it: the
    level's method columns and speedup are unknown, not a number made of the damaged line."""
    from analysis.load import load_table
    from analysis.runs import load_runs

    _, run = run_with(monkeypatch, tmp_path / "run", ["engine.concurrency=[1,4]"])
    run()
    lines = lines_of(tmp_path / "run")
    (tmp_path / "run" / LOAD_FILE).write_text("".join(lines[:3]) + damaged(lines[3], how))
    loaded = load_runs([tmp_path], with_steps=False)
    [problem] = [problem for problem in loaded.problems if LOAD_FILE in problem]
    assert f"{LOAD_FILE}: line 4 {DAMAGES[how]}" in problem
    assert sorted(zip(loaded.load.concurrency, loaded.load.role)) == [(1, BASELINE), (1, METHOD), (4, BASELINE)]
    table = load_table(loaded.load)
    assert table.speedup.tolist()[0] == 2.0 and math.isnan(table.speedup.tolist()[1])
    assert table.ar_tokens_per_s.tolist() == [9.0, 9.0] and table.tokens_per_s.tolist()[0] == 18.0


# --- the run owns its engine's processes -------------------------------------------------------------------------

@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="needs Linux's /proc")
def test_the_runner_ends_the_processes_an_engine_leaves_and_those_a_killed_session_left(monkeypatch, tmp_path):
    """An engine that starts processes (starts_processes, as vLLM's) and leaves one running after close: the run
    ends it before it returns. A process a killed earlier session of the directory left (its token in the record,
    that session's process gone) is ended before the new session starts."""
    from specbench.run.owned_processes import PROCESSES_FILE, TOKEN_VARIABLE, process_info

    leftover = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"],
                                env={**os.environ, TOKEN_VARIABLE: "killed-session"})
    (tmp_path / PROCESSES_FILE).write_text(json.dumps({"token": "killed-session", "main": {"pid": 1, "start": -1}}))
    engine, run = run_with(monkeypatch, tmp_path)
    children = []

    def load(*args):
        children.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"]))
        assert leftover.poll() is not None  # ended before this session's engine loads
        return engine

    monkeypatch.setattr(runner, "choose_engine", lambda cfg_: (
        type("Starts", (), {"load": staticmethod(load), "starts_processes": True}), config.choose_engine(cfg_)[1]))
    try:
        run()
        assert engine.closed == 1 and children[0].wait(timeout=1) == -15  # SIGTERM, before run() returned
        assert not (tmp_path / PROCESSES_FILE).exists() and process_info(children[0].pid) is None
    finally:
        for process in (leftover, *children):
            if process.poll() is None:
                process.kill()
                process.wait()
