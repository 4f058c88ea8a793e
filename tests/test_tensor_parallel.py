"""specbench under torchrun: two processes of tiny-random sharded by transformers' tensor parallelism
(``model.tp_plan=auto``, gloo on the CPU) give a drafter config's output exactly as one process does (four kinds
of drafter in the default run, every config in -m slow), rank 0 alone writes, and the settings that cannot be
shared between processes are refused with one line."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from specbench.config import compose, group_options
from specbench.errors import SpecbenchError
from specbench.testing import SMALL_MODEL_DB

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


# --standalone: a rendezvous on a free port chosen at run time, not torchrun's fixed 29500, which another job on the
# machine (another test run, a user's torchrun) may hold.
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node"]


# The processes run on the CPU (gloo) on any machine: with CUDA visible, transformers binds each to the GPU of its
# LOCAL_RANK, which a one-GPU machine does not have for the second.
CPU_ONLY = {"OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}


PACKAGE = str(Path(__file__).resolve().parents[1] / "specbench") + os.sep


def assert_no_traceback_of_ours(stderr: str) -> None:
    """No frame of specbench's in a job's output: torchrun's summary shows each failed process's record, and a user
    error's record is its line. (torchrun itself ends with a traceback of its own ChildFailedError whatever its
    processes did, in torch's frames alone.)"""
    assert f'File "{PACKAGE}' not in stderr
    assert stderr.count("Traceback (most recent call last)") <= 1


def assert_said_once(result: subprocess.CompletedProcess, *words: str) -> str:
    """A job refused by a user error: its line printed once (by rank 0, for every process), holding ``words``, and
    torchrun's summary giving that line as the root cause, with no traceback of specbench's. The line is returned."""
    assert result.returncode != 0
    said = [line for line in result.stderr.splitlines() if line.startswith("specbench: error: ")]
    assert len(said) == 1, result.stderr[-3000:]
    sentence = said[0].removeprefix("specbench: error: ")
    assert all(word in sentence for word in words), sentence
    root_cause = result.stderr.split("Root Cause (first observed failure):", 1)[1]
    assert f"traceback : {sentence}\n" in root_cause, result.stderr[-3000:]
    assert_no_traceback_of_ours(result.stderr)
    return sentence


def own_tmpdir(folder: Path) -> dict:
    """TMPDIR of ``folder``'s own (``folder``-tmp), so that what the processes leave in it is theirs alone: the
    shared temporary folder holds other jobs' files."""
    tmp = folder.with_name(f"{folder.name}-tmp")
    tmp.mkdir(parents=True, exist_ok=True)
    return {"TMPDIR": str(tmp)}


def sweep(sweep_dir: Path, extra: list[str], processes: int, drafters: list[str]) -> subprocess.CompletedProcess:
    """The ``drafters`` configs into ``sweep_dir``, in up to two sweeps: HD's with the tests' small model database
    (SMALL_MODEL_DB, keys the other configs do not have; ``++`` since Hydra first composes the sweep with the
    default drafter), then the others."""
    launcher = [sys.executable, "-m", "specbench"] if processes == 1 else [*TORCHRUN, str(processes), "-m", "specbench"]
    env = {**os.environ, **CPU_ONLY, **own_tmpdir(sweep_dir)}
    with_db = [name for name in drafters if name in MODEL_DB_DRAFTERS]
    others = [name for name in drafters if name not in MODEL_DB_DRAFTERS]
    for names, overrides in ((with_db, [f"++{override}" for override in SMALL_MODEL_DB]), (others, [])):
        if not names:
            continue
        command = [*launcher, "-m", f"drafter={','.join(names)}", *RUN, *overrides, *extra,
                   f"hydra.sweep.dir={sweep_dir}"]
        result = subprocess.run(command, capture_output=True, text=True, timeout=900, env=env)
        with open(sweep_dir.with_name(f"{sweep_dir.name}.log"), "a") as log:  # what the processes said (logs: stdout)
            log.write(result.stdout + result.stderr)
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
    # Scratch another job left in the shared temporary folder, as a concurrent or killed run leaves it: the test
    # must look only at what its own processes left.
    other_job = tempfile.mkdtemp(prefix="specbench-rank1-")
    try:
        yield run_placements(root, DEFAULT_DRAFTERS)
    finally:
        shutil.rmtree(other_job, ignore_errors=True)
    shutil.rmtree(root, ignore_errors=True)


def assert_same_outputs(one: dict, two: dict, drafters: list[str]) -> None:
    assert sorted(one) == sorted(two) == sorted(drafters)
    for drafter in drafters:
        assert two[drafter] == one[drafter], drafter
        assert all(new_tokens for _, _, new_tokens, _ in one[drafter])


@pytest.mark.slow  # the placements' torchrun processes (about 20 s): behind slow for the default run's 8 minutes (CI runs it)
def test_these_drafters_give_one_process_output_under_tensor_parallelism(placements):
    assert set(DEFAULT_DRAFTERS) <= set(DRAFTERS)
    one, two, _ = placements
    assert_same_outputs(one, two, DEFAULT_DRAFTERS)


@pytest.mark.slow
def test_every_drafter_config_gives_one_process_output_under_tensor_parallelism(tmp_path):
    one, two, _ = run_placements(tmp_path, DRAFTERS)
    assert_same_outputs(one, two, DRAFTERS)


@pytest.mark.slow  # the placements' torchrun processes (about 20 s): behind slow for the default run's 8 minutes (CI runs it)
def test_rank_zero_alone_writes_and_records_the_placement(placements):
    _, _, root = placements
    run_dirs = sorted((root / "two").glob("*/run.json"))
    assert len(run_dirs) == len(DEFAULT_DRAFTERS)
    settings = json.loads(run_dirs[0].read_text())
    assert settings["model_config"]["tp_plan"] == "auto"
    # The weights' fingerprint gathers the shards: the same model as one process with the same kernels.
    one = json.loads(sorted((root / "one").glob("*/run.json"))[0].read_text())
    assert settings["weights_fingerprint"] == one["weights_fingerprint"]
    assert (root / "two-tmp").is_dir() and not list((root / "two-tmp").glob("specbench-rank1-*"))  # scratch gone
    # rank 0 alone prints each run's summary (rank 1's would show its scratch folder's numbers under rank 0's path)
    assert (root / "two.log").read_text().count("\ntiny-random / ") == len(DEFAULT_DRAFTERS)


def run_directory(sweep_dir: Path, drafter: str) -> Path:
    return next(path.parent for path in sweep_dir.glob("*/run.json")
                if json.loads(path.read_text())["drafter"]["name"] == drafter)


def launch(processes: int, overrides: list[str], tmp_path: Path, python: str = sys.executable):
    """``python -m specbench`` with ``overrides``, under torchrun with ``processes`` processes (one: alone)."""
    launcher = [python, "-m", "specbench"] if processes == 1 else [
        python, *TORCHRUN[1:], str(processes), "-m", "specbench"]
    return subprocess.run([*launcher, *overrides], capture_output=True, text=True, timeout=600,
                          cwd=Path(__file__).resolve().parents[1],
                          env={**os.environ, **CPU_ONLY, **own_tmpdir(tmp_path / "job"),
                               "PYTHONPATH": str(Path(__file__).resolve().parents[1])})


@pytest.mark.slow  # torchrun processes, 2 and 4 (tens of seconds on 2 cores), behind slow like the placements (CI runs it)
@pytest.mark.parametrize("made_by,resumed_by,difference", [
    ("one", 2, "processes: 1 -> 2"),
    ("two", 4, "processes: 2 -> 4"),
    ("two", 1, "processes: 2 -> 1"),
])
def test_resuming_in_another_placement_is_one_line_from_rank_zero(placements, tmp_path, made_by, resumed_by,
                                                                   difference):
    _, _, root = placements
    run = run_directory(root / made_by, "pld")
    before = (run / "answers.jsonl").read_text()
    placement = ["model.tp_plan=auto"] if resumed_by > 1 else []
    # quoted: the sweep named the directory by its override (drafter=pld), and Hydra parses an override's '='
    result = launch(resumed_by, ["drafter=pld", *RUN, *placement, f"hydra.run.dir='{run}'"], tmp_path)
    if resumed_by == 1:
        assert result.returncode == 2 and result.stderr.splitlines()[-1].startswith("specbench: error: ")
        assert difference in result.stderr and "Traceback" not in result.stderr
    else:
        assert_said_once(result, difference, "holds results of a run with other settings")
    assert (run / "answers.jsonl").read_text() == before


@pytest.mark.slow  # four torchrun processes (tens of seconds on 2 cores): behind slow like the placements (CI runs it)
def test_a_model_the_processes_cannot_split_is_one_line_from_rank_zero(tmp_path):
    result = launch(4, [*RUN, "model.tp_plan=auto", f"hydra.run.dir={tmp_path / 'run'}"], tmp_path)
    assert_said_once(result, "over 4 processes cannot split its num_key_value_heads=2", "run 2 processes")


@pytest.mark.slow  # torchrun processes of the vLLM environment's python, each importing vLLM
@pytest.mark.parametrize("placement,words", [
    (["model.tp_plan=auto"], "engine=vllm runs in one process"),
    ([], "model.tp_plan is null"),
])
def test_engine_vllm_under_torchrun_is_one_line_from_rank_zero(tmp_path, placement, words):
    from test_vllm_env import vllm_python

    result = launch(2, [*RUN, "engine=vllm", *placement, f"hydra.run.dir={tmp_path / 'run'}"], tmp_path,
                    python=vllm_python())
    assert "engine=vllm" in assert_said_once(result, words)
    assert not (tmp_path / "run" / "run.json").exists()


# What transformers' Llama plan does to tiny-random (conf/model/tiny-random.yaml: hidden 64, intermediate 128, 4
# heads of 16, 2 key/value heads, 258 tokens) over 2 processes, restated by hand: column-wise layers split their
# output dimension (0), row-wise ones their input (1), the embeddings their vocabulary.
EXPECTED_SHARDS = {
    "model.embed_tokens.weight": ([258, 64], [129, 64]),
    "model.layers.0.self_attn.q_proj.weight": ([64, 64], [32, 64]),
    "model.layers.0.self_attn.k_proj.weight": ([32, 64], [16, 64]),
    "model.layers.0.self_attn.v_proj.weight": ([32, 64], [16, 64]),
    "model.layers.0.self_attn.o_proj.weight": ([64, 64], [64, 32]),
    "model.layers.0.mlp.gate_proj.weight": ([128, 64], [64, 64]),
    "model.layers.0.mlp.up_proj.weight": ([128, 64], [64, 64]),
    "model.layers.0.mlp.down_proj.weight": ([64, 128], [64, 64]),
}


@pytest.mark.slow  # the placements' torchrun processes (about 20 s): behind slow for the default run's 8 minutes (CI runs it)
def test_each_process_holds_a_shard_of_the_expected_shape(placements):
    """Equal outputs would hold for two whole copies too: each process must hold half of every sharded weight."""
    _, _, root = placements
    marker = "tensor-parallel shards: "
    reports = [line.split(marker, 1)[1] for line in (root / "two.log").read_text().splitlines() if marker in line]
    assert len(reports) == len(DEFAULT_DRAFTERS)  # one per run of the sweep, each from rank 0 for every rank
    for report in reports:
        shards = json.loads(report)
        for name, (full, local) in EXPECTED_SHARDS.items():
            assert shards[name] == {"full": full, "local": [local, local]}, name
        for name, shard in shards.items():  # and whatever else is sharded: 1/2 of one dimension on each rank
            for shape in shard["local"]:
                split = [dim for dim, (whole, part) in enumerate(zip(shard["full"], shape)) if whole != part]
                assert len(split) == 1 and shape[split[0]] * 2 == shard["full"][split[0]], (name, shard)


# One process fails (a user error on rank 1 alone) while rank 0 waits for it in a collective.
RANK_FAILS = """
import sys
import torch
from specbench import torchrun_errors
from specbench.distributed import Processes
from specbench.errors import SpecbenchError

torchrun_errors.SPEAKER_WAIT_S = 0.5  # rank 1 fails alone: the wait for rank 0 to say it is in vain
processes = Processes.from_environment("auto", "cpu")


def work():
    if processes.rank == 1:
        raise SpecbenchError("question 7 does not fit the context")
    torch.distributed.barrier()  # rank 1 never comes
    return "finished"


try:
    print(processes.run(work))
except SpecbenchError as error:
    torchrun_errors.say_user_error(str(error))  # as python -m specbench says it
    sys.exit(2)
"""


def test_a_process_that_fails_gives_the_others_one_line(tmp_path):
    script = tmp_path / "rank_fails.py"
    script.write_text(RANK_FAILS)
    result = subprocess.run([*TORCHRUN, "2", str(script)], capture_output=True, text=True, timeout=300,
                            cwd=Path(__file__).resolve().parents[1],
                            env={**os.environ, **CPU_ONLY, **own_tmpdir(tmp_path / "job"),
                                 "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    assert result.returncode != 0 and "finished" not in result.stdout
    lines = result.stderr.splitlines()
    assert "specbench: error: question 7 does not fit the context" in lines  # rank 1, as alone
    assert "specbench: error: rank 1 of 2 failed: question 7 does not fit the context; see its output" in lines
    # and nothing of gloo's: no traceback from rank 0's collective
    assert not [line for line in lines if "gloo" in line.lower() or "barrier" in line]
    assert_no_traceback_of_ours(result.stderr)


@pytest.mark.parametrize("overrides,message", [
    (["model.tp_plan=auto"], "shards the model over processes, one per device, and this job has 1: run it under torchrun"),
    (["model.tp_plan=auto", "model.device_map=cpu"], "set model.tp_plan or model.device_map, not both"),
    (["model.device_map=auto"], "places layers on GPUs, but torch sees none"),
])
def test_placements_that_cannot_run_are_one_line(overrides, message):
    from specbench.config import compose
    from specbench.errors import SpecbenchError
    from specbench.run.instantiate import build

    with pytest.raises(SpecbenchError, match=message) as refused:
        build(compose(["model=tiny-random", *overrides]).model, device="cpu")
    assert "\n" not in str(refused.value)


@pytest.mark.slow  # torchrun processes: moved behind slow to keep the default run under 8 minutes on 2 cores (CI runs it)
@pytest.mark.parametrize("overrides,message", [
    ([], "model.tp_plan is null"),
    (["model.tp_plan=auto", "run.draft_budget=auto"], "run.draft_budget=auto decides every step"),
])
def test_what_processes_cannot_share_is_refused_under_torchrun(tmp_path, overrides, message):
    # With torchrun's default port held (as another job on the machine may hold it): the launch must not need it.
    with socket.socket() as default_port:
        try:
            default_port.bind(("127.0.0.1", 29500))
            default_port.listen()
        except OSError:
            pass  # another job holds it already: the same case
        result = subprocess.run([*TORCHRUN, "2", "-m", "specbench",
                                 "model=tiny-random", *overrides, f"hydra.run.dir={tmp_path / 'run'}"],
                                capture_output=True, text=True, timeout=300,
                                env={**os.environ, **CPU_ONLY, **own_tmpdir(tmp_path / "run")})
    assert_said_once(result, message)
    assert not (tmp_path / "run" / "run.json").exists()


class FakeCollectives:
    """torch.distributed as a torchrun process sees it before its group starts, recording what it is asked."""

    def __init__(self, monkeypatch, world_size: int = 2, rank: int = 1):
        import torch

        self.backend = self.device = None
        for key, value in {"WORLD_SIZE": world_size, "RANK": rank, "LOCAL_RANK": rank}.items():
            monkeypatch.setenv(key, str(value))
        distributed = torch.distributed
        monkeypatch.setattr(distributed, "is_initialized", lambda: self.backend is not None)
        monkeypatch.setattr(distributed, "init_process_group", self.init)
        monkeypatch.setattr(distributed, "new_group", lambda backend: f"group({backend})")
        monkeypatch.setattr(distributed, "get_rank", lambda: rank)
        monkeypatch.setattr(distributed, "get_world_size", lambda: world_size)
        monkeypatch.setattr(torch.cuda, "set_device", lambda device: setattr(self, "device", device))

    def init(self, backend, rank, world_size, timeout):
        self.backend = backend


def pretend_gpus(monkeypatch, count: int, counted_already: bool = False):
    """torch as on a machine with ``count`` GPUs: it sees them unless CUDA_VISIBLE_DEVICES hid them before torch
    counted them (``counted_already``: something counted them first)."""
    import torch

    def visible() -> int:
        return count if counted_already or os.environ.get("CUDA_VISIBLE_DEVICES") != "" else 0

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: visible() > 0)
    monkeypatch.setattr(torch.cuda, "device_count", visible)
    monkeypatch.setattr(torch._C, "_get_accelerator", lambda: torch.device("cuda" if visible() else "cpu"))


def test_a_cpu_job_on_a_gpu_machine_uses_gloo_with_cuda_hidden(monkeypatch):
    from specbench.distributed import Processes

    pretend_gpus(monkeypatch, 1)
    fake = FakeCollectives(monkeypatch)
    processes = Processes.from_environment("auto", "cpu")
    assert (fake.backend, fake.device, processes.rank, processes.world_size) == ("gloo", None, 1, 2)
    assert os.environ["CUDA_VISIBLE_DEVICES"] == ""  # transformers sees no accelerator to bind rank 1 to


def test_a_gpu_job_uses_nccl_one_gpu_per_process_and_refuses_more_processes_than_gpus(monkeypatch):
    from specbench.distributed import Processes
    from specbench.errors import SpecbenchError

    pretend_gpus(monkeypatch, 2)
    fake = FakeCollectives(monkeypatch)
    Processes.from_environment("auto", "auto")
    assert (fake.backend, fake.device) == ("nccl", 1)
    assert os.environ.get("CUDA_VISIBLE_DEVICES") is None

    pretend_gpus(monkeypatch, 1)
    fake = FakeCollectives(monkeypatch)
    with pytest.raises(SpecbenchError, match=r"2 processes, one per GPU, but torch sees 1 GPU\(s\)") as refused:
        Processes.from_environment("auto", "cuda")
    assert fake.backend is None and "\n" not in str(refused.value)
    with pytest.raises(SpecbenchError, match="every process takes the GPU of its LOCAL_RANK"):
        Processes.from_environment("auto", "cuda:0")  # one GPU named for every process


def test_a_cpu_job_whose_gpus_were_counted_already_is_one_line(monkeypatch):
    from specbench.distributed import Processes
    from specbench.errors import SpecbenchError

    pretend_gpus(monkeypatch, 1, counted_already=True)
    fake = FakeCollectives(monkeypatch)
    with pytest.raises(SpecbenchError, match="CUDA_VISIBLE_DEVICES= torchrun") as refused:
        Processes.from_environment("auto", "cpu")
    assert fake.backend is None and "\n" not in str(refused.value)


@pytest.mark.parametrize("device_map,named", [
    ({"model.embed_tokens": 0, "model.layers.0": 0, "model.layers.1": "cpu", "lm_head": "disk"},
     "model.layers.1 (cpu), lm_head (disk)"),
    ({"model": "cuda:0", "lm_head": "cpu"}, "lm_head (cpu)"),
    ({"": "disk"}, "(the whole model) (disk)"),
])
def test_a_device_map_that_offloads_is_refused_naming_the_modules(device_map, named):
    from types import SimpleNamespace

    from omegaconf import OmegaConf

    from specbench.errors import SpecbenchError
    from specbench.models.placement import check_loaded_placement, choose_placement

    for given in (device_map, OmegaConf.create(device_map)):  # as written in a config, or as Python gives it
        with pytest.raises(SpecbenchError, match="offloads") as refused:
            choose_placement("tiny-random", None, given, __import__("torch").device("cpu"))
        assert named in str(refused.value) and "\n" not in str(refused.value)
    # accelerate's own choice (device_map=auto on GPUs too small), read from the loaded model
    with pytest.raises(SpecbenchError, match="accelerate's placement") as refused:
        check_loaded_placement(SimpleNamespace(hf_device_map=device_map))
    assert named in str(refused.value)


def test_a_device_map_on_gpus_alone_or_on_the_cpu_alone_is_no_offload():
    from types import SimpleNamespace

    from specbench.models.placement import check_loaded_placement

    for placed in ({"": "cpu"}, {"model.layers.0": 0, "model.layers.1": 1, "lm_head": "cuda:1"}, {}):
        check_loaded_placement(SimpleNamespace(hf_device_map=placed))


@pytest.mark.parametrize("processes,overrides,named,fits", [
    (3, [], "num_attention_heads=4, num_key_value_heads=2", "run 2 processes"),
    (2, ["model.alphabet=abc"], "vocab_size=5", "no common divisor above 1"),
])
def test_shapes_the_processes_cannot_split_are_refused_before_loading(monkeypatch, processes, overrides, named, fits):
    from transformers import AutoModelForCausalLM

    from specbench.errors import SpecbenchError
    from specbench.run.instantiate import build

    monkeypatch.setenv("WORLD_SIZE", str(processes))  # as torchrun sets it; nothing here joins a process group
    loads = []
    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", lambda *args, **kwargs: loads.append(args))
    refusal = f"over {processes} processes cannot split its {named}: .*{fits}"
    with pytest.raises(SpecbenchError, match=refusal) as refused:
        build(compose(["model=tiny-random", "model.tp_plan=auto", *overrides]).model, device="cpu")
    assert "\n" not in str(refused.value) and not loads  # refused before any weights were loaded


def test_a_checkpoint_the_processes_cannot_split_is_refused_from_its_config(monkeypatch, tmp_path):
    """A checkpoint directory: its config is read and refused before any weights load (here there are none)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig

    from specbench.errors import SpecbenchError
    from specbench.models.hub import load_pretrained

    LlamaConfig(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, vocab_size=32001).save_pretrained(tmp_path)
    monkeypatch.setenv("WORLD_SIZE", "2")
    loads = []
    monkeypatch.setattr(AutoTokenizer, "from_pretrained", lambda *args, **kwargs: object())
    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", lambda *args, **kwargs: loads.append(args))
    with pytest.raises(SpecbenchError, match=r"model 'odd-vocab': .* 2 processes cannot split its vocab_size=32001:"):
        load_pretrained("odd-vocab", path=str(tmp_path), device="cpu", dtype="float32", prompt_format="plain",
                        tp_plan="auto")
    assert not loads


class Loaded(SpecbenchError):
    """Raised by the spy once from_pretrained was reached: nothing past it is under test (a SpecbenchError, which
    the checkpoint loader lets through as it is)."""


def spy_from_pretrained(monkeypatch, loads: list):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    def from_pretrained(source, **kwargs):
        loads.append({key: kwargs.get(key) for key in ("tp_plan", "device_map", "distributed_config")})
        raise Loaded

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", from_pretrained)
    monkeypatch.setattr(AutoTokenizer, "from_pretrained", lambda *args, **kwargs: object())


def load_tiny(monkeypatch, tmp_path):
    from specbench.run.instantiate import build

    build(compose(["model=tiny-random", "model.tp_plan=auto"]).model, device="cpu")


def load_checkpoint(monkeypatch, tmp_path):
    from transformers import LlamaConfig

    from specbench.models.hub import load_pretrained

    LlamaConfig(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, vocab_size=32000).save_pretrained(tmp_path)
    load_pretrained("even", path=str(tmp_path), device="cpu", dtype="float32", prompt_format="plain", tp_plan="auto")


def load_gguf_file(monkeypatch, tmp_path):
    from transformers import LlamaConfig

    import specbench.models.gguf as gguf

    converted = tmp_path / "converted"
    LlamaConfig(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, vocab_size=32000).save_pretrained(converted)
    (tmp_path / "model.gguf").write_bytes(b"GGUF")
    # The conversion (dequantizing a real GGUF file) stands aside: it gives the converted checkpoint's directory.
    monkeypatch.setattr(gguf, "GgufConversion", lambda *args: type("Converted", (), {"get": lambda self: converted})())
    gguf.load_gguf("even", str(tmp_path / "model.gguf"), device="cpu", cache_dir=str(tmp_path / "cache"),
                   prompt_format="plain", tp_plan="auto")


@pytest.mark.parametrize("load", [load_tiny, load_checkpoint, load_gguf_file])
def test_every_loader_hands_the_tensor_parallel_plan_to_from_pretrained(monkeypatch, tmp_path, load):
    """Two whole copies decode what two shards do, so only the shard shapes (torchrun, slow) would see a plan left
    out: here, without processes, the value that reaches transformers from each loader."""
    monkeypatch.setenv("WORLD_SIZE", "2")  # as torchrun sets it; nothing here joins a process group
    loads = []
    spy_from_pretrained(monkeypatch, loads)
    with pytest.raises(Loaded):
        load(monkeypatch, tmp_path)
    assert loads == [{"tp_plan": "auto", "device_map": None, "distributed_config": None}]
