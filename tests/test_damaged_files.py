"""Every file specbench reads back (manifests, databases, automata, a run's drafter state and records, shipped and
cached answers, EAGLE heads, calibration and lock records) is found damaged in one line, or rebuilt, whatever the
reading library raises: each reader meets a file cut short, noise, a zip that is no .npz, valid JSON of the wrong
shape, an empty file and JSON nested past Python's recursion limit.

The database files are published with ``replace_directory`` after they are damaged, so their manifest records the
damaged bytes and its checksum holds: the test reaches the reader itself, not only ``verify_files``."""

from __future__ import annotations

import io
import json
import logging
import shutil
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from specbench.storage.locks import _parse_holder
from specbench.storage.manifest import MANIFEST, read_manifest
from specbench.storage.publish import replace_directory
from specbench.errors import SpecbenchError


def a_zip() -> bytes:
    """A whole zip archive that is no .npz: one text member."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("readme.txt", "not an array")
    return buffer.getvalue()


def damage(kind: str, whole: bytes) -> bytes:
    return {
        "truncated": whole[: max(1, len(whole) // 2)],
        "random bytes": bytes(range(256)) * 8,
        "a zip that is no npz": a_zip(),
        "JSON of the wrong shape": b'[1, "two", {"three": null}]',
        "empty": b"",
        "deeply nested JSON": b"[" * 200_000 + b"]" * 200_000,
    }[kind]


KINDS = ["truncated", "random bytes", "a zip that is no npz", "JSON of the wrong shape", "empty",
         "deeply nested JSON"]


def one_line(call, *args, match: str | None = None, **kwargs) -> str:
    with pytest.raises(SpecbenchError) as error:
        call(*args, **kwargs)
    message = str(error.value)
    assert "\n" not in message and "Traceback" not in message, message
    if match is not None:
        assert match in message, message
    return message


def republished(source: Path, target: Path, name: str, kind: str) -> Path:
    """``source``'s published files published again at ``target`` with file ``name`` damaged by ``kind``, under
    ``source``'s manifest (its file records made afresh, so the damaged bytes pass ``verify_files``)."""
    manifest = json.loads((source / MANIFEST).read_text())
    manifest.pop("files", None)

    def write(staging: Path) -> None:
        for file in source.iterdir():
            if file.name != MANIFEST:
                shutil.copy(file, staging / file.name)
        (staging / name).write_bytes(damage(kind, (source / name).read_bytes()))

    replace_directory(target, write, manifest)
    return target


# ---- manifests, and the databases and automata of the cache -----------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_a_damaged_manifest_is_one_line(tmp_path, kind):
    (tmp_path / MANIFEST).write_bytes(damage(kind, b'{"format_version": 1}'))
    one_line(read_manifest, tmp_path, "datastore", "rebuild it", match="damaged datastore")


@pytest.fixture(scope="module")
def model_db(tmp_path_factory):
    from specbench.datastores.model_db import save_model_db

    directory = tmp_path_factory.mktemp("model-db") / "db"
    tables = {1: (np.array([[5, 6, 7], [5, 8, 9]]), np.array([3, 1])), 2: (np.array([[4, 5, 6, 7]]), np.array([2]))}
    save_model_db(directory, tables, {"tokenizer": {"fingerprint": "fp"}, "key_tokens": 2, "continuation_length": 2})
    return directory


@pytest.mark.parametrize("kind", KINDS)
def test_a_damaged_model_database_is_one_line(model_db, tmp_path, kind):
    from specbench.datastores.model_db import load_model_db

    assert load_model_db(model_db, "fp", 2, 2, 3) is not None  # the whole one loads
    damaged = republished(model_db, tmp_path / "db", "ngrams.npz", kind)
    one_line(load_model_db, damaged, "fp", 2, 2, 3, match="damaged model database")


@pytest.fixture(scope="module")
def datastore(tmp_path_factory):
    from specbench.datastores.suffix_array import TokenDatastore

    directory = tmp_path_factory.mktemp("datastore") / "store"
    TokenDatastore.build([[1, 2, 3, 1, 2], [2, 3, 4]], {"tokenizer": {"fingerprint": "fp"}}).save(directory)
    return directory


@pytest.mark.parametrize("name", ["tokens.npy", "suffixes.npy"])
@pytest.mark.parametrize("kind", KINDS)
def test_a_damaged_datastore_is_one_line(datastore, tmp_path, kind, name):
    from specbench.datastores.suffix_array import TokenDatastore

    assert TokenDatastore.load(datastore, "fp") is not None
    damaged = republished(datastore, tmp_path / "store", name, kind)
    one_line(TokenDatastore.load, damaged, "fp", match="damaged datastore")


@pytest.fixture(scope="module")
def automaton(tmp_path_factory):
    from specbench.datastores.suffix_automaton import StaticSuffixAutomaton

    directory = tmp_path_factory.mktemp("automaton") / "sam"
    StaticSuffixAutomaton.build([[1, 2, 3, 1, 2], [2, 3, 4]], eos_token=0, progress=False).save(directory)
    return directory


@pytest.mark.parametrize("name", ["tokens.npy", "link.npy", "hash_keys.npy"])
@pytest.mark.parametrize("kind", KINDS)
def test_a_damaged_suffix_automaton_is_one_line(automaton, tmp_path, kind, name):
    from specbench.datastores.suffix_automaton import StaticSuffixAutomaton

    assert StaticSuffixAutomaton.load(automaton) is not None
    damaged = republished(automaton, tmp_path / "sam", name, kind)
    one_line(StaticSuffixAutomaton.load, damaged, match="damaged suffix automaton")


@pytest.mark.parametrize("kind", KINDS)
def test_a_damaged_manifest_leaves_the_rebuild_command_searchable(tmp_path, kind):
    from specbench.artefacts.statistics_datastore import recorded_source

    (tmp_path / MANIFEST).write_bytes(damage(kind, b'{"corpus": {"spec": "python-docs"}}'))
    assert recorded_source(tmp_path, "corpus", "spec") in (None, "python-docs")


# ---- a run's own files -----------------------------------------------------------------------------------------


def npz_bytes(**arrays) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


@pytest.mark.parametrize("kind", KINDS)
def test_a_damaged_drafter_state_is_one_line(tmp_path, kind):
    from specbench.results.run_directory import RunDirectory

    run = RunDirectory(tmp_path / "run", with_baseline=False)
    run.drafter_state_file.parent.mkdir(parents=True, exist_ok=True)
    whole = npz_bytes(successors=np.zeros((4, 2), dtype=np.int64), _questions=np.array(["1"]))
    run.drafter_state_file.write_bytes(whole)
    assert run.drafter_state() is not None
    run.drafter_state_file.write_bytes(damage(kind, whole))
    one_line(run.drafter_state, match=f"{run.drafter_state_file} is damaged")


@pytest.fixture(scope="module")
def stateful_drafters(tiny):
    """Each drafter that carries state across questions, prepared for the tiny target (built directly: composing
    each config costs a second)."""
    from specbench.drafters.hybrid import HybridDrafter
    from specbench.drafters.recycling import TokenRecycling
    from specbench.drafters.samd import SuffixAutomatonDrafter
    from specbench.drafters.suffix import SuffixDecoding

    drafters = {"recycling": TokenRecycling(), "samd": SuffixAutomatonDrafter(corpus=None),
                "suffix": SuffixDecoding(), "hybrid": HybridDrafter(recycling_context=2)}
    for drafter in drafters.values():
        drafter.prepare(tiny)
        assert drafter.state() is not None
    return drafters


@pytest.mark.parametrize("arrays", [{"other": np.zeros(3)}, {"successors": np.zeros(3)},
                                    {"successors": np.array(["a", "b"])}],
                         ids=["a missing array", "an array of another shape", "an array of text"])
@pytest.mark.parametrize("name", ["recycling", "samd", "suffix", "hybrid"])
def test_a_drafter_state_of_other_arrays_is_one_line(stateful_drafters, tmp_path, name, arrays):
    """A whole .npz that numpy reads, holding arrays the drafter cannot take back: damaged all the same."""
    from specbench.results.run_directory import RunDirectory
    from specbench.engines.drafter_state import restore_drafter_state

    run = RunDirectory(tmp_path / "run", with_baseline=False)
    one_line(restore_drafter_state, stateful_drafters[name], run, {"1"}, (arrays, {"1"}),
             match="drafter_state.npz is damaged")


def test_a_hybrid_state_before_any_pair_is_saved_and_taken_back(tiny):
    """Saved after a first question that verified nothing (skipped, or no step): an empty table of pairs."""
    from specbench.drafters.hybrid import HybridDrafter

    drafter = HybridDrafter(recycling_context=2)
    drafter.prepare(tiny)
    state = drafter.state()
    assert state["pair_keys"].shape == (0, 2) and state["pair_rows"].shape == (0, drafter.recycling.top_k)
    drafter.restore(state)
    assert drafter.pairs == {}


@pytest.mark.parametrize("kind", KINDS)
def test_a_damaged_run_record_is_one_line(tmp_path, kind):
    from specbench.results.readers import read_json_file

    file = tmp_path / "run.json"
    file.write_bytes(damage(kind, b'{"schema": 1}'))
    one_line(read_json_file, file, "run's record", match=str(file))


def test_a_run_record_with_an_integer_past_python_s_limit_is_one_line(tmp_path):
    from specbench.results.readers import read_json_file

    file = tmp_path / "summary.json"
    file.write_text('{"tokens": ' + "9" * 5000 + "}")
    one_line(read_json_file, file, "run's summary", match=str(file))


@pytest.mark.parametrize("kind", KINDS + ["negative latencies", "nan latencies"])
def test_damaged_saved_latencies_are_measured_again(tmp_path, kind, caplog):
    from specbench.engines.calibration import saved_latencies

    file = tmp_path / "latency.json"
    whole = json.dumps({"latency_s": {"1": 0.01, "4": 0.02}}).encode()
    file.write_bytes(whole)
    assert saved_latencies(file) == {1: 0.01, 4: 0.02}
    special = {"negative latencies": b'{"latency_s": {"1": -0.5}}', "nan latencies": b'{"latency_s": {"1": NaN}}'}
    file.write_bytes(special.get(kind) or damage(kind, whole))
    with caplog.at_level(logging.WARNING):
        assert saved_latencies(file) is None
    assert any("is damaged; calibrating again" in record.getMessage() for record in caplog.records)


@pytest.mark.parametrize("kind", KINDS)
def test_a_damaged_lock_record_names_no_holder(kind):
    assert _parse_holder(damage(kind, b'{"pid": 1, "host": "h"}').decode("utf-8", "replace")) is None


# ---- answers, shipped and cached -------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_damaged_shipped_answers_are_one_line(tmp_path, kind):
    from specbench.artefacts.target_answers import SHIPPED_ANSWERS_DIR, shipped_manifest, shipped_rows

    manifest = shipped_manifest("smollm2-135m")
    folder = tmp_path / "data"
    folder.mkdir()
    whole = (SHIPPED_ANSWERS_DIR / manifest["file"]).read_bytes()
    (folder / manifest["file"]).write_bytes(damage(kind, whole))
    one_line(shipped_rows, manifest, folder, match=manifest["file"])


@pytest.mark.parametrize("kind", KINDS)
def test_a_damaged_shipped_manifest_is_not_used(tmp_path, kind, caplog):
    from specbench.artefacts.target_answers import SHIPPED_ANSWERS_DIR, shipped_manifest

    whole = (SHIPPED_ANSWERS_DIR / "answers-smollm2-135m.json").read_bytes()
    (tmp_path / "answers-smollm2-135m.json").write_bytes(damage(kind, whole))
    with caplog.at_level(logging.WARNING):
        assert shipped_manifest("smollm2-135m", tmp_path) is None
    assert all("\n" not in record.getMessage() for record in caplog.records)


@pytest.mark.parametrize("kind", KINDS)
def test_damaged_cached_answers_are_one_line(tmp_path, kind):
    from specbench.artefacts.target_answers import ANSWERS_FILE, answer_line, read_answers

    directory = tmp_path / "answers"
    whole = (answer_line([1, 2], [3]) + answer_line([4], [5, 6])).encode()
    replace_directory(directory, lambda staging: (staging / ANSWERS_FILE).write_bytes(damage(kind, whole)),
                      {"kind": "target answers"})
    one_line(read_answers, directory, 2, match="damaged target answers")


# ---- EAGLE heads and converted model copies --------------------------------------------------------------------


@pytest.fixture(scope="module")
def head(tiny, tmp_path_factory):
    from specbench.heads.eagle_head_files import save_eagle_head
    from specbench.heads.eagle_heads import build_head, head_config_for

    torch.manual_seed(0)
    model_head = build_head(head_config_for(tiny, "eagle"), tiny.weights.module.get_output_embeddings(),
                            tiny.weights.module.get_input_embeddings().weight)
    directory = tmp_path_factory.mktemp("head") / "head"
    directory.mkdir()
    save_eagle_head(model_head, directory, "eagle")
    return directory


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name", ["config.json", "weights"])
def test_a_damaged_head_is_one_line(tiny, head, tmp_path, name, kind):
    from specbench.heads.eagle_head_files import WEIGHT_FILES, load_eagle_head

    copy = tmp_path / "head"
    shutil.copytree(head, copy)
    file = copy / name if name == "config.json" else next(copy / n for n in WEIGHT_FILES if (copy / n).is_file())
    file.write_bytes(damage(kind, file.read_bytes()))
    one_line(load_eagle_head, tiny, str(copy), "eagle", match=str(copy))


@pytest.mark.parametrize("kind", KINDS)
def test_a_damaged_conversion_record_is_a_damaged_copy(tmp_path, kind):
    from specbench.artefacts.gguf_conversion import CHECKSUM_FILE, converted_copy_problem

    (tmp_path / CHECKSUM_FILE).write_bytes(damage(kind, b'{"files": {"model.safetensors": {"bytes": 1}}}'))
    problem = converted_copy_problem(tmp_path)
    assert problem is not None and problem != "missing" and "\n" not in problem


@pytest.fixture(scope="module")
def pruned_draft(tiny, tmp_path_factory):
    """A one-layer pruned copy of the tiny target (no distillation), saved as specbench saves one."""
    from specbench.artefacts.pruned_draft import build_pruned_draft

    directory = tmp_path_factory.mktemp("pruned") / "draft"
    build_pruned_draft(tiny, directory, 1, "first", 0, "python-docs")
    return directory


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name", ["model.safetensors", "config.json"])
def test_a_damaged_pruned_draft_without_a_manifest_is_one_line(pruned_draft, tmp_path, name, kind):
    """A checkpoint given without manifest.json is loaded unchecked, so the loader's own errors must be one line."""
    from specbench.artefacts.pruned_draft import load_pruned_draft

    copy = tmp_path / "draft"
    shutil.copytree(pruned_draft, copy, symlinks=False)
    (copy / MANIFEST).unlink()
    (copy / name).write_bytes(damage(kind, (copy / name).read_bytes()))
    one_line(load_pruned_draft, copy, torch.float32, "rebuild it", require_manifest=False, match=str(copy))


@pytest.mark.parametrize("kind", KINDS + ["a mapping", "unbalanced YAML"])
def test_a_damaged_sweep_overrides_file_leaves_the_run_without_overrides(tmp_path, kind, caplog):
    from analysis.runs import sweep_overrides

    file = tmp_path / ".hydra" / "overrides.yaml"
    file.parent.mkdir()
    whole = b"- drafter=pld\n- drafter.num_draft_tokens=4\n"
    file.write_bytes(whole)
    assert sweep_overrides(tmp_path) == {"num_draft_tokens": "4"}
    special = {"a mapping": b"drafter: pld\n", "unbalanced YAML": b"- [drafter=pld\n- {\n"}
    file.write_bytes(special.get(kind) or damage(kind, whole))
    with caplog.at_level(logging.WARNING):
        found = sweep_overrides(tmp_path)
    assert isinstance(found, dict) and all(isinstance(value, str) for value in found.values())
