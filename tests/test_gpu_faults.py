"""What a GPU user meets first, tested on a CPU by monkeypatching torch.cuda: a question that runs out of GPU
memory is recorded and the run goes on; the environment and each answer record the GPUs and their memory; the
launchers give cells their GPUs and requeue them; ad-hoc sweeps resume."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from conftest import fake_nvidia_smi

from specbench.measure import gpu_memory
from specbench.config import compose
from specbench.decoding.contract import Draft
from specbench.decoding.loop import Decoder
from specbench.decoding.plan import plan_verification, verification_inputs
from specbench.results.console import format_summary_table
from specbench.results.readers import read_answers, read_jsonl_records
from specbench.engines.specbench_loop import loaded_settings
from specbench.run.environment import environment
from specbench.runner import run_benchmark

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
    from specbench.questions import Prompt
    from specbench.results.schema import Answer

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
    from specbench.drafters.ar import NoDraft

    recorded = loaded_settings(fake_model("cuda:0"), NoDraft())["environment"]
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


# --- a target an error left half-changed (issue 30, item 1) ----------------------------------------------------

def _raise_in_passes_of_more_than_one_token(model, error):
    """A forward pre-hook on the model's first decoder layer that raises ``error`` inside every pass over more than
    one token after the prefill: a verification of a draft, as an out-of-memory error would strike it."""
    layer = model.model.layers[0]

    def hook(module, args, kwargs):
        hidden = kwargs.get("hidden_states", args[0] if args else None)
        position_ids = kwargs.get("position_ids")
        if hidden is not None and hidden.shape[1] > 1 and position_ids is not None and int(position_ids.min()) > 0:
            raise error

    return layer.register_forward_pre_hook(hook, with_kwargs=True)


def _fresh_state(target) -> dict:
    return {"cache": target._cache, "mask": target._mask, "hidden": target._hidden, "length": target.length}


def test_an_error_inside_a_verification_pass_leaves_the_target_as_a_fresh_one(tiny, prompt_ids):
    from conftest import ScriptedDrafter

    from specbench.targets.transformers import TransformersTarget
    from specbench.testing import greedy_reference

    target = tiny.target
    ids = prompt_ids[0]
    reference = greedy_reference(tiny.weights.module, ids, 12)
    drafter = ScriptedDrafter(reference, 3)
    handle = _raise_in_passes_of_more_than_one_token(tiny.weights.module, torch.OutOfMemoryError(OOM_MESSAGE))
    try:
        with pytest.raises(torch.OutOfMemoryError):
            Decoder(target, frozenset(), 8).generate(ids, drafter, 12)
    finally:
        handle.remove()
    fresh = TransformersTarget(tiny.weights.module)
    assert _fresh_state(target) == _fresh_state(fresh) == {"cache": None, "mask": None, "hidden": None, "length": 0}
    # and it decodes as a fresh one would
    assert Decoder(target, frozenset(), 8).generate(ids, drafter, 12).token_ids == reference


@torch.inference_mode()
def test_a_failed_pass_puts_the_mask_block_back_for_a_caller_that_keeps_the_sequence(tiny, prompt_ids):
    """The nodes' [q, q] block is written into the persistent mask before the pass; a pass that raises must still
    leave every column visible, or a later pass over this cache would not see those cached positions."""
    from specbench.targets.transformers import TransformersTarget

    target = TransformersTarget(tiny.weights.module)
    ids = np.asarray(prompt_ids[1], dtype=np.int64)
    target.start(ids.size + 16)
    target.prefill(ids, False, 2)
    plan = plan_verification(Draft.chain([5, 6, 7]), int(ids[-1]), 8, 8)
    handle = _raise_in_passes_of_more_than_one_token(tiny.weights.module, RuntimeError("inside the pass"))
    try:
        with pytest.raises(RuntimeError, match="inside the pass"):
            target.verify(verification_inputs(plan, target.length, plan.n_nodes), plan.n_nodes, 2)
    finally:
        handle.remove()
    assert bool(target._mask.all())
    target.start(8)  # a new sequence never inherits a mask
    assert target._mask is None and target.length == 0


def test_out_of_memory_in_the_warm_up_is_recorded_like_one_in_a_question(tmp_path, monkeypatch):
    """The warm-up decodes the first pending question untimed; running out of memory there is that question's
    out-of-memory record (phase warm-up), and the next question warms up and the run goes on."""
    original = Decoder.generate
    warm_ups = []

    def generate(self, prompt_ids, drafter, max_new_tokens, on_step=None, seed=None):
        if seed is None:  # the warm-up's decodes carry no question seed
            warm_ups.append(drafter.name)
            if len(warm_ups) == 1:
                raise torch.OutOfMemoryError(OOM_MESSAGE)
        return original(self, prompt_ids, drafter, max_new_tokens, on_step=on_step, seed=seed)

    monkeypatch.setattr(Decoder, "generate", generate)
    cfg = compose(["model=tiny-random", "run.max_new_tokens=8", "task.tasks=[qa]", "task.limit_per_task=3"])
    summary = run_benchmark(cfg, str(tmp_path))
    [skipped] = read_jsonl_records(tmp_path / "skipped.jsonl")
    answered = [record["question_id"] for record in read_answers(tmp_path)]
    assert len(answered) == 2 and skipped["question_id"] not in answered
    assert skipped["cause"] == "out_of_memory" and skipped["phase"] == "warm-up" and skipped["decoded_by"] == "pld"
    assert "ran out of GPU memory while decoded by pld in the warm-up" in skipped["reason"]
    assert summary["skipped_by_cause"] == {"out_of_memory": 1}
    assert warm_ups[:2] == ["pld", "pld"]  # the next question warmed up in its place


def test_out_of_memory_in_the_calibration_is_recorded_like_one_in_a_question(tmp_path, monkeypatch):
    original = Decoder.measure_verify_latency
    calls = []

    def measure(self, prompt_ids, sizes, repeats):
        calls.append(len(prompt_ids))
        if len(calls) == 1:
            raise torch.OutOfMemoryError(OOM_MESSAGE)
        return original(self, prompt_ids, sizes, repeats)

    monkeypatch.setattr(Decoder, "measure_verify_latency", measure)
    cfg = compose(["model=tiny-random", "run.max_new_tokens=8", "task.tasks=[qa]", "task.limit_per_task=2",
                   "run.verify_padding=auto", "run.calibration_repeats=1"])
    run_benchmark(cfg, str(tmp_path))
    [skipped] = read_jsonl_records(tmp_path / "skipped.jsonl")
    assert skipped["phase"] == "calibration" and skipped["cause"] == "out_of_memory"
    assert "in the calibration of verify latency" in skipped["reason"]
    assert len(read_answers(tmp_path)) == 1 and len(calls) == 2


# --- the logits' device under accelerate's device_map (item 2) ---------------------------------------------

class _PlacedOverTwoDevices(torch.nn.Module):
    """A model whose embeddings and output layer sit on two devices (cpu and meta stand for two GPUs), with the
    device map accelerate leaves on a model it dispatched."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(4, 2)
        self.head = torch.nn.Linear(2, 4, device="meta")
        self.hf_device_map = {"embed": "cpu", "head": "meta"}

    def get_input_embeddings(self):
        return self.embed

    def get_output_embeddings(self):
        return self.head


def test_under_device_map_the_logits_are_on_the_inputs_device():
    """accelerate's dispatch_model puts a hook on the model itself that returns its outputs to the device its inputs
    came from (AlignDevicesHook(io_same_device=True)): the logits are on the embeddings' device, not the output
    layer's, and the draft model, the generators and the sampling verifier must go there."""
    from accelerate.hooks import AlignDevicesHook, add_hook_to_module

    from specbench.targets.transformers import model_devices

    model = _PlacedOverTwoDevices()
    assert model_devices(model)[:2] == (torch.device("cpu"), torch.device("meta"))  # without the root hook
    add_hook_to_module(model, AlignDevicesHook(io_same_device=True))
    input_device, logits_device, devices = model_devices(model)
    assert input_device == logits_device == torch.device("cpu")
    assert set(devices) == {torch.device("cpu"), torch.device("meta")}


@torch.inference_mode()
def test_a_pass_whose_logits_come_back_elsewhere_is_refused(tiny, prompt_ids):
    from specbench.errors import SpecbenchError
    from specbench.targets.transformers import TransformersTarget

    target = TransformersTarget(tiny.weights.module)
    target.device = torch.device("meta")  # what it was told at set-up; the pass says cpu
    target.start(64)
    with pytest.raises(SpecbenchError, match="logits came back on cpu, but it was set up for meta"):
        target.prefill(np.asarray(prompt_ids[0], dtype=np.int64), False, 2)


# --- dtype auto and logits that are not finite (item 4) ------------------------------------------------------

def test_dtype_auto_is_the_checkpoints_half_precision_on_a_gpu(monkeypatch):
    from specbench.models.devices import resolve_dtype

    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *args, **kwargs: True)
    assert resolve_dtype("auto", cuda, torch.bfloat16) == torch.bfloat16
    assert resolve_dtype("auto", cuda, torch.float16) == torch.float16
    assert resolve_dtype("auto", cuda, torch.float32) == torch.float16  # as Spec-Bench runs a float32 checkpoint
    assert resolve_dtype("auto", cuda, None) == torch.float16
    assert resolve_dtype("auto", cpu, torch.bfloat16) == torch.float32
    assert resolve_dtype("float16", cuda, torch.bfloat16) == torch.float16  # an explicit choice is kept
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *args, **kwargs: False)
    assert resolve_dtype("auto", cuda, torch.bfloat16) == torch.float16


def test_a_bfloat16_checkpoint_loads_in_bfloat16_on_a_gpu(tmp_path, monkeypatch):
    """load_pretrained reads the checkpoint's dtype from its config before loading (Qwen2.5, Qwen3 and Llama-3.1
    are saved in bfloat16, and overflow float16)."""
    import transformers

    from specbench.models import hub

    import json

    from specbench.testing import save_tiny_checkpoint

    save_tiny_checkpoint(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["dtype"] = "bfloat16"  # as Qwen2.5's config.json says
    (tmp_path / "config.json").write_text(json.dumps(config))
    monkeypatch.setattr(hub, "resolve_device", lambda device: torch.device("cuda"))
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *args, **kwargs: True)
    asked = []

    class Loaded(Exception):
        pass

    def from_pretrained(source, dtype=None, **kwargs):
        asked.append(dtype)
        raise Loaded

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", from_pretrained)
    with pytest.raises(Exception):  # the loader's own error for the stand-in's exception: the dtype was asked for
        hub.load_pretrained("checkpoint", path=str(tmp_path), device="cuda", dtype="auto")
    assert asked and asked[0] == torch.bfloat16


def test_a_pass_whose_logits_are_not_finite_stops_in_one_line(tiny, prompt_ids):
    """NaN logits give the method and the baseline the same argmax, so the lossless check would pass; the choices'
    one read carries a finiteness flag, and a pass that fails it stops the decode."""
    from specbench.drafters.ar import NoDraft
    from specbench.targets.transformers import NonFiniteLogits, TransformersTarget

    target = TransformersTarget(tiny.weights.module)
    calls = []

    def overflow(module, args, output):
        calls.append(output.shape[1])
        if len(calls) > 2:  # the prefill and a step are fine; then the model overflows
            return torch.full_like(output, float("nan"))
        return output

    handle = tiny.weights.module.lm_head.register_forward_hook(overflow)
    try:
        with pytest.raises(NonFiniteLogits) as raised:
            Decoder(target, frozenset(), 8).generate(prompt_ids[0], NoDraft(), 8)
    finally:
        handle.remove()
    message = str(raised.value)
    assert "\n" not in message and "not finite" in message and "float32" in message
    assert target.length == 0  # and the target was released


# --- every draw of a decode from that decode's seed (item 5) --------------------------------------------------

def test_a_sampled_draft_model_answer_does_not_depend_on_what_was_decoded_before(tiny, prompt_ids):
    from specbench.decoding.sampling import Sampling
    from specbench.drafters.draft_model import DraftModel

    sampling = Sampling(temperature=1.0, seed=3)
    drafter = DraftModel(drafts_by_family={"tiny-random": {"pruned": {"layers": 1, "selection": "first",
                                                                      "distill_tokens": 0}}}, gamma=3)
    drafter.prepare(tiny, sampling)
    decoder = Decoder(tiny.target, frozenset(), 8, sampling=sampling)
    alone = decoder.generate(prompt_ids[1], drafter, 24, seed=11)
    decoder.generate(prompt_ids[0], drafter, 24, seed=5)  # another question before it
    after_another = decoder.generate(prompt_ids[1], drafter, 24, seed=11)
    assert after_another.token_ids == alone.token_ids
    assert [step.accepted_tokens for step in after_another.steps] == [step.accepted_tokens for step in alone.steps]


# --- an answer's peak memory is its own (item 6) ----------------------------------------------------------------

def test_no_cache_of_the_previous_answer_is_held_when_the_peak_is_reset(tmp_path, monkeypatch):
    """Peaks are reset before every answer; by then neither the target nor a draft model may still hold the last
    decode's KV cache (about 7% of Vicuna-7B's peak at 2k tokens)."""
    from specbench.drafters.draft_model import DraftModel
    from specbench.targets.transformers import TransformersTarget

    targets, drafters, held = [], [], []
    original_init, original_begin = TransformersTarget.__init__, DraftModel.begin

    def init(self, model):
        targets.append(self)
        original_init(self, model)

    def begin(self, prompt_ids):
        drafters.append(self)
        original_begin(self, prompt_ids)

    def reset_peak(devices):
        held.append([target.length for target in targets] + [drafter.cache is not None for drafter in drafters])

    monkeypatch.setattr(TransformersTarget, "__init__", init)
    monkeypatch.setattr(DraftModel, "begin", begin)
    monkeypatch.setattr(gpu_memory, "reset_peak", reset_peak)
    cfg = compose(["model=tiny-random", "drafter=sps", "run.max_new_tokens=8", "task.tasks=[qa]",
                   "task.limit_per_task=2", "drafter.drafts_by_family.tiny-random.pruned.layers=1"])
    run_benchmark(cfg, str(tmp_path))
    assert len(held) == 4 and drafters  # two questions, method and baseline each
    assert all(not any(state) for state in held), held
