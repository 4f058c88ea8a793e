"""Checkpoints that do not load (models/hub.py): an empty model path, a directory without a checkpoint, a truncated
weight file in a local directory or in the hub cache are each one line naming the path and the fix (moved from
test_errors.py)."""

import os
from pathlib import Path

import pytest
from conftest import one_line

from specbench.config import compose
from specbench.errors import SpecbenchError
from specbench.testing import save_tiny_checkpoint


def truncate(file: Path) -> None:
    """Keep the first half of ``file``, as an interrupted download does. The half is a new file moved over the old
    one: truncating in place could pull pages from under a memory map of the earlier load (SIGBUS)."""
    half = file.with_name(file.name + ".half")
    half.write_bytes(file.read_bytes()[: file.stat().st_size // 2])
    os.replace(half, file)


def test_an_empty_model_path_is_refused(monkeypatch):
    from specbench import hub_cache
    from specbench.run.instantiate import build

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # before the fix this fell through to the hub id: never download
    monkeypatch.setattr(hub_cache, "hub_reachable", lambda: False)
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
    assert loaded.weights.architecture["num_hidden_layers"] == 1  # whole, the checkpoint loads: truncation is the only fault
    truncate(weights)
    with pytest.raises(SpecbenchError) as error:
        load_pretrained("tiny-ckpt", path=str(tmp_path / "ckpt"), device="cpu", prompt_format="plain")
    message = one_line(error)
    assert f"model.path={tmp_path / 'ckpt'}: weight file {weights} is damaged or truncated" in message
    assert message.endswith("download or build the checkpoint again")


def test_a_truncated_file_in_the_hub_cache_is_named(tmp_path, monkeypatch):
    import huggingface_hub

    from specbench import hub_cache
    from specbench.models import hub, load_pretrained

    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "hub" / "models--specbench-test--tiny"
    weights = save_tiny_checkpoint(repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(hub_cache, "hub_reachable", lambda: False)
    loaded = load_pretrained("tiny-hub", hub_id="specbench-test/tiny", device="cpu", prompt_format="plain")
    assert loaded.weights.architecture["num_hidden_layers"] == 1
    truncate(weights)
    with pytest.raises(SpecbenchError) as error:
        load_pretrained("tiny-hub", hub_id="specbench-test/tiny", device="cpu", prompt_format="plain")
    message = one_line(error)
    assert f"weight file {weights} is damaged or truncated" in message
    assert "hf download specbench-test/tiny --force-download" in message
