"""What a GPU user meets first, tested on a CPU by monkeypatching torch.cuda: a question that runs out of GPU
memory is recorded and the run goes on; the environment and each answer record the GPUs and their memory; the
launchers give cells their GPUs and requeue them; ad-hoc sweeps resume."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from specbench import gpu_memory
from specbench.config import compose
from specbench.decoding.loop import Decoder
from specbench.records import format_summary_table, read_answers, read_jsonl_records
from specbench.runner import environment, loaded_settings, run_benchmark

GIB = 2**30
OOM_MESSAGE = "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.19 GiB"


# --- a question that runs out of GPU memory ----------------------------------------------------------------

def test_a_question_out_of_gpu_memory_is_recorded_and_the_run_goes_on(tmp_path, monkeypatch):
    """The method runs out of memory in the middle of the second question (after its first decoding step, so the
    decoder holds that question's KV cache); the question is recorded with the memory figures, the cache is
    released, and the third question is answered, identical to its baseline."""
    figures = {"cuda:0": {"allocated_bytes": 70 * GIB, "reserved_bytes": 78 * GIB, "peak_bytes": 79 * GIB,
                          "total_bytes": 80 * GIB}}
    released = []
    peaks = iter(range(1_000, 1_000_000, 1_000))  # a new peak per answer: each answer must get its own
    monkeypatch.setattr(gpu_memory, "memory_figures", lambda devices: figures)
    monkeypatch.setattr(gpu_memory, "release_cached_memory", lambda devices: released.append(list(devices)))
    monkeypatch.setattr(gpu_memory, "peak_bytes", lambda devices: next(peaks))
    original = Decoder.generate
    method_calls = []

    def generate(self, prompt_ids, drafter, max_new_tokens, on_step=None, seed=None):
        if drafter.name != "pld":
            return original(self, prompt_ids, drafter, max_new_tokens, on_step=on_step, seed=seed)
        method_calls.append(len(prompt_ids))

        def run_out(generated, elapsed):
            raise torch.OutOfMemoryError(OOM_MESSAGE)

        return original(self, prompt_ids, drafter, max_new_tokens, seed=seed,
                        on_step=run_out if len(method_calls) == 2 else on_step)

    monkeypatch.setattr(Decoder, "generate", generate)
    cfg = compose(["model=tiny-random", "run.max_new_tokens=12", "task.tasks=[qa]", "task.limit_per_task=3",
                   "run.warmup_runs=0"])
    summary = run_benchmark(cfg, str(tmp_path))

    assert len(method_calls) == 3  # the run went on after the failure
    [skipped] = read_jsonl_records(tmp_path / "skipped.jsonl")
    answered = [record["question_id"] for record in read_answers(tmp_path)]
    assert len(answered) == 2 and skipped["question_id"] not in answered
    assert skipped["cause"] == "out_of_memory" and skipped["memory"] == figures
    assert skipped["decoded_by"] == "pld" and skipped["error"] == OOM_MESSAGE
    assert skipped["first_turn_prompt_tokens"] == method_calls[1]  # single-turn questions: the prompt that failed
    assert skipped["reason"] == (f"question {skipped['question_id']} ran out of GPU memory while decoded by pld "
                                 f"(cuda:0 peak 79.0 of 80.0 GiB (allocated 70.0, reserved 78.0); first turn "
                                 f"{method_calls[1]} prompt tokens)")
    assert len(released) == 1
    assert summary["tasks"]["overall"]["questions"] == 2 and summary["skipped_by_cause"] == {"out_of_memory": 1}
    assert f"skipped 1 question(s): {skipped['question_id']}: question" in format_summary_table(summary)
    assert format_summary_table(summary).endswith("(1 out of GPU memory)")
    answers = read_answers(tmp_path)
    assert all(record["specbench"]["identical_to_baseline"] for record in answers)
    baseline = read_jsonl_records(tmp_path / "baseline_answers.jsonl")
    peaks_recorded = [record["specbench"]["peak_gpu_memory_bytes"] for record in answers + baseline]
    assert len(set(peaks_recorded)) == 4 and min(peaks_recorded) >= 1_000
    again = run_benchmark(cfg, str(tmp_path))  # resumed: the skipped question stays skipped, nothing is redone
    assert [record["question_id"] for record in again["skipped"]] == [skipped["question_id"]]


def test_answers_on_a_cpu_have_no_gpu_memory_key():
    from specbench.data import Prompt
    from specbench.records import Answer

    prompt = Prompt(question_id=1, category="qa", task="qa", turns=("q",))
    assert "peak_gpu_memory_bytes" not in Answer().to_record(prompt, "m", None)["specbench"]
    answer = Answer(peak_gpu_memory_bytes=5 * GIB)
    assert answer.to_record(prompt, "m", None)["specbench"]["peak_gpu_memory_bytes"] == 5 * GIB


# --- gpu_memory on fake CUDA devices ---------------------------------------------------------------------

@pytest.fixture
def fake_allocator(monkeypatch):
    """torch.cuda's memory statistics for two fake devices; resets and cache releases are logged."""
    stats = {0: dict(allocated=3 * GIB, reserved=4 * GIB, peak=6 * GIB, total=80 * GIB),
             1: dict(allocated=1 * GIB, reserved=2 * GIB, peak=9 * GIB, total=80 * GIB)}
    calls = []
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device: stats[device.index]["allocated"])
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device: stats[device.index]["reserved"])
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device: stats[device.index]["peak"])
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda device: SimpleNamespace(total_memory=stats[device.index]["total"]))
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device: calls.append(("reset", str(device))))
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: calls.append(("empty_cache",)))
    return calls


def test_gpu_memory_is_none_on_a_cpu(fake_allocator):
    cpu = [torch.device("cpu")]
    gpu_memory.reset_peak(cpu)
    gpu_memory.release_cached_memory(cpu)
    assert gpu_memory.peak_bytes(cpu) is None and gpu_memory.memory_figures(cpu) is None
    assert fake_allocator == []  # nothing on a CPU touches torch.cuda


def test_gpu_memory_reads_every_device_the_model_uses(fake_allocator):
    devices = (torch.device("cuda:1"), torch.device("cpu"), torch.device("cuda:0"))
    gpu_memory.reset_peak(devices)
    assert fake_allocator == [("reset", "cuda:0"), ("reset", "cuda:1")]
    assert gpu_memory.peak_bytes(devices) == 9 * GIB  # the device that runs out first
    figures = gpu_memory.memory_figures(devices)
    assert figures == {"cuda:0": {"allocated_bytes": 3 * GIB, "reserved_bytes": 4 * GIB, "peak_bytes": 6 * GIB,
                                  "total_bytes": 80 * GIB},
                       "cuda:1": {"allocated_bytes": 1 * GIB, "reserved_bytes": 2 * GIB, "peak_bytes": 9 * GIB,
                                  "total_bytes": 80 * GIB}}
    assert gpu_memory.describe(figures) == ("cuda:0 peak 6.0 of 80.0 GiB (allocated 3.0, reserved 4.0); "
                                            "cuda:1 peak 9.0 of 80.0 GiB (allocated 1.0, reserved 2.0)")
    gpu_memory.release_cached_memory(devices)
    assert fake_allocator[-1] == ("empty_cache",)


def test_both_names_of_the_out_of_memory_error_are_caught():
    for error in (torch.OutOfMemoryError("x"), torch.cuda.OutOfMemoryError("x")):
        with pytest.raises(gpu_memory.OUT_OF_MEMORY_ERRORS):
            raise error
    assert not isinstance(RuntimeError("x"), gpu_memory.OUT_OF_MEMORY_ERRORS)


# --- the environment block ----------------------------------------------------------------------------------

def fake_nvidia_smi(directory: Path, listing: str, driver: str) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    script = directory / "nvidia-smi"
    script.write_text("#!/bin/sh\n"
                      f"""case "$1" in -L) printf '%s' '{listing}' ;; --query-gpu=driver_version) echo '{driver}' ;; """
                      "*) exit 9 ;; esac\n")
    script.chmod(0o755)


def fake_model(*devices: str):
    return SimpleNamespace(device=torch.device(devices[0]), devices=tuple(torch.device(d) for d in devices),
                           dtype=torch.float16, source="random:seed=0", weights_fingerprint="abc")


def test_the_environment_records_cuda_driver_and_the_gpus_used(monkeypatch, tmp_path):
    properties = {0: SimpleNamespace(name="NVIDIA H200", total_memory=150_000_000_000, major=9, minor=0),
                  1: SimpleNamespace(name="NVIDIA H200", total_memory=150_000_000_001, major=9, minor=0)}
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: properties[device.index])
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device: properties[device.index].name)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 3)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6")
    fake_nvidia_smi(tmp_path / "bin", "GPU 0: NVIDIA H200 (UUID: GPU-1)\n", "580.65.06")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    env = environment(fake_model("cuda:0", "cuda:1"))
    assert env["device"] == "cuda: NVIDIA H200"
    assert (env["cuda"], env["cuda_driver"], env["cuda_device_count"]) == ("13.0", "580.65.06", 3)
    assert env["cuda_visible_devices"] == "4,5,6" and env["gpus_not_used"] is None
    assert env["gpus"] == [
        {"device": "cuda:0", "name": "NVIDIA H200", "total_memory_bytes": 150_000_000_000, "capability": "9.0"},
        {"device": "cuda:1", "name": "NVIDIA H200", "total_memory_bytes": 150_000_000_001, "capability": "9.0"}]
    recorded = loaded_settings(fake_model("cuda:0"), SimpleNamespace())["environment"]
    assert recorded["cuda"] == "13.0" and [gpu["name"] for gpu in recorded["gpus"]] == ["NVIDIA H200"]
    assert "cuda_driver" not in recorded  # a requeued job on another node's driver still resumes


def test_on_a_cpu_the_gpu_fields_are_null_and_unused_gpus_are_flagged(monkeypatch, tmp_path):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.version, "cuda", None)
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    quiet = environment(fake_model("cpu"))
    assert all(quiet[key] is None for key in ("cuda", "cuda_driver", "cuda_device_count", "gpus", "gpus_not_used"))
    fake_nvidia_smi(tmp_path / "bin", "GPU 0: NVIDIA A100-SXM4-80GB (UUID: GPU-2)\n", "550.54.15")
    env = environment(fake_model("cpu"))
    assert env["cuda"] is None and env["gpus"] is None
    assert env["gpus_not_used"]["listed"] == ["GPU 0: NVIDIA A100-SXM4-80GB"]
    assert "is a CPU build" in env["gpus_not_used"]["reason"]
    table = format_summary_table({"tasks": {}, "environment": env})
    assert "RAN ON THE CPU: nvidia-smi lists 1 GPU(s) (GPU 0: NVIDIA A100-SXM4-80GB) that torch could not use" in table


# --- launchers and sweep directories -------------------------------------------------------------------------

def hydra_config(*overrides: str):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from specbench.config import CONF_DIR

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        return hydra_compose(config_name="config", overrides=list(overrides), return_hydra_config=True)


def submitit_executor(launcher, folder: Path, cluster: str):
    """The submitit executor hydra_submitit_launcher builds from a launcher config (its launch() maps the keys
    this way: max_num_timeout to the executor, base keys as they are, the rest prefixed by the cluster)."""
    import submitit
    from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf
    from omegaconf import OmegaConf

    params = {key: value for key, value in OmegaConf.to_container(launcher, resolve=True).items()
              if key not in ("_target_", "submitit_folder")}
    init = {f"{cluster}_max_num_timeout": params.pop("max_num_timeout")} if "max_num_timeout" in params else {}
    executor = submitit.AutoExecutor(folder=folder, cluster=cluster, **init)
    base = set(OmegaConf.structured(BaseQueueConf).keys())
    executor.update_parameters(**{key if key in base else f"{cluster}_{key}": value for key, value in params.items()})
    return executor


def test_the_local_launcher_lets_a_cell_see_a_gpu(tmp_path):
    """gpus_per_node: 0 made submitit export an empty CUDA_VISIBLE_DEVICES, hiding every GPU from every cell."""
    launcher = hydra_config("hydra/launcher=local").hydra.launcher
    executor = submitit_executor(launcher, tmp_path, "local")
    job = executor.submit(os.getenv, "CUDA_VISIBLE_DEVICES")  # pickled by name: read in the cell
    assert job.result() == "0"


def test_slurm_jobs_are_requeued_on_timeout_and_preemption(tmp_path, monkeypatch):
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "srun").write_text("#!/bin/sh\n")  # submitit refuses to build a SLURM executor without it
    (tmp_path / "bin" / "srun").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    for launcher_name, gpus in (("slurm", 1), ("slurm_multigpu", 4)):
        launcher = hydra_config(f"hydra/launcher={launcher_name}").hydra.launcher
        executor = submitit_executor(launcher, tmp_path / launcher_name, "slurm")
        assert executor._executor.max_num_timeout == 3
        sbatch = executor._executor._make_submission_file_text("python -m specbench", "uid").splitlines()
        assert "#SBATCH --requeue" in sbatch and "#SBATCH --signal=USR2@120" in sbatch
        assert f"#SBATCH --gpus-per-node={gpus}" in sbatch and "#SBATCH --ntasks-per-node=1" in sbatch


def test_an_ad_hoc_sweep_has_a_directory_that_does_not_change(tmp_path):
    from omegaconf import OmegaConf

    cfg = hydra_config("model=tiny-random")
    assert cfg.hydra.sweep.dir == "runs/multirun/tiny-random"  # no ${now}: the same command finds the same cells
    # Named by their overrides, not numbered: a cell keeps its directory when the sweep's order changes.
    assert OmegaConf.to_container(cfg.hydra.sweep)["subdir"] == "${hydra.job.override_dirname}"
