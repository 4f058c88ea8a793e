"""Cached artefacts across processes and hosts: one process builds while the others wait and then load what it built,
a lock left by a dead or vanished builder is taken over, and a reader of the version a rebuild replaces keeps a
complete directory."""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from specbench.artefacts.base import load_or_rebuild
from specbench.storage.atomic import unique_suffix
from specbench.storage.cache import versions_dir
from specbench.storage.locks import FileLock
from specbench.storage.manifest import read_manifest, verify_files
from specbench.storage.publish import replace_directory
from specbench.errors import SpecbenchError

ROOT = Path(__file__).resolve().parents[1]

# Two of these start at once. The build waits until both have started and then a little more, so the second is
# at the lock while the first builds; without the lock both would build (two lines in the log).
BUILDER = r"""
import os, sys, time
from pathlib import Path
from specbench.artefacts.base import load_or_rebuild
from specbench.storage.manifest import read_manifest, verify_files
from specbench.storage.publish import replace_directory
from specbench.errors import SpecbenchError

directory, builds, started = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
(started / str(os.getpid())).touch()

def load():
    manifest = read_manifest(directory, "test artefact", "rebuild it")
    problem = verify_files(directory, manifest)
    if problem:
        raise SpecbenchError(problem)
    return (directory / "data.txt").read_text()

def build():
    deadline = time.monotonic() + 10
    while len(list(started.iterdir())) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.3)
    with open(builds, "a") as handle:
        handle.write(f"{os.getpid()}\n")
    replace_directory(directory, lambda staging: (staging / "data.txt").write_text("built by " + str(os.getpid())), {})

print(load_or_rebuild(directory, "test artefact", load, build))
"""


def writer(text: str, size: int = 1000):
    def write(staging: Path) -> None:
        (staging / "data.txt").write_text(text)
        (staging / "weights.npy").write_bytes(text.encode()[:1] * size)
    return write


def loader(directory: Path):
    def load() -> str:
        manifest = read_manifest(directory, "test artefact", "rebuild it")
        problem = verify_files(directory, manifest)
        if problem:
            raise SpecbenchError(f"{directory}: damaged test artefact ({problem})")
        return (directory / "data.txt").read_text()
    return load


def dead_pid() -> int:
    """The pid of a process of this host that has exited (and been reaped)."""
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


def write_lock(path: Path, pid: int, host: str, age_s: float = 0.0) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"pid": pid, "host": host, "started": "2026-01-01T00:00:00+00:00", "token": "t"}))
    if age_s:
        then = time.time() - age_s
        os.utime(path, (then, then))


# ---- one build, many processes --------------------------------------------------------------------------------


def test_two_processes_building_one_artefact_build_it_once_and_both_load_it(tmp_path):
    directory, builds, started = tmp_path / "cache" / "db", tmp_path / "builds.log", tmp_path / "started"
    started.mkdir()
    processes = [subprocess.Popen([sys.executable, "-c", BUILDER, str(directory), str(builds), str(started)],
                                  cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for _ in range(2)]
    outputs = [process.communicate(timeout=60) for process in processes]
    assert [process.returncode for process in processes] == [0, 0], [error for _, error in outputs]
    [builder] = builds.read_text().split()  # built once
    assert [out.strip() for out, _ in outputs] == [f"built by {builder}"] * 2
    assert loader(directory)() == f"built by {builder}"
    assert not (versions_dir(directory) / "build.lock").exists()


def test_staging_names_differ_per_process_and_call_and_name_the_host():
    first, second = unique_suffix(), unique_suffix()
    assert first != second
    pid, _, host = first.split("-", 2)
    assert (int(pid), host) == (os.getpid(), socket.gethostname())


# ---- readers never see a half-replaced directory --------------------------------------------------------------


def test_a_reader_of_the_replaced_version_keeps_a_complete_directory(tmp_path):
    directory = tmp_path / "db"
    replace_directory(directory, writer("first"), {"build": 1})
    first = directory.resolve()
    opened = open(directory / "weights.npy", "rb")  # a reader part-way through the first version
    try:
        replace_directory(directory, writer("second", 2000), {"build": 2})
        assert loader(directory)() == "second" and (directory / "weights.npy").stat().st_size == 2000
        assert first != directory.resolve() and first.parent == versions_dir(directory)
        assert verify_files(first, read_manifest(first, "test artefact", "")) is None  # whole, as it was written
        assert (first / "data.txt").read_text() == "first" and opened.read() == b"f" * 1000
    finally:
        opened.close()
    second = directory.resolve()
    replace_directory(directory, writer("third"), {"build": 3})
    # the version the third one replaced is kept for its readers; the one before is removed
    assert sorted(path.name for path in versions_dir(directory).iterdir() if path.is_dir()) == sorted(
        [second.name, directory.resolve().name])
    assert not first.exists() and loader(directory)() == "third"


def test_the_same_content_published_twice_is_one_version_and_an_interrupted_build_leaves_none(tmp_path):
    directory = tmp_path / "db"
    replace_directory(directory, writer("same"), {"build": 1})
    version = directory.resolve()
    replace_directory(directory, writer("same"), {"build": 1})
    assert directory.resolve() == version
    assert [path.name for path in versions_dir(directory).iterdir() if path.is_dir()] == [version.name]

    def interrupted(staging: Path) -> None:
        writer("other")(staging)
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        replace_directory(directory, interrupted, {"build": 2})
    assert directory.resolve() == version and loader(directory)() == "same"
    assert [path.name for path in versions_dir(directory).iterdir() if path.is_dir()] == [version.name]


def test_a_directory_written_before_versions_is_replaced_and_kept_for_its_readers(tmp_path):
    directory = tmp_path / "db"
    directory.mkdir()
    (directory / "tokens.npy").write_bytes(b"old layout")
    opened = open(directory / "tokens.npy", "rb")
    try:
        replace_directory(directory, writer("new"), {})
        assert directory.is_symlink() and loader(directory)() == "new"
        [moved] = [path for path in versions_dir(directory).iterdir() if path.name.startswith("unversioned-")]
        assert (moved / "tokens.npy").read_bytes() == b"old layout" and opened.read() == b"old layout"
    finally:
        opened.close()
    other = tmp_path / "notes"
    other.mkdir()
    (other / "todo.txt").write_text("mine")
    with pytest.raises(SpecbenchError, match="holds no database"):
        replace_directory(other, writer("new"), {})
    assert (other / "todo.txt").read_text() == "mine"


# ---- locks left behind ----------------------------------------------------------------------------------------


def test_a_build_lock_left_by_a_dead_process_of_this_host_is_taken_over(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("SPECBENCH_LOCK_WAIT_S", "30")  # not taken over: the test would wait, then fail
    directory = tmp_path / "db"
    pid = dead_pid()
    write_lock(versions_dir(directory) / "build.lock", pid, socket.gethostname())
    started = time.monotonic()
    with caplog.at_level(logging.WARNING):
        result = load_or_rebuild(directory, "test artefact", loader(directory),
                                 lambda: replace_directory(directory, writer("built"), {}))
    # Taken over at once, not after the 30 s wait: half the wait tells the two apart on however slow a machine.
    assert result == "built" and time.monotonic() - started < 15
    assert f"holder is no longer running (pid {pid} on {socket.gethostname()}" in caplog.text
    assert not (versions_dir(directory) / "build.lock").exists()


def test_a_build_lock_not_refreshed_for_the_stale_age_is_taken_over_from_another_host(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("SPECBENCH_LOCK_WAIT_S", "30")
    monkeypatch.setenv("SPECBENCH_LOCK_STALE_S", "60")
    directory = tmp_path / "db"
    write_lock(versions_dir(directory) / "build.lock", 4242, "node-17.cluster", age_s=3600)
    with caplog.at_level(logging.WARNING):
        assert load_or_rebuild(directory, "test artefact", loader(directory),
                               lambda: replace_directory(directory, writer("built"), {})) == "built"
    assert "has not refreshed it for 3600 s (pid 4242 on node-17.cluster" in caplog.text


def test_a_live_build_lock_on_another_host_stops_the_waiter_in_one_line_naming_it(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECBENCH_LOCK_WAIT_S", "0.3")
    directory = tmp_path / "db"
    lock = versions_dir(directory) / "build.lock"
    write_lock(lock, 4242, "node-17.cluster")
    built = []

    def build():
        built.append(True)
        replace_directory(directory, writer("built"), {})

    with pytest.raises(SpecbenchError) as refused:
        load_or_rebuild(directory, "test artefact", loader(directory), build)
    message = str(refused.value)
    assert "\n" not in message and built == []
    assert "still being built after 0.3 s" in message and "pid 4242 on node-17.cluster" in message
    assert message.endswith(f"if that process is no longer running, remove {lock}")
    lock.unlink()  # what the message says to do
    assert load_or_rebuild(directory, "test artefact", loader(directory), build) == "built" and built == [True]


def test_a_held_lock_is_refreshed_so_a_waiter_never_takes_it_over(tmp_path):
    path = tmp_path / "build.lock"
    with FileLock(path, stale_after_s=0.6) as held:
        waiter = FileLock(path, wait_s=1.2, stale_after_s=0.6)
        assert not waiter.acquire()  # without the refresh it would be taken over after 0.6 s
        assert waiter.holder == held.holder and waiter.holder["pid"] == os.getpid()
    assert not path.exists()
    assert waiter.acquire()
    waiter.release()
    assert not path.exists()


def test_a_waiter_removes_only_the_stale_lock_it_judged(tmp_path):
    """Two waiters judge one lock stale; the first removes it and creates its own. The second must not then
    remove the first's lock."""
    path = tmp_path / "build.lock"
    write_lock(path, dead_pid(), socket.gethostname())
    second = FileLock(path)
    judged = second._read()
    first = FileLock(path)
    assert first.acquire()  # took the stale lock over
    assert not second._take_over(judged)
    assert json.loads(path.read_text()) == first.holder
    first.release()
    assert not path.exists()


def test_a_bad_lock_setting_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECBENCH_LOCK_WAIT_S", "soon")
    directory = tmp_path / "db"
    with pytest.raises(SpecbenchError, match=r"^SPECBENCH_LOCK_WAIT_S='soon': expected a number of seconds"):
        load_or_rebuild(directory, "test artefact", loader(directory), lambda: None)
