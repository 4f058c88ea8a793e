"""The one atomic write of the package (storage.atomic): a reader sees the old file or the new one, a failed write
leaves nothing behind, and a refusal is one line naming the file wherever the library that wrote reports it."""

from __future__ import annotations

import errno
import os

import pytest

from specbench.errors import SpecbenchError
from specbench.storage.atomic import append_whole, staging_file, write_atomically


def test_a_write_replaces_the_file_whole_and_a_failed_one_leaves_the_old_file_alone(tmp_path):
    path = tmp_path / "summary.json"
    write_atomically(path, lambda staging: staging.write_text("old"))

    def half_then_bug(staging):
        staging.write_text("ne")
        raise ValueError("a bug")

    with pytest.raises(ValueError, match="a bug"):
        write_atomically(path, half_then_bug)
    assert path.read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["summary.json"]


def test_a_refusal_reported_inside_a_library_error_is_one_line_naming_the_file(tmp_path):
    path = tmp_path / "checkpoint.pt"

    def full_disk(staging):
        staging.write_bytes(b"x")
        try:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        except OSError:
            raise RuntimeError("basic_ios::clear: iostream error")  # torch's writer, while handling the OSError

    with pytest.raises(SpecbenchError) as refused:
        write_atomically(path, full_disk)
    assert str(refused.value).startswith(f"cannot write {path}: the disk is full (ENOSPC)")
    assert list(tmp_path.iterdir()) == []


def test_two_writers_of_one_file_never_share_a_staging_file(tmp_path):
    first, second = staging_file(tmp_path / "manifest.json"), staging_file(tmp_path / "manifest.json")
    assert first != second and first.parent == tmp_path and first.name.startswith(".manifest.json.")


def test_an_append_cut_short_by_a_refusal_is_cut_back_to_whole_records(tmp_path, monkeypatch):
    path = tmp_path / "rows.jsonl"
    append_whole(path, b'{"a": 1}\n')
    real_write, calls = os.write, []

    def half_then_full(handle, data):
        calls.append(data)
        if len(calls) == 1:
            return real_write(handle, data[: len(data) // 2])
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "write", half_then_full)
    with pytest.raises(SpecbenchError, match=f"cannot write {path}: the disk is full"):
        append_whole(path, b'{"b": 2}\n', sync=True)
    monkeypatch.undo()
    assert path.read_bytes() == b'{"a": 1}\n'


def test_a_file_written_0600_gets_the_mode_an_ordinary_open_gives(tmp_path):
    """safetensors writes its files 0600: a head in a shared cache would be unreadable to the cluster's other users."""
    import stat

    from specbench.storage.atomic import process_umask

    def secretive(path):
        path.write_bytes(b"weights")
        os.chmod(path, 0o600)

    write_atomically(tmp_path / "model.safetensors", secretive)
    mode = stat.S_IMODE((tmp_path / "model.safetensors").stat().st_mode)
    assert mode == 0o666 & ~process_umask()
    old = os.umask(0o027)
    try:
        assert process_umask() == 0o027
    finally:
        os.umask(old)
