"""A Hydra multirun sweep end to end, through the submitit launcher that a SLURM cluster uses (run here as
local processes), resumed, then analysed."""

import subprocess
import sys
import time

import pytest


@pytest.mark.slow
def test_sweep_runs_resumes_and_reports(tmp_path):
    sweep = tmp_path / "sweep"
    command = [sys.executable, "-m", "specbench", "-m", "experiment=smoke", "hydra/launcher=local",
               f"hydra.sweep.dir={sweep}"]
    first = subprocess.run(command, capture_output=True, text=True, timeout=900)
    assert first.returncode == 0, first.stderr[-3000:]
    cells = {path.parent.name for path in sweep.rglob("summary.json")}
    assert cells == {"ar", "pld"}
    answers = sweep / "pld" / "answers.jsonl"
    before = answers.read_text()
    started = time.perf_counter()
    again = subprocess.run(command, capture_output=True, text=True, timeout=900)
    assert again.returncode == 0, again.stderr[-3000:]
    assert answers.read_text() == before  # finished cells are skipped, not redone
    report = tmp_path / "report.html"
    analysed = subprocess.run([sys.executable, "-m", "analysis", "report", str(sweep), "--out", str(report)],
                              capture_output=True, text=True, timeout=600)
    assert analysed.returncode == 0, analysed.stderr[-3000:]
    assert "pld" in report.read_text() and time.perf_counter() - started < 600


@pytest.mark.slow
def test_slurm_launcher_config_composes():
    from hydra import compose, initialize_config_dir

    from specbench.config import CONF_DIR

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        cfg = compose(config_name="config", overrides=["hydra/launcher=slurm", "experiment=hd_table"],
                      return_hydra_config=True)
    assert cfg.hydra.launcher._target_.endswith("SlurmLauncher")
    assert cfg.hydra.launcher.gpus_per_node == 1
    assert "hd_table" in cfg.hydra.sweep.dir
