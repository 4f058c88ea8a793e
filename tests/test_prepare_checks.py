"""A plan says only what it has checked: ``python -m specbench.prepare --dry-run`` calls a shipped file shipped only
when its checksum holds, and a cached copy cached only when its files are the ones its manifest records; a
damaged cached copy of an artefact the package ships is installed again from the package, never generated."""

from __future__ import annotations

import gzip
import json
import logging
import shutil
import types
from pathlib import Path

import pytest
from omegaconf import OmegaConf

import specbench.artefacts.target_answers as answers_module
from specbench import prepare
from specbench.config import compose
from specbench.artefacts.model_database import model_db_prompt_set
from specbench.artefacts.target_answers import (
    answers_directory,
    planned_answers,
    resolve_prompts,
    shipped_manifest,
    target_answers,
    write_shipped_answers,
)

PROMPTS = ["Name a colour.", "Count to three.", "Say hello."]
SHIPPED_STATE = "shipped with specbench (installed in a second)"


def damage_kinds(data: bytes) -> dict[str, bytes]:
    """Ways a file is found damaged: cut short, replaced by noise, emptied, or whole in its format with other
    content (a gzip of rows that are not the recorded ones)."""
    return {"truncated": data[: len(data) // 2], "random bytes": bytes(range(256)) * 4, "empty": b"",
            "other rows": gzip.compress(b'{"prompt_ids": [1], "answer_ids": [2]}\n')}


@pytest.fixture
def no_generation(monkeypatch):
    def generate(*args, **kwargs):
        raise AssertionError("answers were generated")

    monkeypatch.setattr(answers_module, "generate_answers", generate)


# ---- the package's own shipped answers, copied and damaged ------------------------------------------------------


@pytest.fixture
def package_copy(tmp_path, monkeypatch, tiny):
    """specbench/data's shipped answers copied to a folder the lookup reads, and a stand-in for the embedded model
    with its name and source (the plan reads only those and the config's sizes; loading it would take minutes)."""
    folder = tmp_path / "data"
    folder.mkdir()
    for file in answers_module.SHIPPED_ANSWERS_DIR.glob("answers-smollm2-135m.*"):
        shutil.copy(file, folder / file.name)
    monkeypatch.setattr(answers_module, "SHIPPED_ANSWERS_DIR", folder)
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "cache"))
    manifest = json.loads((folder / "answers-smollm2-135m.json").read_text())
    model = types.SimpleNamespace(name="smollm2-135m", source=manifest["model"]["source"], weights=tiny.weights)
    return folder, model, manifest


def test_the_intact_package_copy_is_planned_as_shipped(package_copy):
    _, model, manifest = package_copy
    planned = planned_answers(model, resolve_prompts(None), manifest["max_new_tokens"])
    assert planned.shipped and planned.state() == SHIPPED_STATE and not planned.needs_build()


@pytest.mark.parametrize("kind", ["truncated", "random bytes", "empty", "other rows"])
def test_a_damaged_shipped_file_is_planned_as_damaged_and_built(package_copy, kind):
    folder, model, manifest = package_copy
    file = folder / manifest["file"]
    file.write_bytes(damage_kinds(file.read_bytes())[kind])
    planned = planned_answers(model, resolve_prompts(None), manifest["max_new_tokens"])
    state = planned.state()
    assert not planned.shipped and planned.needs_build(), state
    assert state.startswith(f"the copy shipped with specbench is damaged ({file}: ") and "): to build, about" in state
    assert "\n" not in state


@pytest.mark.parametrize("text", ["", "{not json", "[1, 2]", "[" * 100000 + "]" * 100000,
                                  '{"kind": "shipped target answers", "model": [], "prompts": {}}'],
                         ids=["empty", "not JSON", "a list", "deeply nested", "a model that is no table"])
def test_a_damaged_shipped_manifest_is_planned_as_damaged(package_copy, text):
    folder, model, manifest = package_copy
    (folder / "answers-smollm2-135m.json").write_text(text)
    planned = planned_answers(model, resolve_prompts(None), manifest["max_new_tokens"])
    state = planned.state()
    assert not planned.shipped and state.startswith("the copy shipped with specbench is damaged (") and "\n" not in state
    assert shipped_manifest("smollm2-135m") is None  # and nothing is installed from it


def edited_manifest(**changes):
    def edit(folder: Path) -> None:
        file = folder / "answers-smollm2-135m.json"
        file.write_text(json.dumps({**json.loads(file.read_text()), **changes}))
    return edit


# Shipped copies damaged in ways each part of the install reads, and one intact (the plan must say the same for all)
SHIPPED_CASES = {
    "intact": lambda folder: None,
    "generated is no table": edited_manifest(generated="a machine"),
    "generated is a list": edited_manifest(generated=[1, 2]),
    "other answer count": edited_manifest(answers=95),
    "other checksum": edited_manifest(sha256="0" * 64),
    "file elsewhere": edited_manifest(file="answers-smollm2-135m--none.jsonl.gz"),
    "other key": edited_manifest(key="0123456789"),
    "another set's manifest damaged": lambda folder: (folder / "answers-smollm2-135m--other.json").write_text("{"),
}


@pytest.mark.parametrize("case", SHIPPED_CASES)
def test_the_plan_promises_exactly_what_the_install_does(package_copy, tmp_path, case, caplog):
    """The plan's verdict and the install's come from one check (target_answers.shipped_answer_set): planned as
    shipped exactly when the install then installs a copy that loads, else planned for a build, and the install
    warns and returns (never a traceback after publishing, as a manifest whose 'generated' was not a table gave)."""
    folder, model, manifest = package_copy
    SHIPPED_CASES[case](folder)
    prompts = resolve_prompts(None)
    planned = planned_answers(model, prompts, manifest["max_new_tokens"])
    directory = tmp_path / "installed"
    with caplog.at_level(logging.INFO):
        installed = answers_module.install_shipped_answers(
            model, directory, answers_module.answers_settings(model, prompts, manifest["max_new_tokens"]))
    assert planned.shipped == installed == (case in ("intact", "another set's manifest damaged")), planned.state()
    assert planned.needs_build() == (not installed)
    if installed:
        assert len(answers_module.read_answers(directory, len(prompts))) == len(prompts)
    elif case == "other key":  # another answer set: planned as a build, with no word of damage
        assert planned.state().startswith("to build, about") and planned.shipped_damage is None
    else:
        assert planned.state().startswith("the copy shipped with specbench is damaged ("), planned.state()
        assert any(record.getMessage().startswith(f"the answers shipped with specbench for {model.name} are "
                                                  "damaged (") for record in caplog.records)


# ---- the dry run of python -m specbench.prepare -----------------------------------------------------------------


HD = ["drafter.model_db_build.max_new_tokens=4", "drafter.model_db_build.max_prompts=3"]


@pytest.fixture
def hd_shipped(tiny, tmp_path, monkeypatch):
    """Answers of tiny-random to the prompts HD's model database reads under ``HD``, written as shipped ones into
    a folder the lookup reads; a fresh cache holding the statistics corpus."""
    build = OmegaConf.to_container(compose(["model=tiny-random", "drafter=hd", *HD]).drafter.model_db_build,
                                   resolve=True)
    prompts, _ = model_db_prompt_set(build)
    folder = tmp_path / "shipped"
    folder.mkdir()
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "generating-cache"))
    write_shipped_answers(tiny, prompts, 4, folder, {"machine": "test machine"}, "test answers")
    monkeypatch.setattr(answers_module, "SHIPPED_ANSWERS_DIR", folder)
    cache = tmp_path / "cache"
    (cache / "corpora" / "python-docs").mkdir(parents=True)
    shutil.copy(Path(__file__).parent / "fixtures" / "corpus.txt",
                cache / "corpora" / "python-docs" / "corpus.txt")
    monkeypatch.setenv("SPECBENCH_CACHE", str(cache))
    return folder / "answers-tiny-random.jsonl.gz"


def dry_run(capsys) -> list[str]:
    with pytest.raises(SystemExit) as exit_status:
        prepare.main(["--model", "tiny-random", "--drafters", "hd", "--dry-run", *HD])
    out, _ = capsys.readouterr()
    assert exit_status.value.code == 0, out
    return out.splitlines()


def test_a_dry_run_says_a_damaged_shipped_file_is_damaged_and_will_be_built(hd_shipped, capsys, no_generation):
    answers_line = next(line for line in dry_run(capsys) if "greedy answers" in line)
    assert f": {SHIPPED_STATE}  [" in answers_line
    hd_shipped.write_bytes(hd_shipped.read_bytes()[:-9])  # cut short
    lines = dry_run(capsys)
    answers_line = next(line for line in lines if "greedy answers" in line)
    assert f": the copy shipped with specbench is damaged ({hd_shipped}: " in answers_line
    assert "): to build, about " in answers_line and SHIPPED_STATE not in answers_line
    assert lines[-1].startswith("  3 to build, ")  # the answers now among what is built, with the two databases


# ---- a damaged cached copy of shipped answers ------------------------------------------------------------------


@pytest.fixture
def installed(tiny, tmp_path, monkeypatch):
    """Shipped answers of tiny-random to PROMPTS (4 tokens), installed into a fresh cache by a lookup; returns
    (the answers, the cached directory)."""
    folder = tmp_path / "shipped"
    folder.mkdir()
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "generating-cache"))
    write_shipped_answers(tiny, PROMPTS, 4, folder, {"machine": "test machine"}, "test answers")
    monkeypatch.setattr(answers_module, "SHIPPED_ANSWERS_DIR", folder)
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "cache"))
    pairs = target_answers(tiny, PROMPTS, 4)
    return pairs, answers_directory(tiny, PROMPTS, 4)


CACHED_DAMAGE = {
    "answers cut short": ("answers.jsonl", lambda data: data[:-7]),
    "answers of noise": ("answers.jsonl", lambda data: bytes(range(256))),
    "answers emptied": ("answers.jsonl", lambda data: b""),
    "manifest emptied": ("manifest.json", lambda data: b""),
    "manifest of another shape": ("manifest.json", lambda data: b"[]"),
}


@pytest.mark.parametrize("damage", CACHED_DAMAGE)
def test_a_damaged_cached_copy_is_reinstalled_from_the_shipped_one(tiny, installed, no_generation, caplog, damage):
    pairs, directory = installed
    name, change = CACHED_DAMAGE[damage]
    file = directory / name
    file.write_bytes(change(file.read_bytes()))
    planned = planned_answers(tiny, PROMPTS, 4)
    assert planned.state().startswith("the cached copy is damaged (") and not planned.needs_build()
    assert planned.state().endswith("reinstalled from the copy shipped with specbench, in a second")
    with caplog.at_level(logging.INFO):
        assert target_answers(tiny, PROMPTS, 4) == pairs  # generate_answers raises: installed, not generated
    assert any(record.getMessage().startswith("using the answers shipped with specbench for tiny-random")
               for record in caplog.records)
    assert planned_answers(tiny, PROMPTS, 4).state() == "cached"


def test_a_damaged_cached_copy_without_a_shipped_one_is_planned_for_a_build(tiny, installed, monkeypatch, tmp_path):
    _, directory = installed
    monkeypatch.setattr(answers_module, "SHIPPED_ANSWERS_DIR", tmp_path / "nothing-shipped")
    (directory / "answers.jsonl").write_bytes(b"")
    planned = planned_answers(tiny, PROMPTS, 4)
    assert planned.needs_build() and planned.state().startswith("the cached copy is damaged (")
    assert "): to build, about " in planned.state()


# ---- a damaged cached artefact: planned and rebuilt by prepare ---------------------------------------------------


@pytest.fixture
def corpus_cache(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    (cache / "corpora" / "python-docs").mkdir(parents=True)
    shutil.copy(Path(__file__).parent / "fixtures" / "corpus.txt", cache / "corpora" / "python-docs" / "corpus.txt")
    monkeypatch.setenv("SPECBENCH_CACHE", str(cache))
    return cache


def run_prepare(capsys, *argv) -> list[str]:
    with pytest.raises(SystemExit) as exit_status:
        prepare.main(["--model", "tiny-random", "--drafters", "rest", *argv])
    out, err = capsys.readouterr()
    assert exit_status.value.code == 0, err
    return out.splitlines()


def test_prepare_plans_and_rebuilds_a_damaged_cached_artefact(corpus_cache, capsys):
    first = run_prepare(capsys)
    stores = [path for path in (corpus_cache / "datastores").iterdir() if path.is_symlink()]
    assert len(stores) == 1, first
    store = stores[0]
    with open(store / "tokens.npy", "ab") as file:
        file.write(b"\0" * 8)  # a file of another size than its manifest records
    lines = run_prepare(capsys, "--dry-run")
    [line] = [line for line in lines if "the datastore of python-docs" in line]
    assert ": the cached copy is damaged (" in line and "tokens.npy holds" in line and "): to build, about" in line
    assert lines[-1].startswith("  1 to build, ")
    lines = run_prepare(capsys)
    assert "prepare: building what drafter=rest needs" in lines and lines[-1].startswith("prepare: done")
    assert run_prepare(capsys, "--dry-run")[-1] == "  nothing to build"


def test_a_cached_copy_whole_to_its_manifest_that_its_load_refuses_is_planned_for_a_build(corpus_cache, capsys):
    """Files as their manifest records them are not enough: the plan checks what the run checks (the artefact's own
    load), so a datastore of another format version is planned as a rebuild, and prepare rebuilds it, where a plan
    that read the manifest's records alone said "cached" and the run then rebuilt it with a warning."""
    from specbench.storage.publish import replace_directory

    run_prepare(capsys)
    [store] = [path for path in (corpus_cache / "datastores").iterdir() if path.is_symlink()]
    manifest = json.loads((store / "manifest.json").read_text())
    arrays = {file: (store / file).read_bytes() for file in manifest["files"]}

    def write(version: Path) -> None:
        for file, data in arrays.items():
            (version / file).write_bytes(data)

    # published whole, as a specbench of another datastore format would: every file as its manifest records
    replace_directory(store, write, {**{key: value for key, value in manifest.items() if key != "files"},
                                     "format_version": -1})
    lines = run_prepare(capsys, "--dry-run")
    [line] = [line for line in lines if "the datastore of python-docs" in line]
    assert ": the cached copy is damaged (" in line and "datastore format -1, expected" in line, line
    assert "): to build, about" in line and lines[-1].startswith("  1 to build, ")
    run_prepare(capsys)
    assert run_prepare(capsys, "--dry-run")[-1] == "  nothing to build"


def test_cached_answers_of_another_count_are_planned_as_damaged(tiny, installed, monkeypatch, tmp_path):
    """Target answers published whole but holding fewer rows than the prompts (what read_answers refuses)."""
    from specbench.storage.publish import replace_directory

    _, directory = installed
    monkeypatch.setattr(answers_module, "SHIPPED_ANSWERS_DIR", tmp_path / "nothing-shipped")
    rows = (directory / "answers.jsonl").read_bytes().splitlines(keepends=True)
    replace_directory(directory, lambda version: (version / "answers.jsonl").write_bytes(b"".join(rows[:2])),
                      {"kind": "target answers"})
    planned = planned_answers(tiny, PROMPTS, 4)
    assert planned.needs_build() and "does not hold 3 answers of token ids" in planned.state(), planned.state()
