"""A run's identity holds how it was placed: the number of processes, the placement, the devices and the linear
kernels it ran on are recorded in run.json, checked on resume and keep runs apart in analysis."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import specbench.models.tiny as tiny_module
import specbench.runner as runner
from analysis.runs import load_questions, run_infos
from analysis.tables import leaderboard
from specbench.config import compose
from specbench.distributed import Processes
from specbench.errors import SpecbenchError
from specbench.targets.kernels import OneDNNLinear
from specbench.run.identity import PLACEMENT_KEYS, UNRECORDED, implied_placement
from specbench.storage.run_lock import LOCK_NAME

# One thread: the thread count a job of two processes chooses by itself differs from one process's, and these
# runs must differ in their placement alone.
TINY = ["model=tiny-random", "run.max_new_tokens=8", "task.tasks=[qa]", "task.limit_per_task=1", "run.warmup_runs=0",
        "run.threads=1"]


class RankZeroOfTwo(Processes):
    """Rank 0 of a two-process job whose other rank agrees with every decision: what rank 0 of a torchrun job
    records, without launching one."""

    def share(self, value):
        return value


def as_two_processes(monkeypatch):
    monkeypatch.setattr(runner.Processes, "from_environment", staticmethod(lambda *args: RankZeroOfTwo(0, 2)))


def snapshot(directory: Path) -> dict:
    return {str(path.relative_to(directory)): path.read_bytes()
            for path in sorted(directory.rglob("*")) if path.is_file() and path.name != LOCK_NAME}


def strip_placement(run_dir: Path) -> None:
    """Make ``run_dir`` look written before run.json recorded the placement."""
    settings = json.loads((run_dir / "run.json").read_text())
    (run_dir / "run.json").write_text(json.dumps({key: value for key, value in settings.items()
                                                  if key not in PLACEMENT_KEYS}))


def must_not_load(*args, **kwargs):
    raise AssertionError("the model was loaded before the placement was checked")


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    """A finished one-process run (tests that change it work on a copy)."""
    path = tmp_path_factory.mktemp("one-process") / "run"
    runner.run_benchmark(compose(TINY), str(path))
    return path


def refused_resume(path) -> str:
    """The refusal of resuming the run in ``path`` with one more question."""
    with pytest.raises(SpecbenchError) as refused:
        runner.run_benchmark(compose([*TINY, "task.limit_per_task=2"]), str(path))
    return str(refused.value)


def test_run_json_records_the_placement(finished_run):
    settings = json.loads((finished_run / "run.json").read_text())
    backend = "onednn" if OneDNNLinear.supported() else "aten"  # run.linear_backend=auto on a float32 CPU model
    assert {key: settings[key] for key in PLACEMENT_KEYS} == {"processes": 1, "placement": "single", "devices": "cpu",
                                                              "linear_backend_used": backend}


def test_resuming_a_one_process_run_with_two_processes_is_refused_before_loading(finished_run, monkeypatch):
    before = snapshot(finished_run)
    as_two_processes(monkeypatch)
    monkeypatch.setattr(tiny_module, "build_tiny_random", must_not_load)
    message = refused_resume(finished_run)
    assert "processes: 1 -> 2" in message and "\n" not in message
    assert snapshot(finished_run) == before


def test_resuming_on_other_linear_kernels_is_refused_after_loading(finished_run, monkeypatch):
    """run.linear_backend=auto is the same setting on a torch build without oneDNN's linear primitive, but its
    timings are another kernel's."""
    if not OneDNNLinear.supported():
        pytest.skip("this torch build has no oneDNN linear primitive: auto is aten everywhere")
    before = snapshot(finished_run)
    monkeypatch.setattr(OneDNNLinear, "supported", staticmethod(lambda: False))
    assert "linear_backend_used: 'onednn' -> 'aten'" in refused_resume(finished_run)
    assert snapshot(finished_run) == before


def test_resuming_a_run_recorded_before_its_placement_is_one_line_naming_the_missing_keys(finished_run, tmp_path,
                                                                                          monkeypatch):
    old = tmp_path / "old"
    shutil.copytree(finished_run, old)
    strip_placement(old)
    monkeypatch.setattr(tiny_module, "build_tiny_random", must_not_load)
    message = refused_resume(old)
    assert "recorded before specbench kept how a run is placed" in message and "\n" not in message
    assert "lacks processes, placement, devices, linear_backend_used" in message


def test_runs_of_one_and_two_processes_are_two_rows_not_one_averaged(finished_run, tmp_path, monkeypatch):
    shutil.copytree(finished_run, tmp_path / "one")
    as_two_processes(monkeypatch)
    runner.run_benchmark(compose(TINY), str(tmp_path / "two"))
    labels = {Path(path).name: info["label"] for path, info in run_infos([tmp_path / "one", tmp_path / "two"]).items()}
    assert labels == {"one": "pld processes=1", "two": "pld processes=2"}
    table = leaderboard(load_questions([tmp_path]))
    assert sorted(table.index.get_level_values("label")) == ["pld processes=1", "pld processes=2"]
    assert list(table[("runs", "", "")]) == [1, 1]


def test_an_old_run_is_a_repeat_only_where_its_settings_imply_the_placement(finished_run, tmp_path):
    """A run.json from before the placement keys: one process on its device (no tp_plan), so with aten kernels
    asked for it is a repeat of a new run; with auto on a float32 CPU model the kernels depended on the torch
    build, so it is kept apart, and its label says the placement was not recorded."""
    shutil.copytree(finished_run, tmp_path / "auto" / "new")
    for pair, backend in (("aten", "aten"), ("aten", "aten"), ("auto", "auto")):
        name = "new" if (tmp_path / pair / "old").is_dir() else "old"
        runner.run_benchmark(compose([*TINY, f"run.linear_backend={backend}"]), str(tmp_path / pair / name))
        if name == "old":
            strip_placement(tmp_path / pair / name)
    aten = {Path(path).name: info["label"] for path, info in run_infos(sorted((tmp_path / "aten").iterdir())).items()}
    assert aten == {"old": "pld", "new": "pld"}
    auto = {Path(path).name: info["label"] for path, info in run_infos(sorted((tmp_path / "auto").iterdir())).items()}
    used = "onednn" if OneDNNLinear.supported() else "aten"
    assert auto == {"old": f"pld linear_backend_used={UNRECORDED}", "new": f"pld linear_backend_used={used}"}


def test_what_an_old_run_json_implies_about_its_placement():
    single = {"model_config": {"tp_plan": None, "device_map": None}, "run": {"linear_backend": "auto"},
              "device": "cuda:0", "dtype": "float16"}
    assert implied_placement(single) == {"processes": "1", "placement": "single", "devices": "cuda:0",
                                         "linear_backend_used": "aten"}
    sharded = {"model_config": {"tp_plan": "auto"}, "run": {"linear_backend": "auto"}, "device": "cpu",
               "dtype": "float32"}
    assert implied_placement(sharded) == {"processes": UNRECORDED, "placement": "tensor_parallel",
                                          "devices": UNRECORDED, "linear_backend_used": "aten"}
    spread = {"model_config": {"device_map": "auto"}, "device": "cuda:1"}
    assert implied_placement(spread)["devices"] == UNRECORDED  # which GPUs accelerate used is not in it
    # schema 2: run.* flat, no model_config (it predates placement); a recorded key is not implied
    assert implied_placement({"linear_backend": "onednn", "device": "cpu", "processes": 1}) == {
        "placement": "single", "devices": "cpu", "linear_backend_used": "onednn"}
    assert implied_placement({"device": "cpu"})["linear_backend_used"] == UNRECORDED  # dtype unknown
