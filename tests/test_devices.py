"""Devices (models/devices.py): CUDA asked for where torch cannot give it is one line naming why (a CPU build,
CUDA_VISIBLE_DEVICES, an index past the count) before anything is written; auto without a usable GPU warns only
when one is there (moved from test_errors.py)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import H200, fake_nvidia_smi, one_line

from specbench.config import compose
from specbench.errors import SpecbenchError

REPO = Path(__file__).resolve().parent.parent


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
