"""Damage that keeps a file's size and modification time is caught on load, for every cached artefact (converted
model copies, datastores, automata, model databases): one check in storage.manifest.verify_files. Each damage writes in
the middle of a file and sets its modification time back with os.utime, which leaves only the change time (ctime)
to tell; before, such a file was trusted without being hashed."""

from __future__ import annotations

import json
import logging
import os
import re
from pathlib import Path

import numpy as np
import pytest
from conftest import warnings_of

from specbench.storage.manifest import read_manifest, verify_files
from specbench.storage.publish import replace_directory
from specbench.artefacts.model_database import model_db
from specbench.artefacts.statistics_datastore import statistics_datastore
from specbench.artefacts.corpus_automaton import corpus_automaton
from specbench.errors import SpecbenchError
from specbench.testing import save_tiny_checkpoint
from test_datastore_caches import BUILD, cache  # noqa: F401 (a fixture)

TEXT = "the cat sat on the mat. the cat sat on the hat. the dog sat on the log. a bird flew over the tree."


@pytest.fixture
def corpus_file(tmp_path):
    file = tmp_path / "corpus.txt"
    file.write_text(TEXT)
    return file


def keeping_size_and_mtime(file: Path, change) -> None:
    """Apply ``change(file)`` (an in-place write), then set the modification time back to what it was."""
    before = file.stat()
    change(file)
    os.utime(file, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = file.stat()
    assert (after.st_size, after.st_mtime_ns) == (before.st_size, before.st_mtime_ns)


def flip_middle_bytes(file: Path, count: int = 64) -> None:
    """Invert ``count`` bytes in the middle of ``file``, in place."""
    size = file.stat().st_size
    with open(file, "r+b") as handle:
        handle.seek(size // 2)
        data = handle.read(count)
        handle.seek(size // 2)
        handle.write(bytes(byte ^ 0xFF for byte in data))


def swap_middle_values(file: Path) -> None:
    """Swap two different values in the middle of a .npy array, in place: every value stays valid (an id in the
    vocabulary, an index in range), so only the files' checksums can tell."""
    array = np.load(file, mmap_mode="r+")
    flat = array.reshape(-1)
    middle = flat.size // 2
    other = next(i for i in range(middle + 1, flat.size) if flat[i] != flat[middle])
    flat[middle], flat[other] = flat[other].copy(), flat[middle].copy()
    array.flush()
    del array, flat


def published(directory: Path) -> Path:
    [entry] = [path for path in directory.iterdir() if not path.name.startswith(".")]
    return entry


# ---- the check itself ----------------------------------------------------------------------------------------


def test_an_overwrite_that_keeps_size_and_modification_time_is_found(tmp_path):
    directory = tmp_path / "artefact"
    replace_directory(directory, lambda staging: (staging / "weights.bin").write_bytes(bytes(range(256)) * 64), {})
    assert verify_files(directory, read_manifest(directory, "test artefact", "")) is None
    keeping_size_and_mtime(directory / "weights.bin", flip_middle_bytes)
    assert verify_files(directory, read_manifest(directory, "test artefact", "")) == (
        "weights.bin is not the file that was written (its SHA-256 differs from manifest.json's)")


def test_a_manifest_edited_in_place_is_found(tmp_path):
    """A published version is named by its manifest's content key: a manifest whose counts, checksums or
    sources were changed (same size, same modification time) no longer matches that name."""
    directory = tmp_path / "artefact"
    replace_directory(directory, lambda staging: (staging / "data.bin").write_bytes(b"x" * 100),
                      {"corpus": {"spec": "corpus-a.txt"}})

    def edit(file: Path) -> None:
        file.write_text(file.read_text().replace("corpus-a.txt", "corpus-b.txt"))

    keeping_size_and_mtime(directory / "manifest.json", edit)
    problem = verify_files(directory, read_manifest(directory, "test artefact", ""))
    assert problem is not None and problem.startswith("manifest.json is not the one that was written")


def test_an_untouched_artefact_is_not_hashed_on_load(tmp_path, monkeypatch):
    """The check stays a stat: the 270 MB SmolLM2 copy costs 0.15 s to hash on every load."""
    from specbench.storage import manifest as artefacts

    directory = tmp_path / "artefact"
    replace_directory(directory, lambda staging: (staging / "data.bin").write_bytes(b"x" * 100), {})
    manifest = read_manifest(directory, "test artefact", "")
    monkeypatch.setattr(artefacts, "file_digest", lambda path: pytest.fail(f"{path} was hashed"))
    assert verify_files(directory, manifest) is None


def test_a_file_its_hash_found_whole_is_hashed_once(tmp_path, monkeypatch):
    """A manifest written before change times were recorded (every cache built until now), or a copied cache,
    is hashed at its first load only: the times it then has are recorded."""
    from specbench.storage import manifest as artefacts

    directory = tmp_path / "artefact"
    replace_directory(directory, lambda staging: (staging / "data.bin").write_bytes(b"x" * 100), {})
    manifest = read_manifest(directory, "test artefact", "")
    del manifest["files"]["data.bin"]["ctime_ns"]
    (directory / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    hashed = []
    real_digest = artefacts.file_digest
    monkeypatch.setattr(artefacts, "file_digest", lambda path: hashed.append(path) or real_digest(path))
    for _ in range(3):
        assert verify_files(directory, read_manifest(directory, "test artefact", "")) is None
    assert hashed == [directory / "data.bin"]
    keeping_size_and_mtime(directory / "data.bin", flip_middle_bytes)
    assert "data.bin is not the file that was written" in verify_files(
        directory, read_manifest(directory, "test artefact", ""))


# ---- a converted model copy ----------------------------------------------------------------------------------


def test_a_converted_copy_damaged_in_place_is_converted_again(tmp_path, monkeypatch, caplog):
    """The reported case: model.safetensors overwritten in the middle, its modification time restored, gave
    empty answers reported as identical and fast, exit 0."""
    import torch

    from specbench.artefacts import gguf_conversion
    from specbench.models import gguf

    conversions = []

    def convert(file, converted, torch_dtype):
        conversions.append(converted)
        replace_directory(converted, save_tiny_checkpoint, {"gguf": str(file), "dtype": str(torch_dtype)})

    monkeypatch.setattr(gguf_conversion, "convert_gguf", convert)
    source = tmp_path / "tiny.gguf"
    source.write_bytes(b"GGUF")

    def load():
        return gguf.load_gguf("tiny-gguf", str(source), device="cpu", prompt_format="plain", cache_dir=str(tmp_path))

    first = load()
    weights = {name: tensor.clone() for name, tensor in first.weights.module.state_dict().items()}
    [copy] = conversions
    keeping_size_and_mtime(copy / "model.safetensors", flip_middle_bytes)
    with caplog.at_level(logging.WARNING):
        second = load()
    assert conversions == [copy, copy]
    [warning] = warnings_of(caplog)
    assert "is damaged (model.safetensors is not the file that was written" in warning and "again" in warning
    assert all(torch.equal(tensor, weights[name]) for name, tensor in second.weights.module.state_dict().items())
    assert gguf_conversion.converted_copy_problem(copy) is None


# ---- cached databases ----------------------------------------------------------------------------------------


def _datastore(target, corpus_file, cache):
    datastore = statistics_datastore(target, "auto", str(corpus_file))
    return (datastore.tokens.tolist(), datastore.suffixes.tolist()), published(cache / "datastores")


def _automaton(target, corpus_file, cache):
    automaton = corpus_automaton(target, str(corpus_file))
    return (automaton.link.tolist(), automaton.edge_token.tolist()), published(cache / "sam")


def _model_db(target, corpus_file, cache):
    prompts = corpus_file.with_name("prompts.txt")
    prompts.write_text("Name three colours.\nCount to five.\n")
    database = model_db(target, "auto", 1, 2, 7, {**BUILD, "prompts": str(prompts)})
    return database.table, published(cache / "model_db")


DATABASES = {
    "datastore, suffixes.npy": (_datastore, "suffixes.npy"),
    "datastore, tokens.npy": (_datastore, "tokens.npy"),
    "automaton, link.npy": (_automaton, "link.npy"),
    "automaton, edge_token.npy": (_automaton, "edge_token.npy"),
    "model database, ngrams.npz": (_model_db, "ngrams.npz"),
}


@pytest.mark.parametrize("database, file", DATABASES.values(), ids=DATABASES.keys())
def test_a_cached_database_damaged_in_place_is_rebuilt_with_one_warning(tiny, cache, corpus_file, caplog, database,
                                                                       file):
    content, directory = database(tiny, corpus_file, cache)
    damage = flip_middle_bytes if file.endswith(".npz") else swap_middle_values
    keeping_size_and_mtime(directory / file, damage)
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        healed, again = database(tiny, corpus_file, cache)
    [warning] = warnings_of(caplog)
    assert f"{file} is not the file that was written" in warning and "rebuilt" in warning
    assert again == directory and healed == content


def test_a_datastore_given_by_path_damaged_in_place_is_one_line_naming_file_and_command(tiny, cache, corpus_file,
                                                                                      tmp_path):
    from specbench.artefacts.statistics_datastore import build_datastore

    directory = tmp_path / "ds"
    build_datastore(tiny, str(corpus_file), directory, cache)
    keeping_size_and_mtime(directory / "suffixes.npy", swap_middle_values)
    with pytest.raises(SpecbenchError) as caught:
        statistics_datastore(tiny, str(directory))
    message = str(caught.value)
    assert "\n" not in message and message.startswith(f"{directory}: damaged datastore (suffixes.npy is not the file")
    command = re.search(r"`([^`]+)`", message).group(1)
    assert command == (f"python scripts/build_datastore.py --model tiny-random --corpus {corpus_file} "
                       f"--out {directory}")


def test_a_copied_cache_still_loads_and_is_checked(tiny, cache, corpus_file, tmp_path):
    """A copy (new change times) cannot be trusted by its times: it is hashed, passes, and is still caught
    when damaged in place."""
    import shutil

    fresh = statistics_datastore(tiny, "auto", str(corpus_file))
    copy = tmp_path / "copy"
    shutil.copytree(published(cache / "datastores"), copy)  # copy2: the modification times travel, ctimes do not
    manifest = json.loads((copy / "manifest.json").read_text())
    assert (copy / "tokens.npy").stat().st_mtime_ns == manifest["files"]["tokens.npy"]["mtime_ns"]
    assert statistics_datastore(tiny, str(copy)).tokens.tolist() == fresh.tokens.tolist()
    keeping_size_and_mtime(copy / "tokens.npy", swap_middle_values)
    with pytest.raises(SpecbenchError, match="tokens.npy is not the file that was written"):
        statistics_datastore(tiny, str(copy))
