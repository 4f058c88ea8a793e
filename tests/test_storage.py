"""Every way a filesystem refuses a write (read-only, full, over quota; safetensors' own error for a full disk) is
one line naming the path, and leaves nothing half-written that a later read would trust: the run lock, artefact
locks, staging and publishing of cached artefacts, the model conversion, the Hydra files of a run, and, as a last
resort, any write refused where no code expected it (exit 2, where a bug keeps its traceback, exit 1)."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import one_line
from safetensors import SafetensorError

from specbench.storage import run_lock as runlock
from specbench.artefacts.base import load_or_rebuild
from specbench.storage.cache import versions_dir
from specbench.storage.locks import FileLock
from specbench.storage.manifest import read_manifest, verify_files
from specbench.storage.publish import replace_directory
from specbench.config import compose
from specbench.errors import SpecbenchError
from specbench.storage.run_lock import LOCK_NAME, RunLock

ROOT = Path(__file__).resolve().parents[1]
TINY = ["model=tiny-random", "run.max_new_tokens=8", "task.tasks=[qa]", "task.limit_per_task=1", "run.warmup_runs=0"]
LOCATIONS = "(hydra.run.dir, hydra.sweep.dir, model.cache_dir or $SPECBENCH_CACHE)"


def hint(reason: str) -> str:
    """What the one line advises after ``reason`` (which ends with the errno's name in parentheses)."""
    full = any(name in reason for name in ("ENOSPC", "EDQUOT"))
    return f"{'free space or choose another location' if full else 'choose a writable location'} {LOCATIONS}"
FULL_SAFETENSORS = "Error while serializing: I/O error: No space left on device (os error 28)"


def refused(code: int, path=None) -> OSError:
    return OSError(code, os.strerror(code), None if path is None else str(path))


def listing(directory: Path) -> list[str]:
    return sorted(str(path.relative_to(directory)) for path in directory.rglob("*"))


# ---- the run lock ----------------------------------------------------------------------------------------------


def test_a_read_only_filesystem_under_an_existing_run_directory_is_one_line(tmp_path, monkeypatch):
    """EROFS from opening the lock file was a traceback: only PermissionError was caught."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "answers.jsonl").write_text("")
    real_open = open

    def read_only(path, *args, **kwargs):
        if str(path).endswith(LOCK_NAME):
            raise refused(errno.EROFS, path)
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(runlock, "open", read_only, raising=False)
    before = listing(run)
    with pytest.raises(SpecbenchError) as caught:
        RunLock(run).acquire()
    assert one_line(caught) == f"cannot lock {run / LOCK_NAME}: the filesystem is read-only (EROFS); {hint('EROFS')}"
    assert listing(run) == before

    from specbench.runner import run_benchmark

    with pytest.raises(SpecbenchError, match=rf"^cannot lock {run / LOCK_NAME}: the filesystem is read-only"):
        run_benchmark(compose(TINY), str(run))
    assert listing(run) == before


class _FullDisk:
    """A file whose writes fail as on a full disk; everything else is the real file's."""

    def __init__(self, handle):
        self._handle = handle

    def write(self, text):
        raise refused(errno.ENOSPC)

    def __getattr__(self, name):
        return getattr(self._handle, name)


def test_a_full_disk_when_the_run_lock_names_its_holder_is_one_line_and_leaves_nothing(tmp_path, monkeypatch):
    real_open = open
    monkeypatch.setattr(runlock, "open", lambda path, *a, **k: _FullDisk(real_open(path, *a, **k)), raising=False)
    run = tmp_path / "new" / "run"
    with pytest.raises(SpecbenchError) as caught:
        RunLock(run).acquire()
    assert one_line(caught) == f"cannot lock {run / LOCK_NAME}: the disk is full (ENOSPC); {hint('ENOSPC')}"
    assert not run.exists()  # the directory and lock file it created are removed again


def test_a_run_directory_that_cannot_be_created_is_one_line(tmp_path, monkeypatch):
    def read_only(self, *args, **kwargs):
        raise refused(errno.EROFS, self)

    monkeypatch.setattr(Path, "mkdir", read_only)
    with pytest.raises(SpecbenchError) as caught:
        RunLock(tmp_path / "run").acquire()
    assert one_line(caught).startswith(f"cannot create {tmp_path / 'run'}: the filesystem is read-only (EROFS)")


# ---- artefact locks --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("code", [errno.EROFS, errno.ENOSPC, errno.EDQUOT], ids=["EROFS", "ENOSPC", "EDQUOT"])
def test_a_lock_file_the_filesystem_refuses_is_one_line_naming_it(tmp_path, monkeypatch, code):
    real_open = os.open

    def refusing(path, *args, **kwargs):
        if str(path).endswith(".lock"):
            raise refused(code, path)
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", refusing)
    lock = tmp_path / "build.lock"
    with pytest.raises(SpecbenchError) as caught:
        FileLock(lock).acquire()
    assert one_line(caught).startswith(f"cannot lock {lock}: ")
    assert f"({errno.errorcode[code]})" in str(caught.value)

    directory = tmp_path / "db"
    with pytest.raises(SpecbenchError) as caught:
        load_or_rebuild(directory, "test artefact", lambda: pytest.fail("nothing to load"), lambda: None)
    assert one_line(caught).startswith(f"cannot lock {versions_dir(directory) / 'build.lock'}: ")


def test_a_full_disk_writing_a_lock_file_removes_it(tmp_path, monkeypatch):
    real_open, real_write = os.open, os.write
    lock_fds = set()

    def opening(path, *args, **kwargs):
        fd = real_open(path, *args, **kwargs)
        if str(path).endswith(".lock"):
            lock_fds.add(fd)
        return fd

    def writing(fd, data):
        if fd in lock_fds:
            raise refused(errno.ENOSPC)
        return real_write(fd, data)

    monkeypatch.setattr(os, "open", opening)
    monkeypatch.setattr(os, "write", writing)
    lock = tmp_path / "build.lock"
    with pytest.raises(SpecbenchError, match=rf"^cannot lock {lock}: the disk is full \(ENOSPC\)"):
        FileLock(lock).acquire()
    assert not lock.exists()  # an empty lock file would hold the lock with no holder named


# ---- building and publishing a cached artefact -----------------------------------------------------------------


def write_data(text: str):
    def write(staging: Path) -> None:
        (staging / "data.npy").write_text(text)
    return write


def load_data(directory: Path) -> str:
    manifest = read_manifest(directory, "test artefact", "rebuild it")
    problem = verify_files(directory, manifest)
    if problem:
        raise SpecbenchError(problem)
    return (directory / "data.npy").read_text()


WRITE_REFUSALS = {
    "ENOSPC": (refused(errno.ENOSPC), "the disk is full (ENOSPC)"),
    "EDQUOT": (refused(errno.EDQUOT), "the disk quota is used up (EDQUOT)"),
    "EROFS": (refused(errno.EROFS), "the filesystem is read-only (EROFS)"),
    "SafetensorError": (SafetensorError(FULL_SAFETENSORS), "the disk is full (ENOSPC)"),
    # np.save on a full disk (seen on a full tmpfs): an OSError without an errno
    "numpy short write": (OSError("360001 requested and 64480 written"), "the disk is full (ENOSPC)"),
}


@pytest.mark.parametrize("error, reason", WRITE_REFUSALS.values(), ids=WRITE_REFUSALS.keys())
def test_a_write_refused_while_building_is_one_line_and_leaves_the_published_version(tmp_path, error, reason):
    directory = tmp_path / "db"
    replace_directory(directory, write_data("first"), {})
    published = directory.resolve()

    def half_written(staging: Path) -> None:
        (staging / "data.npy").write_text("half")
        raise error

    with pytest.raises(SpecbenchError) as caught:
        replace_directory(directory, half_written, {})
    assert one_line(caught) == f"cannot write {directory}: {reason}; {hint(reason)}"
    assert caught.value.__cause__ is error
    assert [path.name for path in versions_dir(directory).iterdir()] == [published.name]  # no staging left
    assert directory.resolve() == published and load_data(directory) == "first"


def test_a_new_artefact_refused_leaves_no_versions_directory(tmp_path):
    directory = tmp_path / "db"

    def full(staging: Path) -> None:
        (staging / "data.npy").write_text("half")
        raise refused(errno.ENOSPC, staging / "data.npy")

    with pytest.raises(SpecbenchError, match=rf"^cannot write {directory}: the disk is full"):
        load_or_rebuild(directory, "test artefact", lambda: load_data(directory),
                        lambda: replace_directory(directory, full, {}))
    assert listing(tmp_path) == []


def test_a_publish_the_filesystem_refuses_is_one_line_and_keeps_the_old_version(tmp_path, monkeypatch):
    directory = tmp_path / "db"
    replace_directory(directory, write_data("first"), {})
    real_symlink = os.symlink

    def full(source, link, *args, **kwargs):
        if Path(link).parent == versions_dir(directory):
            raise refused(errno.ENOSPC, link)
        return real_symlink(source, link, *args, **kwargs)

    monkeypatch.setattr(os, "symlink", full)
    with pytest.raises(SpecbenchError, match=rf"^cannot write {directory}: the disk is full \(ENOSPC\)"):
        replace_directory(directory, write_data("second"), {})
    assert load_data(directory) == "first"
    assert not [path for path in versions_dir(directory).iterdir() if path.name.startswith((".staging", ".link"))]


def test_a_refused_read_of_another_file_is_not_reported_as_the_artefact(tmp_path):
    """A builder that cannot read its corpus is not a cache that cannot be written: that error stays its own."""
    corpus = tmp_path / "corpus.txt"
    error = refused(errno.EACCES, corpus)

    def unreadable(staging: Path) -> None:
        raise error

    with pytest.raises(OSError) as caught:
        replace_directory(tmp_path / "db", unreadable, {})
    assert caught.value is error


# ---- the model conversion --------------------------------------------------------------------------------------


def test_a_full_disk_during_the_conversion_is_one_line_and_leaves_no_copy(tmp_path, monkeypatch):
    """safetensors reports a full disk as SafetensorError, which was a traceback after the conversion's work."""
    import torch
    import transformers
    import transformers.modeling_utils

    from specbench.artefacts.gguf_conversion import convert_gguf, converted_copy_problem

    config = transformers.LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                      num_attention_heads=2, num_key_value_heads=1)
    model = transformers.LlamaForCausalLM(config)
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=_word_tokenizer())
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", lambda *a, **k: model)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", lambda *a, **k: tokenizer)

    def full(*args, **kwargs):
        raise SafetensorError(FULL_SAFETENSORS)

    monkeypatch.setattr(transformers.modeling_utils, "safe_save_file", full)
    converted = tmp_path / "models" / "tiny-float32-key"
    with pytest.raises(SpecbenchError) as caught:
        convert_gguf(tmp_path / "tiny.gguf", converted, torch.float32)
    assert one_line(caught) == f"cannot write {converted}: the disk is full (ENOSPC); {hint('ENOSPC')}"
    assert converted_copy_problem(converted) == "missing" and listing(tmp_path / "models") == []


def _word_tokenizer():
    from tokenizers import Tokenizer, models

    return Tokenizer(models.WordLevel({"<unk>": 0, "a": 1}, unk_token="<unk>"))


def test_a_full_hugging_face_cache_while_downloading_is_not_called_offline(tmp_path, monkeypatch):
    import transformers

    from specbench import hub_cache
    from specbench.models import hub

    def load(*args, local_files_only, **kwargs):
        if local_files_only:
            raise OSError("not in the local cache")
        raise refused(errno.ENOSPC, tmp_path / "hub" / "model.safetensors")

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(hub_cache, "hub_reachable", lambda: True)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", load)
    with pytest.raises(SpecbenchError) as caught:
        hub.load_pretrained("tiny-hub", hub_id="specbench-test/tiny", device="cpu")
    assert one_line(caught).startswith(f"cannot write {tmp_path / 'hub' / 'model.safetensors'}: the disk is full")


# ---- the run's Hydra files -------------------------------------------------------------------------------------


def test_hydra_files_a_full_disk_refuses_are_one_line_and_never_half_written(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from omegaconf import OmegaConf

    import specbench.__main__ as entry

    monkeypatch.setattr(entry.HydraConfig, "get", lambda: SimpleNamespace(overrides=SimpleNamespace(task=["a=1"])))
    cfg = OmegaConf.create({"model": "tiny"})
    entry.record_hydra_config(cfg, tmp_path)
    while entry._run_log_handlers:
        entry._run_log_handlers.pop().close()
    whole = (tmp_path / ".hydra" / "overrides.yaml").read_text()
    real_save = OmegaConf.save

    def full(node, path, *args, **kwargs):
        Path(path).write_text("- a=")  # what a full disk leaves of a write
        raise refused(errno.ENOSPC, path)

    monkeypatch.setattr(OmegaConf, "save", full)
    with pytest.raises(SpecbenchError) as caught:
        entry.record_hydra_config(OmegaConf.create({"model": "other"}), tmp_path)
    assert one_line(caught) == f"cannot write {tmp_path / '.hydra' / 'config.yaml'}: the disk is full (ENOSPC); " \
                               f"{hint('ENOSPC')}"
    monkeypatch.setattr(OmegaConf, "save", real_save)
    assert (tmp_path / ".hydra" / "overrides.yaml").read_text() == whole
    assert sorted(path.name for path in (tmp_path / ".hydra").iterdir()) == ["config.yaml", "overrides.yaml"]


# ---- the entry point's last resort -----------------------------------------------------------------------------

# run_benchmark replaced by one that fails as ``error`` does, then the command line as `python -m specbench` has it.
FAILING_RUN = r"""
import errno, os, sys
import specbench.runner
from safetensors import SafetensorError

def fail(*args, **kwargs):
    raise {error}

specbench.runner.run_benchmark = fail
import runpy
sys.argv = ["specbench", *sys.argv[1:]]
runpy.run_module("specbench", run_name="__main__", alter_sys=True)
"""

LAST_RESORT = {
    "ENOSPC": ('OSError(errno.ENOSPC, "No space left on device", "/results/answers.jsonl")', 2,
               "specbench: error: cannot write /results/answers.jsonl: the disk is full (ENOSPC)"),
    "SafetensorError": (f'SafetensorError("{FULL_SAFETENSORS}")', 2,
                        "specbench: error: cannot write a file the error does not name: the disk is full (ENOSPC)"),
    "EIO, a bug": ('OSError(errno.EIO, "Input/output error", "/results/answers.jsonl")', 1, "Traceback"),
}


@pytest.mark.slow  # moved behind slow to keep the default run under 8 minutes on 2 cores (CI runs it)
@pytest.mark.parametrize("error, status, line", LAST_RESORT.values(), ids=LAST_RESORT.keys())
def test_a_write_refused_anywhere_is_exit_2_and_one_line_and_a_bug_keeps_its_traceback(tmp_path, error, status,
                                                                                        line):
    result = subprocess.run([sys.executable, "-c", FAILING_RUN.format(error=error), *TINY,
                             f"hydra.run.dir={tmp_path / 'run'}"], cwd=ROOT, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == status, result.stderr
    if status == 2:
        assert "Traceback" not in result.stderr
        [shown] = [text for text in result.stderr.splitlines() if text.strip()]
        assert shown.startswith(line) and shown.endswith(hint(line))
    else:
        assert line in result.stderr and "OSError: [Errno 5] Input/output error" in result.stderr
