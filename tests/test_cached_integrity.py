"""Damage that keeps a file's size and modification time is caught in cached pruned drafts and target answers
(their files' checksums, storage.manifest.verify_files), and a write the filesystem refuses is one line naming the file,
leaving no half-written rows for a resumed generation to trust."""

from __future__ import annotations

import errno
import json
import logging
import os
from pathlib import Path

import pytest
import torch
from conftest import warnings_of

import specbench.artefacts.target_answers as answers_module
from specbench.artefacts.pruned_draft import pruned_draft_directory
from specbench.drafters.draft_model import DraftModel
from specbench.errors import SpecbenchError
from specbench.artefacts.pruned_draft import build_pruned_draft
from specbench.targets.transformers import prune
from specbench.artefacts.target_answers import target_answers
from specbench.testing import PROMPTS

SPEC = {"layers": 1, "selection": "first", "distill_tokens": 0, "corpus": "python-docs"}


def overwrite_keeping_size_and_mtime(file: Path, change) -> None:
    """Rewrite bytes in the middle of ``file`` with ``change(data, middle)`` (same length), then set its
    modification time back, as a careless copy or a bit flip would leave it."""
    stat = file.stat()
    data = bytearray(file.read_bytes())
    change(data, len(data) // 2)
    file.write_bytes(bytes(data))
    os.utime(file, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert file.stat().st_size == stat.st_size and file.stat().st_mtime_ns == stat.st_mtime_ns


def flip_bytes(data: bytearray, middle: int) -> None:
    for index in range(middle, middle + 16):
        data[index] ^= 0xFF


def change_a_digit(data: bytearray, middle: int) -> None:
    """Another digit (never 0, so no leading zero): the line stays valid JSON of valid token ids."""
    index = next(i for i in range(middle, len(data)) if chr(data[i]).isdigit())
    data[index] = ord(str(int(chr(data[index])) % 9 + 1))


def same_weights(model, reference) -> bool:
    state = reference.state_dict()
    return all(torch.equal(tensor, state[name]) for name, tensor in model.state_dict().items())


# ---- pruned drafts -----------------------------------------------------------------------------------------


def test_a_cached_pruned_draft_damaged_in_place_is_rebuilt_with_a_warning(tiny, tmp_path, caplog):
    drafter = DraftModel(drafts_by_family={"tiny-random": {"pruned": SPEC}}, cache_dir=str(tmp_path))
    drafter.prepare(tiny)
    reference = prune(tiny.weights.module, [0])
    assert same_weights(drafter.draft, reference)
    weights = pruned_draft_directory(tiny, SPEC, str(tmp_path)) / "model.safetensors"
    overwrite_keeping_size_and_mtime(weights, flip_bytes)

    caplog.clear()
    with caplog.at_level(logging.WARNING):
        drafter.prepare(tiny)
    [warning] = warnings_of(caplog)
    assert "damaged" in warning and "model.safetensors" in warning
    assert same_weights(drafter.draft, reference)  # the rebuilt draft, not the damaged weights


def test_a_damaged_pruned_draft_at_a_given_path_is_one_line_naming_the_file_and_the_fix(tiny, tmp_path):
    path = tmp_path / "my-draft"
    build_pruned_draft(tiny, path, SPEC["layers"], SPEC["selection"], 0, SPEC["corpus"])
    drafter = DraftModel(drafts_by_family={"tiny-random": {"path": str(path), "pruned": SPEC}})
    drafter.prepare(tiny)  # whole: it loads
    overwrite_keeping_size_and_mtime(path / "model.safetensors", flip_bytes)

    with pytest.raises(SpecbenchError) as caught:
        drafter.prepare(tiny)
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(f"{path}: damaged pruned draft (model.safetensors is not the file that was written")
    assert f"scripts/prune_draft.py --model tiny-random --layers 1 --selection first --distill-tokens 0 " \
           f"--corpus python-docs --out {path}" in message
    assert path.is_dir()  # the user's directory is left as it is


# ---- target answers -----------------------------------------------------------------------------------------


def answer_file(cache: Path) -> Path:
    """The one answers file the cache holds (a published version's, or a plain .jsonl file)."""
    [file] = {path.resolve() for path in (cache / "answers").rglob("*.jsonl") if path.is_file()}
    return file


def test_cached_answers_damaged_in_place_are_generated_again(tiny, tmp_path, caplog):
    prompts = PROMPTS[:2]
    first = target_answers(tiny, prompts, max_new_tokens=6, batch_size=2, cache_dir=str(tmp_path))
    overwrite_keeping_size_and_mtime(answer_file(tmp_path), change_a_digit)

    caplog.clear()
    with caplog.at_level(logging.WARNING):
        again = target_answers(tiny, prompts, max_new_tokens=6, batch_size=2, cache_dir=str(tmp_path))
    assert again == first
    [warning] = warnings_of(caplog)
    assert "damaged" in warning and "answers.jsonl" in warning and "again" in warning


def answer_one_by_one(tiny, cache: Path):
    """The tiny target's answers to PROMPTS, one prompt per batch (so a staging file holds one row per batch)."""
    return target_answers(tiny, PROMPTS, max_new_tokens=5, batch_size=1, cache_dir=str(cache))


def test_a_refused_write_is_one_line_and_leaves_only_whole_rows_to_resume_from(tiny, tmp_path, monkeypatch):
    clean = answer_one_by_one(tiny, tmp_path / "clean")
    cache = tmp_path / "full"
    real_write = os.write
    staged = []

    def full_disk(fd, data):  # the staging file's second batch: half of it is written, then the disk is full
        if os.readlink(f"/proc/self/fd/{fd}").endswith(".partial"):
            staged.append(data)
            if len(staged) == 2:
                real_write(fd, data[: len(data) // 2])
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", full_disk)
    with pytest.raises(SpecbenchError) as caught:
        answer_one_by_one(tiny, cache)
    monkeypatch.setattr(os, "write", real_write)
    message = str(caught.value)
    [partial] = (cache / "answers").glob("*.partial")
    assert "\n" not in message and message.startswith(f"cannot write {partial}: the disk is full (ENOSPC)")
    assert not list((cache / "answers").rglob("manifest.json"))  # nothing published
    assert partial.read_bytes() == staged[0]  # the first batch, whole; nothing of the second
    assert [json.loads(line)["answer_ids"] for line in partial.read_text().splitlines()] == [clean[0][1]]

    resumed_from = []
    generate = answers_module.generate_answers

    def recording(*args, done=0, **kwargs):
        resumed_from.append(done)
        return generate(*args, done=done, **kwargs)

    monkeypatch.setattr(answers_module, "generate_answers", recording)
    assert answer_one_by_one(tiny, cache) == clean
    assert resumed_from == [1] and not partial.exists()


def test_a_half_written_or_damaged_staging_tail_is_not_trusted(tiny, tmp_path, monkeypatch):
    clean = answer_one_by_one(tiny, tmp_path / "clean")
    cache = tmp_path / "cache"
    generate = answers_module.generate_answers
    resumed_from = []

    def interrupted_after_one_batch(*args, on_batch=None, done=0, **kwargs):
        resumed_from.append(done)
        if len(resumed_from) == 1:
            on_batch([clean[0]])
            raise KeyboardInterrupt
        return generate(*args, on_batch=on_batch, done=done, **kwargs)

    monkeypatch.setattr(answers_module, "generate_answers", interrupted_after_one_batch)
    with pytest.raises(KeyboardInterrupt):
        answer_one_by_one(tiny, cache)
    [partial] = (cache / "answers").glob("*.partial")
    with partial.open("ab") as handle:  # a whole line of invalid ids, then half a line
        handle.write(b'{"prompt_ids": [1], "answer_ids": [-3]}\n{"prompt_ids": [1, 2')
    assert answer_one_by_one(tiny, cache) == clean
    assert resumed_from == [0, 1] and not partial.exists()


def test_an_answers_file_of_an_earlier_version_is_taken_over_without_generating(tiny, tmp_path, monkeypatch):
    prompts = PROMPTS[:2]
    first = target_answers(tiny, prompts, max_new_tokens=6, batch_size=2, cache_dir=str(tmp_path))
    published = next(path for path in (tmp_path / "answers").iterdir() if path.is_symlink())
    earlier = published.with_name(published.name + ".jsonl")  # where earlier versions kept it, without a checksum
    earlier.write_bytes((published / "answers.jsonl").read_bytes())
    published.unlink()

    def nothing_left(target, prompts, *args, done=0, **kwargs):
        assert done == len(prompts), "answers were generated again instead of taken over"
        return []

    monkeypatch.setattr(answers_module, "generate_answers", nothing_left)
    assert target_answers(tiny, prompts, max_new_tokens=6, batch_size=2, cache_dir=str(tmp_path)) == first
    assert (published / "manifest.json").is_file() and not earlier.exists()
