"""A first use says what it builds before it builds it, checks the inputs first, installs the answers shipped with
the package when they are the ones a run would generate, and ``python -m specbench.prepare`` builds ahead of time
exactly what the runs look up."""

from __future__ import annotations

import gzip
import logging
import re
from pathlib import Path

import pytest
from hydra.utils import instantiate
from omegaconf import OmegaConf

import specbench.artefacts.target_answers as answers_module
from specbench import prepare
from specbench.artefacts.base import PlannedArtefact, announce_build, build_notice, relative_size
from specbench.storage.cache import settings_key
from specbench.config import CONF_DIR, compose
from specbench.artefacts.model_database import model_db_prompt_set
from specbench.errors import SpecbenchError
from specbench.artefacts.target_answers import (
    SECONDS_PER_ANSWER_SLOT,
    answers_settings,
    planned_answers,
    prompt_texts_digest,
    resolve_prompts,
    shipped_manifest,
    shipped_rows,
    target_answers,
    write_shipped_answers,
)

PROMPTS = ["Name a colour.", "Count to three.", "Say hello."]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    corpus = root / "corpora" / "python-docs"
    corpus.mkdir(parents=True)
    (corpus / "corpus.txt").write_text((Path(__file__).parent / "fixtures" / "corpus.txt").read_text())
    monkeypatch.setenv("SPECBENCH_CACHE", str(root))
    return root


@pytest.fixture
def no_generation(monkeypatch):
    """Any answer generation fails the test: what must not happen before a check, or instead of an install."""
    def generate(*args, **kwargs):
        raise AssertionError("answers were generated")

    monkeypatch.setattr(answers_module, "generate_answers", generate)


def messages(caplog, level=logging.INFO) -> list[str]:
    return [record.getMessage() for record in caplog.records if record.levelno >= level]


# ---- the line said before a build ------------------------------------------------------------------------------


def test_the_line_before_a_build_names_what_how_long_where_and_the_command(caplog):
    planned = PlannedArtefact("the widget database", Path("/cache/widgets-1"), 1080.0, "9 widgets at 2 min",
                              "python -m specbench.prepare --model m --drafters w")
    line = build_notice(planned)
    assert line == ("building the widget database (once): about 18 min on a 2-core CPU (an estimate: 9 widgets at 2 "
                    "min); cached in /cache/widgets-1; to build it ahead of time: python -m specbench.prepare "
                    "--model m --drafters w")
    with caplog.at_level(logging.INFO):
        announce_build(planned)
        announce_build(PlannedArtefact("a quick one", Path("/c/q"), 5.0, "small", "cmd"))
        announce_build(PlannedArtefact("a hub corpus", Path("/c/h"), None, "size unknown", "cmd"))
    levels = [(record.levelno, record.getMessage().split(":")[0]) for record in caplog.records]
    assert levels == [(logging.WARNING, "building the widget database (once)"),
                      (logging.INFO, "building a quick one (once)"), (logging.WARNING, "building a hub corpus (once)")]
    assert "time not known in advance (size unknown)" in caplog.records[-1].getMessage()


def test_the_answers_estimate_scales_the_measured_rate_by_the_work(tiny):
    planned = planned_answers(tiny, PROMPTS, 64, command="python -m specbench.prepare --model tiny-random")
    assert planned.seconds == pytest.approx(3 * 64 * SECONDS_PER_ANSWER_SLOT * relative_size(tiny))
    assert 0 < relative_size(tiny) < 0.01
    assert "3 prompts x 64 tokens" in planned.basis and planned.command.endswith("--model tiny-random")


def test_a_generation_on_first_use_is_announced_first(tiny, cache, caplog):
    with caplog.at_level(logging.INFO):
        target_answers(tiny, PROMPTS, 3, cache_dir=None, purpose="for a test", command="make answers")
    [line] = [message for message in messages(caplog) if message.startswith("building the greedy answers")]
    assert "3 prompts, up to 3 tokens each (for a test) (once)" in line
    assert "an estimate" in line and line.endswith("to build it ahead of time: make answers")


# ---- inputs checked before the build --------------------------------------------------------------------------


@pytest.mark.parametrize("corpus, problem", [("empty", "holds no text"), ("missing", "no such file or directory")])
def test_a_bad_statistics_corpus_fails_before_hd_generates_any_answer(tiny, cache, tmp_path, no_generation, corpus,
                                                                      problem):
    path = tmp_path / "corpus.txt"
    if corpus == "empty":
        path.write_text("")
    drafter = instantiate(compose(["model=tiny-random", "drafter=hd", f"drafter.statistics_corpus={path}"]).drafter)
    with pytest.raises(SpecbenchError, match=problem) as caught:
        drafter.prepare(tiny)
    assert "\n" not in str(caught.value) and str(path) in str(caught.value)
    assert not (cache / "answers").exists() and not (cache / "model_db").exists()


@pytest.mark.parametrize("key, problem", [("drafter.model_db_build.prompts", "no such file"),
                                          ("drafter.model_db_build.exclude_questions", "no such file")])
def test_a_missing_prompt_or_question_file_fails_before_hd_generates_any_answer(tiny, cache, tmp_path, no_generation,
                                                                                key, problem):
    drafter = instantiate(compose(["model=tiny-random", "drafter=hd", f"{key}={tmp_path}/none.jsonl"]).drafter)
    with pytest.raises(SpecbenchError, match=problem) as caught:
        drafter.prepare(tiny)
    assert "\n" not in str(caught.value) and f"{tmp_path}/none.jsonl" in str(caught.value)
    assert not (cache / "answers").exists()


def test_an_empty_distillation_corpus_fails_before_pruning(tiny, cache, tmp_path):
    from specbench.artefacts.pruned_draft import pruned_draft

    empty = tmp_path / "empty.txt"
    empty.write_text("")
    settings = {"layers": 1, "selection": "first", "distill_tokens": 100, "corpus": str(empty)}
    with pytest.raises(SpecbenchError, match="holds no text"):
        pruned_draft(tiny, cache / "drafts" / "d", settings, given=False)
    assert not (cache / "drafts" / "d").exists()


# ---- answers shipped with the package --------------------------------------------------------------------------


@pytest.fixture
def shipped(tiny, tmp_path, monkeypatch):
    """Answers of tiny-random to PROMPTS (4 tokens) written as shipped ones into a folder the lookup reads, from a
    cache of their own; returns (folder, the answers)."""
    folder = tmp_path / "shipped"
    folder.mkdir()
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "generating-cache"))
    manifest = write_shipped_answers(tiny, PROMPTS, 4, folder, {"machine": "test machine"}, "test answers")
    pairs = target_answers(tiny, PROMPTS, 4)
    monkeypatch.setattr(answers_module, "SHIPPED_ANSWERS_DIR", folder)
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "fresh-cache"))
    assert manifest["key"] == settings_key(answers_settings(tiny, PROMPTS, 4))
    return folder, pairs


def test_shipped_answers_of_the_same_key_are_installed_not_generated(tiny, shipped, no_generation, caplog):
    _, pairs = shipped
    with caplog.at_level(logging.INFO):
        assert target_answers(tiny, PROMPTS, 4) == pairs
    [line] = [message for message in messages(caplog) if "shipped" in message]
    assert line.startswith("using the answers shipped with specbench for tiny-random (3 prompts, up to 4 tokens, "
                           "generated on test machine): installed in ")
    assert not messages(caplog, logging.WARNING)
    assert target_answers(tiny, PROMPTS, 4) == pairs  # from the cache now, checked like any cached answers


def test_damaged_shipped_answers_are_refused_with_a_warning_and_generated(tiny, shipped, caplog):
    folder, pairs = shipped
    file = folder / "answers-tiny-random.jsonl.gz"
    rows = gzip.decompress(file.read_bytes()).replace(b"[", b"[1, ", 1)
    file.write_bytes(gzip.compress(rows))
    with caplog.at_level(logging.INFO):
        assert target_answers(tiny, PROMPTS, 4) == pairs
    [warning] = messages(caplog, logging.WARNING)
    assert warning.startswith("the answers shipped with specbench for tiny-random are damaged (")
    assert "its SHA-256 is not the one its manifest records" in warning and warning.endswith("generating them instead")
    assert any(message.startswith("building the greedy answers") for message in messages(caplog))


def test_a_truncated_shipped_file_is_refused(tiny, shipped):
    folder, _ = shipped
    file = folder / "answers-tiny-random.jsonl.gz"
    file.write_bytes(file.read_bytes()[:20])
    with pytest.raises(SpecbenchError, match="answers-tiny-random.jsonl.gz"):
        shipped_rows(shipped_manifest("tiny-random", folder), folder)


@pytest.mark.parametrize("prompts, length, difference", [
    (PROMPTS, 5, "max_new_tokens 4, not 5"),
    (PROMPTS[:2], 4, "3 other prompts, not these 2"),
])
def test_shipped_answers_for_other_settings_are_not_used(tiny, shipped, caplog, prompts, length, difference):
    with caplog.at_level(logging.INFO):
        pairs = target_answers(tiny, prompts, length)
    assert len(pairs) == len(prompts)
    # Another answer set is another artefact, not a problem: a note, not a warning.
    assert not messages(caplog, logging.WARNING)
    assert (f"the answers shipped with specbench for tiny-random are for other settings ({difference}): "
            "generating these instead") in messages(caplog)


def test_the_shipped_answers_are_those_hd_looks_up_for_the_embedded_model():
    """The package's own file: its key is the one ``drafter=hd`` on smollm2-135m computes (the built-in prompts,
    none of which overlaps the built-in questions, at HD's max_new_tokens), its checksum holds and it is small."""
    manifest = shipped_manifest("smollm2-135m")
    assert manifest is not None, "specbench/data/answers-smollm2-135m.json is missing"
    model = OmegaConf.load(CONF_DIR / "model" / "smollm2-135m.yaml")
    hd = compose(["drafter=hd"]).drafter
    prompts, provenance = model_db_prompt_set(OmegaConf.to_container(hd.model_db_build, resolve=True))
    assert provenance["prompts_overlapping_questions"] == 0 and prompts == resolve_prompts(None)
    settings = {"source": f"{model.pip_name}:{model.gguf_file}", "prompts": prompts,
                "max_new_tokens": hd.model_db_build.max_new_tokens}
    assert manifest["key"] == settings_key(settings) and manifest["prompts"]["sha256"] == prompt_texts_digest(prompts)
    rows = shipped_rows(manifest)
    assert len(rows.splitlines()) == 96 == manifest["answers"]
    assert (answers_module.SHIPPED_ANSWERS_DIR / manifest["file"]).stat().st_size < 1_000_000
    assert "Apache-2.0" in manifest["license"] and manifest["generated"]["machine"]


# ---- python -m specbench.prepare --------------------------------------------------------------------------------


def run_prepare(capsys, *argv) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exit_status:
        prepare.main(list(argv))
    out, err = capsys.readouterr()
    return exit_status.value.code, out, err


def test_a_dry_run_prints_the_plan_and_builds_nothing(tiny, cache, capsys, no_generation):
    code, out, _ = run_prepare(capsys, "--model", "tiny-random", "--drafters", "hd,rest,ar", "--dry-run")
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == "prepare: drafter=ar needs nothing built for tiny-random"
    assert lines[1].startswith("prepare: what the runs of tiny-random look up on first use")
    assert lines[2].startswith("  hd: the greedy answers of tiny-random to 96 prompts, up to 1024 tokens each")
    assert lines[3].startswith("  hd: HD's model database of tiny-random") and ": to build, about" in lines[3]
    assert lines[4].startswith("  hd: the statistics datastore of python-docs for tiny-random: to build")
    # rest's datastore is hd's statistics datastore: listed once
    assert re.fullmatch(r"  3 to build, about \d+ s in all \(an estimate\)", lines[5]) and len(lines) == 6
    assert sorted(path.name for path in cache.iterdir()) == ["corpora"]


def test_prepare_builds_what_the_runs_look_up(tiny, cache, capsys, caplog):
    hd_overrides = ["drafter.model_db_build.max_new_tokens=6", "drafter.model_db_build.max_prompts=4"]
    with caplog.at_level(logging.INFO):
        code, out, _ = run_prepare(capsys, "--model", "tiny-random", "--drafters", "hd", *hd_overrides)
    assert code == 0 and out.splitlines()[-1].startswith("prepare: done")
    assert any(message.startswith("building the greedy answers of tiny-random to 4 prompts")
               for message in messages(caplog))
    code, out, _ = run_prepare(capsys, "--model", "tiny-random", "--drafters", "samd,wide-pruned")
    assert code == 0 and "prepare: building what drafter=samd needs" in out
    # A run's drafter, composed as the runner composes it, finds everything built: nothing left to build.
    for drafter, overrides in [("hd", hd_overrides), ("samd", []), ("wide-pruned", [])]:
        artefacts = instantiate(compose(["model=tiny-random", f"drafter={drafter}", *overrides]).drafter).artefacts(tiny)
        assert artefacts and all(planned.cached() for planned in artefacts), drafter
    code, out, _ = run_prepare(capsys, "--model", "tiny-random", "--drafters", "samd,wide-pruned", "--dry-run")
    assert code == 0 and out.splitlines()[-1] == "  nothing to build" and out.count(": cached  [") == 2


def test_prepare_refuses_an_unknown_drafter_in_one_line(capsys):
    code, out, err = run_prepare(capsys, "--drafters", "hd,nope", "--dry-run")
    assert code == 2 and out == ""
    assert err.startswith("prepare: error: --drafters 'hd,nope': nope is not a drafter config; choose among ")
    assert err.count("\n") == 1
