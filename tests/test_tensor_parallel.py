"""specbench under torchrun: two processes of tiny-random sharded by transformers' tensor parallelism
(``model.tp_plan=auto``, gloo on the CPU) give a drafter config's output exactly as one process does (four kinds
of drafter in the default run, every config in -m slow), rank 0 alone writes, and the settings that cannot be
shared between processes are refused with one line."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import SMALL_MODEL_DB

from specbench.config import compose, group_options

DRAFTERS = group_options("drafter")
MODEL_DB_DRAFTERS = [name for name in DRAFTERS if "model_db_build" in compose([f"drafter={name}"]).drafter]
# The default run's drafters: one that reads only tokens (pld), one with a draft model (sps), one that learns from
# the target's top-k (recycling) and one that reads its hidden states, embedding and output layer (eagle3, whose
# head needs the whole of them, not a process's shard). Each sweep is two process launches whatever its size,
# so the slow run's every-config sweep (HD's configs in a sweep of their own) costs twice as much.
DEFAULT_DRAFTERS = ["pld", "sps", "recycling", "eagle3"]
# Small and quick: one question of one task, no AR baseline (the comparison is between placements), no warm-up.
RUN = ["model=tiny-random", "task.tasks=[rag]", "task.limit_per_task=1", "run.max_new_tokens=24", "run.baseline=false",
       "run.warmup_runs=0"]


def sweep(sweep_dir: Path, extra: list[str], processes: int, drafters: list[str]) -> subprocess.CompletedProcess:
    """The ``drafters`` configs into ``sweep_dir``, in up to two sweeps: HD's with the tests' small model database
    (SMALL_MODEL_DB, keys the other configs do not have; ``++`` since Hydra first composes the sweep with the
    default drafter), then the others."""
    launcher = [sys.executable, "-m", "specbench"] if processes == 1 else [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(processes), "-m", "specbench"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with_db = [name for name in drafters if name in MODEL_DB_DRAFTERS]
    others = [name for name in drafters if name not in MODEL_DB_DRAFTERS]
    for names, overrides in ((with_db, [f"++{override}" for override in SMALL_MODEL_DB]), (others, [])):
        if not names:
            continue
        command = [*launcher, "-m", f"drafter={','.join(names)}", *RUN, *overrides, *extra,
                   f"hydra.sweep.dir={sweep_dir}"]
        result = subprocess.run(command, capture_output=True, text=True, timeout=900, env=env)
        if result.returncode != 0:
            break
    return result


def answers_by_drafter(sweep_dir: Path) -> dict[str, list[dict]]:
    found = {}
    for answers in sweep_dir.glob("*/answers.jsonl"):
        config = json.loads((answers.parent / "run.json").read_text())
        rows = [json.loads(line) for line in answers.read_text().splitlines()]
        found[config["drafter"]["name"]] = [(row["question_id"], row["choices"][0]["turns"],
                                             row["choices"][0]["new_tokens"], row["choices"][0]["accept_lengths"])
                                            for row in rows]
    return found


def run_placements(root: Path, drafters: list[str]):
    # aten kernels in one process too: oneDNN's repacked layers are what tensor parallelism cannot shard, and the
    # same kernels make the comparison exact (and the databases the same, since they are keyed by the weights).
    one = sweep(root / "one", ["run.linear_backend=aten"], 1, drafters)
    assert one.returncode == 0, one.stderr[-3000:]
    two = sweep(root / "two", ["model.tp_plan=auto"], 2, drafters)
    assert two.returncode == 0, two.stderr[-3000:]
    return answers_by_drafter(root / "one"), answers_by_drafter(root / "two"), root


@pytest.fixture(scope="module")
def placements(tmp_path_factory):
    root = tmp_path_factory.mktemp("tensor-parallel")
    yield run_placements(root, DEFAULT_DRAFTERS)
    shutil.rmtree(root, ignore_errors=True)


def assert_same_outputs(one: dict, two: dict, drafters: list[str]) -> None:
    assert sorted(one) == sorted(two) == sorted(drafters)
    for drafter in drafters:
        assert two[drafter] == one[drafter], drafter
        assert all(new_tokens for _, _, new_tokens, _ in one[drafter])


def test_these_drafters_give_one_process_output_under_tensor_parallelism(placements):
    assert set(DEFAULT_DRAFTERS) <= set(DRAFTERS)
    one, two, _ = placements
    assert_same_outputs(one, two, DEFAULT_DRAFTERS)


@pytest.mark.slow
def test_every_drafter_config_gives_one_process_output_under_tensor_parallelism(tmp_path):
    one, two, _ = run_placements(tmp_path, DRAFTERS)
    assert_same_outputs(one, two, DRAFTERS)


def test_rank_zero_alone_writes_and_records_the_placement(placements):
    _, _, root = placements
    run_dirs = sorted((root / "two").glob("*/run.json"))
    assert len(run_dirs) == len(DEFAULT_DRAFTERS)
    settings = json.loads(run_dirs[0].read_text())
    assert settings["model_config"]["tp_plan"] == "auto"
    # The weights' fingerprint gathers the shards: the same model as one process with the same kernels.
    one = json.loads(sorted((root / "one").glob("*/run.json"))[0].read_text())
    assert settings["weights_fingerprint"] == one["weights_fingerprint"]
    assert not list(Path(os.environ.get("TMPDIR", "/tmp")).glob("specbench-rank1-*"))  # the scratch is gone


@pytest.mark.parametrize("overrides,message", [
    (["model.tp_plan=auto"], "shards the model over processes, one per device, and this job has 1: run it under torchrun"),
    (["model.tp_plan=auto", "model.device_map=cpu"], "set model.tp_plan or model.device_map, not both"),
    (["model.device_map=auto"], "places layers on GPUs, but torch sees none"),
])
def test_placements_that_cannot_run_are_one_line(overrides, message):
    from specbench.config import compose
    from specbench.errors import SpecbenchError
    from specbench.runner import build

    with pytest.raises(SpecbenchError, match=message) as refused:
        build(compose(["model=tiny-random", *overrides]).model, device="cpu")
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize("overrides,message", [
    ([], "model.tp_plan is null"),
    (["model.tp_plan=auto", "run.draft_budget=auto"], "run.draft_budget=auto decides every step"),
])
def test_what_processes_cannot_share_is_refused_under_torchrun(tmp_path, overrides, message):
    result = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "-m", "specbench",
                             "model=tiny-random", *overrides, f"hydra.run.dir={tmp_path / 'run'}"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode != 0 and message in result.stderr
    assert not (tmp_path / "run" / "run.json").exists()
