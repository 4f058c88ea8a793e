"""The runner talks to an engine only through ``specbench.engines.base.Engine``: an engine that runs no model,
whose steps carry no timings (as vLLM's will not), goes through the runner's records, lossless check, skip
bookkeeping and resume like the specbench loop."""

from __future__ import annotations

import numpy as np

from specbench.distributed import Processes
from specbench.engines.base import BASELINE, METHOD, Engine, EngineSettings, SkipQuestion
from specbench.measure.machine import TimingCheck
from specbench.questions import Prompt
from specbench.results.readers import read_answers, read_jsonl_records
from specbench.results.run_directory import RunDirectory
from specbench.results.schema import Answer, SCHEMA_VERSION, StepRecord
from specbench.runner import measure
from specbench.settings import RunSettings

TOO_LONG, OUT_OF_MEMORY, DIFFERS = 3, 4, 5


class FixedAnswers(Engine):
    """Every answer is the tokens 7 8 9 in two steps without timings (question DIFFERS: the method's last token
    is 6); question TOO_LONG never fits, question OUT_OF_MEMORY fails in its baseline."""

    name = "fake"
    model_name, drafter_name, dtype, greedy = "fake", "fixed", "float32", True
    decoded_by = {METHOD: "fixed", BASELINE: "ar"}
    checked: list = []  # what check_config was given, in order

    def __init__(self):
        self.answered, self.warmed_up, self.saved = [], [], 0

    @classmethod
    def check_config(cls, engine, drafter, run):
        cls.checked.append((engine, drafter["name"], run["max_new_tokens"]))
        return EngineSettings(engine["name"])

    @classmethod
    def load(cls, engine, model_node, drafter_node, settings, processes):
        return cls()

    def run_settings(self):
        return {"model_source": "fake"}

    def environment(self):
        return {"device": "cpu: none"}

    def sources(self):
        return {}

    def prompt_tokens(self, prompt):
        return len(prompt.turns[0].split())

    def check_fits(self, prompt):
        if prompt.question_id == TOO_LONG:
            raise SkipQuestion(f"question {TOO_LONG} is too long here")

    def warm_up(self, pending, run_dir, finished, skip):
        self.warmed_up.append(pending[0].question_id)
        return pending

    def answer(self, prompt, role, on_step=None):
        self.answered.append((prompt.question_id, role))
        if prompt.question_id == OUT_OF_MEMORY and role == BASELINE:
            raise SkipQuestion("out of memory here", cause="out_of_memory", details={"memory": None})
        tokens = [7, 8, 6] if prompt.question_id == DIFFERS and role == METHOD else [7, 8, 9]
        steps = [StepRecord(step=0, draft_tokens=0, verify_tokens=4, accepted_tokens=1, draft_s=None, verify_s=None,
                            overhead_s=None, context_len=4),
                 StepRecord(step=1, draft_tokens=3, verify_tokens=4, accepted_tokens=2, draft_s=None, verify_s=None,
                            overhead_s=None, context_len=5, draft_depth=3, candidate_tokens=3)]
        top_ids = np.array([[token, 0] for token in tokens])
        top_logits = np.array([[5.0, 1.0]] * len(tokens))
        return Answer(texts=[" ".join(map(str, tokens))], token_ids=[tokens], steps=[steps],
                      wall_times=[0.5 if role == METHOD else 1.0], top=[(top_ids, top_logits)])

    def save_state(self, run_dir):
        self.saved += 1


def questions(*ids):
    return [Prompt(question_id=n, category="qa", task="qa", turns=(f"question {n}",)) for n in ids]


def run_session(path, engine, prompts):
    run_dir = RunDirectory(path, with_baseline=True)
    finished = run_dir.open({"schema_version": SCHEMA_VERSION, "model": "fake"})
    timing = TimingCheck(threads=1, usable_cores=1, other_load_at_start=0.0)
    return measure(engine, RunSettings(), run_dir, finished, prompts, timing, Processes())


def test_an_engine_without_step_timings_is_recorded_checked_and_resumed(tmp_path):
    engine = FixedAnswers()
    summary = run_session(tmp_path, engine, questions(1, 2, TOO_LONG, OUT_OF_MEMORY, DIFFERS))

    assert engine.warmed_up == [1]
    answers = {record["question_id"]: record for record in read_answers(tmp_path)}
    assert sorted(answers) == [1, 2, DIFFERS]
    assert answers[1]["model_id"] == "fake-fixed" and answers[1]["choices"][0]["turns"] == ["7 8 9"]
    assert answers[1]["choices"][0]["accept_lengths"] == [1, 2]
    assert answers[1]["specbench"]["identical_to_baseline"] is True
    assert answers[DIFFERS]["specbench"]["identical_to_baseline"] is False
    assert answers[DIFFERS]["specbench"]["mismatch"]["kind"] == "violation"
    baseline = read_jsonl_records(tmp_path / "baseline_answers.jsonl")
    assert sorted(record["question_id"] for record in baseline) == [1, 2, DIFFERS]
    assert {record["model_id"] for record in baseline} == {"fake-ar"}
    skipped = {record["question_id"]: record for record in read_jsonl_records(tmp_path / "skipped.jsonl")}
    assert skipped[TOO_LONG]["cause"] == "too_long" and skipped[TOO_LONG]["reason"] == "question 3 is too long here"
    assert skipped[OUT_OF_MEMORY]["cause"] == "out_of_memory" and skipped[OUT_OF_MEMORY]["memory"] is None
    assert engine.saved == 3  # once per recorded question

    overall = summary["tasks"]["overall"]
    assert overall["questions"] == 3 and overall["identical_to_baseline"] == 2 and overall["violations"] == 1
    assert overall["speedup"] == 2.0  # the wall times: 1.0 s for the baseline, 0.5 s for the method
    assert summary["model"] == "fake" and summary["method"] == "fixed"
    assert summary["environment"] == {"device": "cpu: none"}
    assert summary["skipped_by_cause"] == {"too_long": 1, "out_of_memory": 1}
    # no step times, no stall verdict: "not measured", never "no stalls" (tests/test_stalls.py)
    assert answers[1]["specbench"]["stalls"] == {"stalled": None, "why": "no per-step times"}
    assert summary["timing"]["stalls"] == {"stalled_questions": [], "not_measured": 3, "not_checked": 0}

    resumed = FixedAnswers()
    again = run_session(tmp_path, resumed, questions(1, 2, TOO_LONG, OUT_OF_MEMORY, DIFFERS, 6))
    assert resumed.answered == [(6, METHOD), (6, BASELINE)] and resumed.warmed_up == [6]
    assert again["tasks"]["overall"]["questions"] == 4


def test_the_runner_alternates_which_role_decodes_first(tmp_path):
    engine = FixedAnswers()
    run_session(tmp_path, engine, questions(1, 2, 6))
    assert engine.answered == [(1, METHOD), (1, BASELINE), (2, BASELINE), (2, METHOD), (6, METHOD), (6, BASELINE)]


def test_a_question_the_warm_up_gives_up_on_is_recorded_and_not_measured(tmp_path):
    class FailingWarmUp(FixedAnswers):
        def warm_up(self, pending, run_dir, finished, skip):
            skip(pending[0], SkipQuestion("no memory in the warm-up", cause="out_of_memory", details={"phase": "warm-up"}))
            return pending[1:]

    engine = FailingWarmUp()
    summary = run_session(tmp_path, engine, questions(1, 2))
    [skipped] = read_jsonl_records(tmp_path / "skipped.jsonl")
    assert skipped["question_id"] == 1 and skipped["phase"] == "warm-up"
    assert {question for question, _ in engine.answered} == {2}
    assert summary["tasks"]["overall"]["questions"] == 1


def test_a_third_engine_is_chosen_by_its_config_groups_target_and_checks_its_own_settings(monkeypatch):
    """An engine moves in as a class that a config of the engine group names (``_target_``): the configuration
    check asks it, and only it, about its settings, the drafter and the run, before anything loads."""
    from specbench.config import check_config, choose_engine, compose

    monkeypatch.setattr(FixedAnswers, "checked", [])
    cfg = compose(["model=tiny-random", "drafter=hd", "engine._target_=test_engine_seam.FixedAnswers",
                   "engine.name=fake", "run.max_new_tokens=7"])
    check_config(cfg)
    engine, settings = choose_engine(cfg)
    assert engine is FixedAnswers and settings == EngineSettings("fake")
    assert FixedAnswers.checked == [({"name": "fake"}, "hd", 7)] * 2  # the group without its _target_
    assert settings.identity() == {"name": "fake"} and settings.load_levels == []  # recorded in run.json
