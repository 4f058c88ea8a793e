"""The one-line errors of every entry point and script (reporting.reporting_user_errors): a user's error inside a
library (a config the composer cannot find, a path through a file, a full disk) is one line and exit 2 from any
script, a bug keeps its traceback. The other subjects once here have files of their own: test_settings.py,
test_questions.py, test_hub.py, test_devices.py, test_config_keys.py, test_setup.py."""

import errno
import io
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from specbench.config import compose
from specbench.errors import SpecbenchError

REPO = Path(__file__).resolve().parent.parent


# Every entry point and script: the errors a user causes beyond specbench's own are one line and exit 2 too.

ENTRY_POINTS = {**{path.stem: path for path in sorted((REPO / "scripts").glob("*.py"))},
                "prepare": REPO / "specbench" / "prepare.py", "analysis": REPO / "analysis" / "__main__.py"}


def test_every_script_and_entry_point_wraps_its_main_in_the_one_line_errors():
    """A script whose main is not wrapped turns only the SpecbenchErrors it catches into one line: a config the
    composer cannot find, a cache path through a file or a full disk inside a library's save were tracebacks."""
    import ast

    assert {"build_datastore", "gpu_check", "train_head", "prepare", "analysis"} <= set(ENTRY_POINTS)
    for program, path in ENTRY_POINTS.items():
        tree = ast.parse(path.read_text())
        block = [node for node in tree.body if isinstance(node, ast.If)
                 and ast.unparse(node.test) == "__name__ == '__main__'"][-1]  # the one at the end, that runs main
        wrapped = [call for call in ast.walk(block.body[-1]) if isinstance(call, ast.Call)
                   and ast.unparse(call.func) == "reporting_user_errors"]
        assert [ast.unparse(call) for call in wrapped] == [f"reporting_user_errors('{program}', main)"], path
    # python -m specbench reports through the same lines (its cli catches Hydra's errors before its task starts).
    main_source = (REPO / "specbench" / "__main__.py").read_text()
    assert "config_error_line(error)" in main_source and "user_error_line(error)" in main_source


class FullDisk(io.RawIOBase):
    """A file on a disk that fills up: its first two writes fit, every later one is refused with ENOSPC (torch's
    stream writer then raises a RuntimeError of its own while handling that OSError)."""

    def __init__(self):
        super().__init__()
        self.writes = 0

    def writable(self):
        return True

    def write(self, data):
        self.writes += 1
        if self.writes > 2:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return len(data)


@pytest.mark.parametrize("cause, expected", [
    ("config", "model=nope: no such config in conf/model/; choose one of llama2-13b-chat, "),
    ("cache-file", "a part of the path is a file, not a folder (ENOTDIR)"),
    ("cache-is-file", "a file is in the way (EEXIST)"),
    ("torch-full-disk", "the disk is full (ENOSPC)"),
])
def test_a_users_error_inside_a_library_is_one_line_and_exit_2(tmp_path, capsys, cause, expected):
    import torch

    from specbench.reporting import reporting_user_errors

    cache = tmp_path / "cache"
    cache.write_text("")

    def main():
        if cause == "config":
            compose(["model=nope"])
        elif cause == "cache-file":
            (cache / "models").mkdir(parents=True, exist_ok=True)
        elif cause == "cache-is-file":
            cache.mkdir(parents=True, exist_ok=True)
        else:  # torch's stream writer reports the refused write as a RuntimeError raised while handling it
            torch.save({"weights": torch.zeros(1000)}, FullDisk())

    with pytest.raises(SystemExit) as ended:
        reporting_user_errors("demo", main)()
    assert ended.value.code == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith("demo: error: ") and expected in line, line
    if cause.startswith("cache"):
        assert str(cache) in line


def test_a_bug_keeps_its_traceback_through_the_one_line_errors():
    from specbench.reporting import reporting_user_errors

    def main():
        raise KeyError("a bug")

    with pytest.raises(KeyError):
        reporting_user_errors("demo", main)()


def one_line_exit_2(result: subprocess.CompletedProcess, program: str) -> str:
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    line = result.stderr.strip().splitlines()[-1]
    assert line.startswith(f"{program}: error: "), result.stderr
    return line


def test_a_config_the_composer_cannot_find_is_one_line_from_a_script(tmp_path):
    result = subprocess.run([sys.executable, str(REPO / "scripts" / "build_datastore.py"), "--model", "nope",
                             "--out", str(tmp_path / "store")], capture_output=True, text=True, timeout=300)
    line = one_line_exit_2(result, "build_datastore")
    assert "model=nope: no such config in conf/model/; choose one of " in line and ", tiny-random, " in line


def test_an_output_path_through_a_file_is_one_line_before_the_build(tmp_path):
    """prune_draft found --out under a file only when it saved the draft, after minutes of distillation."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    result = subprocess.run([sys.executable, str(REPO / "scripts" / "prune_draft.py"), "--model", "tiny-random",
                             "--layers", "1", "--out", str(blocker / "draft")],
                            capture_output=True, text=True, timeout=120)
    line = one_line_exit_2(result, "prune_draft")
    assert f"cannot build {blocker / 'draft'}: {blocker} is not a writable directory; choose another --out" in line


def _can_mount_a_small_disk() -> bool:
    """A mount namespace of one's own (``unshare -rm``), where a tiny tmpfs stands for a full disk."""
    if shutil.which("unshare") is None:
        return False
    return subprocess.run(["unshare", "-rm", "true"], capture_output=True, timeout=30).returncode == 0


@pytest.mark.skipif(not _can_mount_a_small_disk(), reason="no mount namespace here (unshare -rm) for a full disk")
def test_a_full_disk_is_one_line_from_a_script(tmp_path):
    """compare_spec_bench writes copies of the answers for speed.py into the temporary folder: a full one was a
    traceback (it turned only specbench's own errors into a line)."""
    from test_analysis import synthetic_run

    run = synthetic_run(tmp_path / "run", "pld", accepted=2, verify_tokens=(3,), tasks=("qa",) * 20)
    assert (run / "answers.jsonl").stat().st_size > 4096  # more than the one page the disk has left
    checkout = tmp_path / "spec-bench"
    (checkout / "evaluation").mkdir(parents=True)
    (checkout / "evaluation" / "speed.py").write_text("")
    full = tmp_path / "full"
    full.mkdir()
    # Two pages, one filled: tempfile's check that TMPDIR takes a file (a few bytes, removed again) passes, and
    # the copy of the answers does not fit.
    script = (f"mount -t tmpfs -o size=8k none {full} && dd if=/dev/zero of={full}/fill bs=4k count=1 2>/dev/null "
              f"&& TMPDIR={full} exec {sys.executable} {REPO / 'scripts' / 'compare_spec_bench.py'} "
              f"{run} --spec-bench {checkout} --tokenizer none")
    result = subprocess.run(["unshare", "-rm", "sh", "-c", script], capture_output=True, text=True, timeout=300)
    line = one_line_exit_2(result, "compare_spec_bench")
    assert f"cannot write {full}/" in line and "the disk is full (ENOSPC)" in line, line


def test_a_full_disk_while_torch_saves_a_training_checkpoint_is_one_line_naming_it(tmp_path, monkeypatch):
    """torch.save to a path reports a full disk as a RuntimeError without an errno, which the checkpoint's
    ``except OSError`` let through as a traceback; saved through a file object, the OSError is in its context."""
    import builtins

    import torch

    from specbench.training import heads as eagle_training

    def opening(path, mode="r", *args, **kwargs):
        return FullDisk() if "w" in mode else builtins.open(path, mode, *args, **kwargs)

    monkeypatch.setattr(eagle_training, "open", opening, raising=False)  # the module's open: a disk that fills up
    head = torch.nn.Linear(4, 4)
    optimizer = torch.optim.AdamW(head.parameters())
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    staging = tmp_path / "staging"
    with pytest.raises(SpecbenchError) as refused:
        eagle_training._save_checkpoint(staging, {"kind": "eagle3"}, head, optimizer, schedule, 1, [0.5], 1.0)
    checkpoint = staging / eagle_training.CHECKPOINT
    assert str(refused.value).startswith(f"cannot write {checkpoint}: the disk is full (ENOSPC)")
    assert list(staging.iterdir()) == []  # the partial file is removed
