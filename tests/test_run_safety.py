"""Results that cannot silently mix: run.json covers every setting, a run directory holds one run at a time, a
damaged converted model heals, cut lines are dropped, long prompts are skipped, busy machines are flagged."""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import specbench.models.tiny as tiny_module
from specbench.storage.publish import replace_directory
from specbench.config import choose_engine, compose, group_options
from specbench.errors import SpecbenchError
from specbench.measure.machine import ContentionMeter, TimingCheck, is_contended, safe_threads
from specbench.artefacts.gguf_conversion import CHECKSUM_FILE, converted_copy_problem, gguf_digest
from specbench.results.console import format_summary_table
from specbench.results.readers import read_answers, read_run_results
from specbench.storage.run_lock import LOCK_NAME, RunLock
from specbench.run.identity import NOT_RESULT_SETTINGS, REGIME_KEYS, RESULT_GROUPS, config_settings
from specbench.runner import run_benchmark

TINY = ["model=tiny-random", "run.max_new_tokens=8", "task.tasks=[qa]", "task.limit_per_task=1", "run.warmup_runs=0"]


def snapshot(directory: Path) -> dict:
    """Every file under ``directory`` with its bytes and modification time, but the lock file (locking it
    writes the holder into it, and releasing it empties it again)."""
    return {str(path.relative_to(directory)): (path.read_bytes(), path.stat().st_mtime_ns)
            for path in sorted(directory.rglob("*")) if path.is_file() and path.name != LOCK_NAME}


def leaf_keys(node, prefix=""):
    if isinstance(node, dict):
        for key, value in node.items():
            yield from leaf_keys(value, f"{prefix}{key}.")
    else:
        yield prefix[:-1]


# --- run.json covers every setting -------------------------------------------------------------------------

def test_every_key_of_every_config_is_recorded_or_listed_as_not_affecting_results():
    """A key added to any model, drafter, task, run or engine config is recorded in run.json unless
    NOT_RESULT_SETTINGS names it with a reason; so resuming with it changed is refused."""
    from omegaconf import OmegaConf

    from specbench.targets.choice import DEFAULT_NODE

    used_exclusions = set()
    for group in ("model", "drafter", "task"):
        for option in group_options(group):
            cfg = compose([f"{group}={option}"])
            recorded = config_settings(cfg, None)
            node = OmegaConf.to_container(cfg[group], resolve=True)
            for key in node:
                dotted = f"{group}.{key}"
                if dotted in NOT_RESULT_SETTINGS:
                    used_exclusions.add(dotted)
                    assert key not in recorded[RESULT_GROUPS[group]]
                elif dotted == "model.target":  # recorded only when not the transformers target (test_target_choice)
                    assert node[key] == DEFAULT_NODE and key not in recorded["model_config"], option
                else:
                    assert recorded[RESULT_GROUPS[group]][key] == node[key], dotted
    for option in group_options("engine"):  # an engine says which of its settings are no result (its settings')
        cfg = compose([f"engine={option}"])
        engine = choose_engine(cfg)[1]
        recorded = config_settings(cfg, engine.identity())
        node = OmegaConf.to_container(cfg.engine, resolve=True)
        if node["name"] == "specbench":  # the specbench loop records no "engine": older run.json files match it
            assert "engine" not in recorded
            continue
        assert set(engine.NOT_RESULT_SETTINGS) <= set(node)  # no stale entry
        for key in node:
            if key in engine.NOT_RESULT_SETTINGS or key == "_target_":  # the class is the one engine.name names
                assert key not in recorded["engine"]
            else:
                assert recorded["engine"][key] == node[key], f"engine.{key}"
    run_node = OmegaConf.to_container(compose([]).run, resolve=True)
    judged = {f"run.{key}" for key in run_node} & set(NOT_RESULT_SETTINGS)  # verdict thresholds, not results
    used_exclusions |= judged
    # The regime's keys are recorded off eager only (every earlier run.json ran eagerly, without them).
    assert config_settings(compose([]), None)["run"] == {key: value for key, value in run_node.items()
                                                   if f"run.{key}" not in judged and key not in REGIME_KEYS}
    compiled = config_settings(compose(["run.regime=compiled"]), None)["run"]
    assert {key: compiled[key] for key in REGIME_KEYS} == {**{key: run_node[key] for key in REGIME_KEYS},
                                                          "regime": "compiled"}
    assert used_exclusions == set(NOT_RESULT_SETTINGS)  # no stale entry


def test_resuming_with_another_model_is_refused_before_loading_and_touches_nothing(tmp_path, monkeypatch):
    run_benchmark(compose(TINY), str(tmp_path))
    before = snapshot(tmp_path)

    def must_not_load(*args, **kwargs):
        raise AssertionError("the model was loaded before the settings were checked")

    monkeypatch.setattr(tiny_module, "build_tiny_random", must_not_load)
    for changed in (["model.num_layers=4", "model.hidden_size=128"], ["run.max_draft_tokens=4"],
                    ["run.warmup_max_new_tokens=4"], ["model.prompt_format=chat_template"]):
        with pytest.raises(SpecbenchError, match="other settings") as refused:
            run_benchmark(compose([*TINY, *changed]), str(tmp_path))
        shown = changed[0].split("=")[0].replace("model.", "model_config.")  # run.json's name of the group
        assert f"{shown}: " in str(refused.value)
    assert snapshot(tmp_path) == before


def test_other_weights_under_the_same_settings_are_refused(tmp_path, monkeypatch):
    """Weights the configuration does not pin (a checkpoint directory rewritten in place) are caught by the
    weights fingerprint, after loading and still without touching the directory."""
    run_benchmark(compose(TINY), str(tmp_path))
    before = snapshot(tmp_path)
    original = tiny_module.build_tiny_random

    def retrained(*args, **kwargs):
        loaded = original(*args, **kwargs)
        with torch.no_grad():
            next(loaded.weights.module.parameters()).add_(0.01)
        return loaded

    monkeypatch.setattr(tiny_module, "build_tiny_random", retrained)
    with pytest.raises(SpecbenchError, match="weights_fingerprint"):
        run_benchmark(compose([*TINY, "task.limit_per_task=2"]), str(tmp_path))  # a question left to run
    assert snapshot(tmp_path) == before


def test_an_empty_or_cut_run_json_is_one_line_naming_it(tmp_path):
    run_benchmark(compose(TINY), str(tmp_path))
    for damaged in ("", '{"schema_version": 3, "mod'):
        (tmp_path / "run.json").write_text(damaged)
        with pytest.raises(SpecbenchError, match="run.json is empty or damaged"):
            run_benchmark(compose([*TINY, "task.limit_per_task=2"]), str(tmp_path))


@pytest.mark.slow  # moved behind slow to keep the default run under 8 minutes on 2 cores (CI runs it)
def test_a_cli_run_refused_for_its_settings_leaves_hydra_files_and_log_alone(tmp_path):
    """Hydra used to rewrite .hydra/overrides.yaml before specbench refused the run, and analysis then labelled
    the old results with the refused overrides."""
    def cli(*overrides):
        return subprocess.run([sys.executable, "-m", "specbench", *TINY, f"hydra.run.dir={tmp_path}", *overrides],
                              capture_output=True, text=True, timeout=600)

    first = cli()
    assert first.returncode == 0, first.stderr
    assert (tmp_path / ".hydra" / "overrides.yaml").is_file() and (tmp_path / "specbench.log").is_file()
    before = snapshot(tmp_path)
    refused = cli("model.num_layers=4")
    assert refused.returncode == 2 and "model_config.num_layers: 2 -> 4" in refused.stderr
    assert snapshot(tmp_path) == before
    unknown_option = cli("drafter=nope")  # Hydra's own config error: the same exit status as specbench's
    assert unknown_option.returncode == 2


def test_a_run_directory_that_cannot_be_created_is_one_line(tmp_path):
    """Hydra creates the directory before specbench starts; its OSError was a traceback with exit status 1."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    result = subprocess.run([sys.executable, "-m", "specbench", *TINY, f"hydra.run.dir={blocker}/run"],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith(
        f"specbench: error: cannot create the run directory: Not a directory: {blocker}/run")


def test_a_cache_that_cannot_be_written_is_named_before_converting(tmp_path):
    """The conversion used to fail after 19 s of work without naming the path."""
    from specbench.artefacts.gguf_conversion import convert_gguf

    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(SpecbenchError, match=rf"cannot build {blocker}/models/copy: {blocker} is not a writable directory"):
        convert_gguf(tmp_path / "never-read.gguf", blocker / "models" / "copy", torch.float32)


# --- one run per directory -------------------------------------------------------------------------------

def test_a_second_run_into_a_locked_directory_is_refused_naming_the_holder(tmp_path):
    with RunLock(tmp_path) as held:
        held.keep()
        with pytest.raises(SpecbenchError, match=rf"in use by another run \(pid {os.getpid()} on "):
            run_benchmark(compose(TINY), str(tmp_path))
    assert not (tmp_path / "answers.jsonl").exists()
    run_benchmark(compose(TINY), str(tmp_path))  # released: the run goes ahead
    assert len(read_answers(tmp_path)) == 1


@pytest.mark.slow  # moved behind slow to keep the default run under 8 minutes on 2 cores (CI runs it)
def test_two_processes_cannot_run_into_one_directory(tmp_path):
    """Both exited 0 before, with every answer written twice. The first process holds the directory through a
    long warm-up; the second run, started meanwhile, is refused naming it."""
    overrides = [*TINY, "task.limit_per_task=3", "run.warmup_runs=40"]
    first = subprocess.Popen([sys.executable, "-m", "specbench", *overrides, f"hydra.run.dir={tmp_path}"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not (tmp_path / LOCK_NAME).is_file() or not (tmp_path / LOCK_NAME).read_text():
        assert time.monotonic() < deadline and first.poll() is None
        time.sleep(0.05)
    try:
        with pytest.raises(SpecbenchError, match=rf"in use by another run \(pid {first.pid} on "):
            run_benchmark(compose(overrides), str(tmp_path))
        assert first.poll() is None, "the first run ended before the second was refused: the test proves nothing"
    finally:
        first.communicate(timeout=600)
    assert first.returncode == 0
    ids = [record["question_id"] for record in read_answers(tmp_path)]
    assert len(ids) == len(set(ids)) == 3


def test_a_lock_left_by_a_killed_run_is_taken_over(tmp_path, caplog):
    (tmp_path / LOCK_NAME).write_text(json.dumps({"pid": 999999, "host": "gone", "started": "2026-01-01T00:00:00"}))
    with caplog.at_level("WARNING"):
        run_benchmark(compose(TINY), str(tmp_path))
    assert "no longer running (pid 999999 on gone" in caplog.text
    assert len(read_answers(tmp_path)) == 1 and (tmp_path / LOCK_NAME).read_text() == ""


def test_a_lock_refused_on_a_new_directory_leaves_nothing_behind(tmp_path):
    target = tmp_path / "new"
    with RunLock(target):
        pass  # released without keep(): the run was refused after locking
    assert not target.exists()


@pytest.fixture
def flock_errno():
    return errno.ENOSYS


@pytest.fixture
def no_flock(flock_errno, monkeypatch):
    """A filesystem without flock (Lustre without -o flock, some NFS mounts): flock raises, as they do."""
    def unsupported(*args):
        raise OSError(flock_errno, os.strerror(flock_errno))

    monkeypatch.setattr(fcntl, "flock", unsupported)


def finished_pid() -> int:
    """The pid of a process of this host that has exited (and been reaped)."""
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


@pytest.mark.parametrize("flock_errno", [errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOLCK],
                         ids=["ENOSYS", "EOPNOTSUPP", "ENOLCK"])
def test_without_flock_a_run_directory_is_held_by_one_run_at_a_time(tmp_path, no_flock):
    lock = tmp_path / LOCK_NAME
    with RunLock(tmp_path) as held:
        held.keep()
        assert json.loads(lock.read_text())["pid"] == os.getpid()
        with pytest.raises(SpecbenchError, match=rf"in use by another run \(pid {os.getpid()} on ") as refused:
            RunLock(tmp_path).acquire()
        assert "remove" not in str(refused.value) and lock.is_file()  # the refused run left the holder's lock alone
    assert not lock.exists()  # released: the lock is the file's existence
    assert len(read_answers(tmp_path)) == 0
    run_benchmark(compose(TINY), str(tmp_path))  # a whole run on this filesystem
    assert len(read_answers(tmp_path)) == 1 and not lock.exists()
    target = tmp_path / "new"
    with RunLock(target):
        pass  # refused after locking: nothing left behind
    assert not target.exists()


def test_without_flock_a_lock_left_by_a_killed_run_of_this_host_is_taken_over(tmp_path, no_flock, caplog):
    pid = finished_pid()
    (tmp_path / LOCK_NAME).write_text(json.dumps({"pid": pid, "host": socket.gethostname(), "started": "then"}))
    with caplog.at_level("WARNING"):
        run_benchmark(compose(TINY), str(tmp_path))
    assert f"holder is no longer running (pid {pid} on {socket.gethostname()}" in caplog.text
    assert len(read_answers(tmp_path)) == 1 and not (tmp_path / LOCK_NAME).exists()


def test_without_flock_a_lock_held_on_another_host_is_refused_naming_the_file_to_remove(tmp_path, no_flock):
    lock = tmp_path / LOCK_NAME
    lock.write_text(json.dumps({"pid": 4242, "host": "node-17.cluster", "started": "2026-01-01T00:00:00"}))
    with pytest.raises(SpecbenchError) as refused:
        run_benchmark(compose(TINY), str(tmp_path))
    message = str(refused.value)
    assert "\n" not in message and "in use by another run (pid 4242 on node-17.cluster" in message
    assert message.endswith(f"if that run is no longer running, remove {lock}")
    assert not (tmp_path / "answers.jsonl").exists()
    lock.unlink()  # what the message says to do
    run_benchmark(compose(TINY), str(tmp_path))
    assert len(read_answers(tmp_path)) == 1


def test_a_lock_taken_by_creation_on_a_host_without_flock_is_respected_where_flock_works(tmp_path):
    lock = tmp_path / LOCK_NAME
    lock.write_text(json.dumps({"pid": 4242, "host": "node-17.cluster", "started": "then", "token": "t"}))
    with pytest.raises(SpecbenchError, match=r"in use by another run \(pid 4242 on node-17.cluster.*remove"):
        RunLock(tmp_path).acquire()
    assert json.loads(lock.read_text())["pid"] == 4242


# --- interrupted writes ---------------------------------------------------------------------------------

def test_a_cut_inside_a_multibyte_character_is_dropped_and_the_run_resumes(tmp_path, caplog):
    run_benchmark(compose(TINY), str(tmp_path))
    answers = tmp_path / "answers.jsonl"
    whole = answers.read_bytes()
    record = json.loads(whole)
    record["question_id"] = "cut"
    record["choices"][0]["turns"] = ["éèà 漢字"]
    cut = json.dumps(record, ensure_ascii=False).encode()
    cut = cut[: cut.index("漢".encode()) + 1]  # one byte into a three-byte character
    answers.write_bytes(whole + cut)
    with caplog.at_level("WARNING"):
        assert len(read_answers(tmp_path)) == 1
    assert "answers.jsonl: the last line is incomplete" in caplog.text
    summary = run_benchmark(compose([*TINY, "task.limit_per_task=2"]), str(tmp_path))
    assert summary["tasks"]["overall"]["questions"] == 2
    assert answers.read_bytes().endswith(b"\n") and len(read_answers(tmp_path)) == 2


# --- prompts longer than the context ---------------------------------------------------------------------

def test_a_question_longer_than_the_context_is_skipped_recorded_and_passed_on_resume(tmp_path):
    questions = tmp_path / "questions.jsonl"
    rows = [{"question_id": 1, "category": "qa", "turns": ["short question"]},
            {"question_id": 2, "category": "qa", "turns": ["long " * 400]},
            {"question_id": 3, "category": "qa", "turns": ["another short one"]}]
    questions.write_text("".join(json.dumps(row) + "\n" for row in rows))
    cfg = compose(["model=tiny-random", "model.max_context=256", "run.max_new_tokens=8", "run.warmup_runs=0",
                   f"task.path={questions}", "task.tasks=[qa]"])
    summary = run_benchmark(cfg, str(tmp_path / "run"))
    assert summary["tasks"]["overall"]["questions"] == 2
    assert [item["question_id"] for item in summary["skipped"]] == [2]
    assert "more than tiny-random's context of 256" in summary["skipped"][0]["reason"]
    assert "skipped 1 question(s): 2: question 2 turn 1" in format_summary_table(summary)
    again = run_benchmark(cfg, str(tmp_path / "run"))  # finished: nothing left to run, the skip stays recorded
    assert [item["question_id"] for item in again["skipped"]] == [2]


# --- converted model copies ------------------------------------------------------------------------------

def write_fake_checkpoint(staging: Path) -> None:
    (staging / "model.safetensors").write_bytes(bytes(range(256)) * 4096)
    (staging / "config.json").write_text("{}")


def test_a_damaged_converted_copy_is_detected(tmp_path):
    copy = tmp_path / "model"
    replace_directory(copy, write_fake_checkpoint, {})
    assert converted_copy_problem(copy) is None
    weights = copy / "model.safetensors"
    time.sleep(0.05)  # a later write gets a later modification time (file times advance in ticks of a few ms)
    data = bytearray(weights.read_bytes())
    data[1000:2000] = bytes(1000)  # overwritten in place, same size
    weights.write_bytes(bytes(data))
    assert "is not the file that was written" in converted_copy_problem(copy)
    weights.write_bytes(bytes(data[:5000]))
    assert "holds 5000 bytes" in converted_copy_problem(copy)
    (copy / CHECKSUM_FILE).write_text("{")
    assert "damaged" in converted_copy_problem(copy)
    assert converted_copy_problem(tmp_path / "absent") == "missing"


def test_a_reinstalled_gguf_file_keeps_its_converted_copies_and_an_edited_one_does_not(tmp_path, monkeypatch):
    """Converted copies are named by the GGUF file's content: a fresh clone's venv installs the embedded model's
    file anew (another path, a new modification time), which used to convert it again, tens of seconds per dtype."""
    import specbench.storage.manifest as artefacts

    models = tmp_path / "models"
    installed, reinstalled = tmp_path / "venv-a" / "model.gguf", tmp_path / "venv-b" / "model.gguf"
    for file in (installed, reinstalled):
        file.parent.mkdir()
        file.write_bytes(b"GGUF" + bytes(range(200)))
    os.utime(reinstalled, ns=(10**18, 10**18))
    digest = gguf_digest(installed, models)
    assert gguf_digest(reinstalled, models) == digest and len(digest) == 64
    monkeypatch.setattr(artefacts, "file_digest", lambda path: pytest.fail(f"{path} was hashed again"))
    assert gguf_digest(installed, models) == digest  # remembered by path, size and times
    monkeypatch.undo()
    installed.write_bytes(b"GGUF" + bytes(range(201)))
    assert gguf_digest(installed, models) != digest


def test_a_killed_conversion_leaves_no_copy_that_looks_complete(tmp_path):
    copy = tmp_path / "model"

    def killed(staging: Path) -> None:
        write_fake_checkpoint(staging)
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        replace_directory(copy, killed, {})
    assert converted_copy_problem(copy) == "missing"


@pytest.mark.slow
def test_the_embedded_model_heals_a_damaged_cached_copy(tmp_path, caplog):
    """End to end on SmolLM2: overwrite 1 MB inside the cached model.safetensors and set its modification time
    back (which once went unnoticed: empty answers reported as identical and fast); the next load says the copy
    is damaged, converts it again and decodes as before."""
    from hydra.utils import instantiate

    node = compose(["model=smollm2-135m", f"model.cache_dir={tmp_path}"]).model
    first = instantiate(node, device="cpu")
    fingerprint = first.weights_fingerprint
    (weights,) = list(tmp_path.glob("models/*/model.safetensors"))
    before = weights.stat()
    with open(weights, "r+b") as handle:
        handle.seek(weights.stat().st_size // 2)
        handle.write(os.urandom(1 << 20))
    os.utime(weights, ns=(before.st_atime_ns, before.st_mtime_ns))
    with caplog.at_level("WARNING"):
        second = instantiate(node, device="cpu")
    assert "is damaged (model.safetensors is not the file that was written" in caplog.text
    assert "converting it again" in caplog.text
    assert second.weights_fingerprint == fingerprint and converted_copy_problem(weights.parent) is None


# --- busy machines ---------------------------------------------------------------------------------------

def test_safe_threads_leaves_busy_cores_alone():
    assert safe_threads(2, 0.0) == 2
    assert safe_threads(2, 1.0) == 1
    assert safe_threads(2, 1.9) == 1
    assert safe_threads(16, 3.1) == 13 and safe_threads(16, 3.5) == 12  # a blip under a quarter core is noise
    assert safe_threads(2, None) == 2
    assert is_contended(1.0, threads=2, cores=2) and not is_contended(1.0, threads=1, cores=2)
    assert not is_contended(0.2, threads=2, cores=2) and not is_contended(None, threads=2, cores=2)


SPIN = "import time\nend = time.time() + 3\nwhile time.time() < end: pass"


def test_the_meter_sees_another_process_spinning_a_core():
    # Started by a process that exits at once, so the spinner is no descendant of this one: the meter counts a
    # run's own child processes (vLLM's engine) as its own load, and only other processes as contention.
    subprocess.run([sys.executable, "-c", f"import subprocess, sys; subprocess.Popen([sys.executable, '-c', {SPIN!r}])"],
                   check=True)
    time.sleep(0.5)
    busy = ContentionMeter().sample(1.5)
    time.sleep(1.2)  # the spinner's last second, so that it does not slow the next test
    if busy is None:
        pytest.skip("no /proc/stat here")
    assert busy >= 0.6


def answer_line(question_id, tokens, seconds, other_cores=None):
    return {"question_id": question_id, "choices": [{"new_tokens": [tokens], "wall_time": [seconds]}],
            "specbench": {"contention": {"other_cores": other_cores}}}


def test_a_run_on_a_busy_machine_is_flagged_in_summary_and_table():
    check = TimingCheck(threads=2, usable_cores=2, other_load_at_start=0.0)
    quiet = [answer_line(q, 100, 4.0, 0.1) for q in (1, 2, 3)]
    assert check.report(quiet, quiet) == {"trustworthy": True, "warnings": [], "threads": 2, "usable_cores": 2,
                                          "other_load": 0.0, "stalls": {"stalled_questions": [], "not_measured": 0,
                                                                        "not_checked": 3}}
    busy = [*quiet, answer_line(4, 100, 4.0, 1.0)]
    report = check.report(busy, busy)
    assert not report["trustworthy"] and report["warnings"] == ["question 4: other processes kept 1.0 of 2 cores busy"]
    collapsed = [*quiet, answer_line(5, 100, 200.0, 0.1)]  # AR at 0.5 tok/s against 25
    assert "question 5: AR ran at 0.5 tok/s" in check.report(quiet, collapsed)["warnings"][0]
    started_busy = TimingCheck(threads=2, usable_cores=2, other_load_at_start=1.0).report(quiet, quiet)
    assert "at start other processes kept 1.0 of 2 cores busy" in started_busy["warnings"][0]
    summary = {"tasks": {}, "timing": report}
    assert "TIMINGS UNTRUSTWORTHY (busy machine, 1 warning(s)): question 4" in format_summary_table(summary)


def test_a_long_prefill_before_a_short_answer_is_not_a_slow_machine():
    """The AR speed the check compares is the one after each turn's prefill: Spec-Bench's rag question 1022 on the
    embedded model, 21 tokens after a 664-token prompt, took 2.72 s of which 1.39 s was the prefill (7.7 tok/s
    overall, 15.0 decoding), beside questions decoding at about 25 tok/s. An answer without ``prefill_s`` (written
    before it was recorded) is read over its whole wall time, as before."""
    from specbench.measure.machine import slow_baseline_warnings
    from specbench.measure.metrics import answer_decoding_rate as decoding_speed

    def with_prefill(question_id, tokens, seconds, prefill):
        line = answer_line(question_id, tokens, seconds, 0.1)
        line["specbench"]["prefill_s"] = [prefill]
        return line

    quiet = [with_prefill(q, 100, 4.0, 0.1) for q in (1, 2, 3)]
    long_prompt = with_prefill(1022, 21, 2.72, 1.39)
    assert round(decoding_speed(long_prompt), 1) == 15.0
    assert slow_baseline_warnings([*quiet, long_prompt]) == []
    unrecorded = answer_line(1022, 21, 2.72, 0.1)
    assert round(decoding_speed(unrecorded), 1) == 7.7
    assert slow_baseline_warnings([*quiet, unrecorded]) == [
        "question 1022: AR ran at 7.7 tok/s, under 50% of the run's median 25.4"]
    collapsed = with_prefill(5, 100, 30.0, 0.1)  # a slow decode stays flagged, prefill or not
    assert slow_baseline_warnings([*quiet, collapsed])[0].startswith("question 5: AR ran at 3.3 tok/s")
    assert decoding_speed(with_prefill(6, 1, 0.5, 0.4)) is None  # nothing decoded after the prefill


def test_summaries_record_the_timing_check_and_each_question_its_contention(tmp_path):
    summary = run_benchmark(compose(TINY), str(tmp_path))
    assert set(summary["timing"]) == {"trustworthy", "warnings", "threads", "usable_cores", "other_load", "stalls"}
    assert summary["timing"]["threads"] == torch.get_num_threads()
    (record,) = read_answers(tmp_path)
    assert set(record["specbench"]["contention"]) == {"other_cores", "threads", "usable_cores"}
    assert set(record["specbench"]["stalls"]["roles"]) == {"method", "baseline"}  # tests/test_stalls.py: the rest
    (baseline,) = read_run_results(tmp_path, True).baseline
    for answer in (record, baseline):  # each turn's prefill, inside its wall time
        prefill, wall = answer["specbench"]["prefill_s"], answer["choices"][0]["wall_time"]
        assert len(prefill) == len(wall) and all(0 < part < seconds for part, seconds in zip(prefill, wall))
    settings = json.loads((tmp_path / "run.json").read_text())
    assert settings["threads"] == summary["timing"]["threads"] and len(settings["weights_fingerprint"]) == 16
