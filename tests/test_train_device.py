"""The one trainer trains a head where the target ran (specbench/training/heads.py ``place``, ``train``,
``acceptance``; the kinds' hooks): what a CPU can check of a GPU path.

A head on a GPU fails the moment one tensor of its arithmetic stays on the host. torch's ``meta`` device is strict
the same way (an operation mixing it with a host tensor raises "not on the expected device", as CUDA's does, and a
host 0-dim tensor is a scalar to both), and it computes shapes only. So each kind's loss, its backward, the optimizer
and the trainer's loop run here with the head, its labels and every batch on ``meta``: a tensor the code makes on the
host where it should follow the batch fails these tests as it would fail on a GPU. What meta cannot do, read a
number back, is stubbed as 0.0 for meta tensors alone (``numbers_from_meta``). scripts/gpu_check.py's row 5 runs the
same training on a real GPU against the CPU's."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import specbench.training.heads as training
from specbench.artefacts.trained_head import build_trained_head, training_device_name
from specbench.training import methods
from specbench.training.heads import Labels, make_batch, place, recipe_of, target_sequences

META = torch.device("meta")
KINDS = {  # each kind's recipe, small: a few steps of a tiny head
    "eagle": {"noise": 0.2},
    "eagle3": {"feature_layers": [0, 1, 2], "draft_vocab_size": 64, "ttt_steps": 2},
    "medusa": {"heads": 2},
    "hydra": {"num_heads": 2, "num_layers": 2, "dropout_rate": 0.1},
}
CONVERSATIONS = [([1, 20, 30, 40], [50, 60, 70, 80, 90, 100, 110]), ([1, 25, 35], [45, 55, 65, 75, 85]),
                 ([1, 21, 31], [41, 51, 61, 71]), ([1, 22, 32, 42, 52], [62, 72, 82])]


@pytest.fixture
def numbers_from_meta(monkeypatch):
    """``float(t)`` and ``t.item()`` of a meta tensor give 0.0 (a meta tensor holds no number), and a boolean mask
    on meta selects every element (its count is data); every other tensor reads as before."""
    import torch.fx.experimental._config as fx_config

    to_float, item = torch.Tensor.__float__, torch.Tensor.item
    monkeypatch.setattr(torch.Tensor, "__float__", lambda self: 0.0 if self.is_meta else to_float(self))
    monkeypatch.setattr(torch.Tensor, "item", lambda self: 0.0 if self.is_meta else item(self))
    # torch's own patch, not monkeypatch's: pytest 9.2 undoes a setattr on a module by deleting the attribute when
    # the module's __dict__ lacked it, and on torch's config module that deletes the setting itself.
    with fx_config.patch(meta_nonzero_assume_all_nonzero=True):
        yield


def recipe(kind: str, **common):
    return recipe_of(kind, {"train_steps": 3, "batch_sequences": 2, "held_out": 1, "warmup_steps": 1,
                            **KINDS[kind], **common})


def prepared(tiny, kind: str):
    """A new head of ``kind`` for ``tiny``, its labels and its training sequences, as the build makes them (on the
    host)."""
    module = methods.module(kind)
    spec = recipe(kind)
    layers = tuple(module.feature_layers(kind, tiny.num_layers, spec))
    sequences = target_sequences(tiny, CONVERSATIONS, layers, "test")
    head = module.new_head(tiny, kind, spec, sequences)
    draft_ids = getattr(module, "draft_ids", None)
    labels = Labels(tiny, draft_ids(head, kind) if draft_ids is not None else None)
    return module, spec, head, labels, sequences


def on_meta(tensors) -> bool:
    return all(tensor.device == META for tensor in tensors)


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_each_kinds_loss_backward_and_chain_run_where_the_head_is(tiny, kind, numbers_from_meta):
    module, spec, head, labels, sequences = prepared(tiny, kind)
    head = place(head, module, kind, META)
    labels.to(META)
    assert on_meta(head.parameters()) and on_meta(head.buffers()) and labels.weight.is_meta
    if kind == "hydra":  # held outside the module tree: the hook moves it too
        assert head.target_embedding.is_meta
    depth = training.batch_depth(module, kind, spec)
    batch = make_batch(sequences, depth).to(META)
    generator = torch.Generator().manual_seed(5)  # the host's, as train() gives it: noise and dropout follow the batch
    loss, parts = module.loss(head, labels, batch, kind, spec, generator)
    assert loss.is_meta and loss.shape == () and parts
    loss.backward()
    trained = [parameter for parameter in head.parameters() if parameter.requires_grad]
    assert trained and all(parameter.grad is not None and parameter.grad.is_meta for parameter in trained)
    positions = training.chain_positions(module, kind, spec)
    chain = module.chain_tokens(head, labels, make_batch(sequences, positions).to(META), kind, positions)
    assert chain.is_meta and chain.shape == (len(sequences), batch.features.shape[1], positions)


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_the_trainer_trains_on_the_heads_device(tiny, kind, tmp_path, numbers_from_meta, monkeypatch):
    """train() moves every batch to the head's device and steps the optimizer there; nothing of the training goes
    back to the host but the numbers it logs."""
    module, spec, head, labels, sequences = prepared(tiny, kind)
    head = place(head, module, kind, META)
    labels.to(META)
    seen = []
    original = module.loss

    def loss(head, labels, batch, kind, recipe, generator):
        seen.append({name: getattr(batch, name).device.type for name in vars(batch)})
        return original(head, labels, batch, kind, recipe, generator)

    monkeypatch.setattr(module, "loss", loss)
    monkeypatch.setattr(training, "_save_checkpoint", lambda *args, **kwargs: None)  # meta holds nothing to save
    losses, _ = training.train(head, labels, sequences, kind, spec, tmp_path / "staging", {"test": kind})
    assert len(losses) == 3 and len(seen) == 3
    assert all(set(devices.values()) == {"meta"} for devices in seen), seen
    assert on_meta(head.parameters())


def test_the_head_trains_where_the_target_ran_and_the_manifest_says_where(tiny, tmp_path, monkeypatch, caplog):
    """The build places the head on the target's device (here the CPU: the GPU's run is gpu_check's row 5) and the
    manifest records it; the one line said before training names it."""
    import logging

    import specbench.artefacts.trained_head as trained_heads

    monkeypatch.setattr(trained_heads, "training_conversations", lambda target, recipe: CONVERSATIONS * 2)
    placed = []
    original = training.place

    def spy(head, module, kind, device):
        placed.append(device)
        return original(head, module, kind, device)

    monkeypatch.setattr(trained_heads, "place", spy)
    with caplog.at_level(logging.INFO, logger="specbench.artefacts.trained_head"):
        manifest = build_trained_head(tiny, tmp_path / "head", "medusa", train_steps=2, batch_sequences=2,
                                      held_out=2, warmup_steps=0, heads=2)
    assert placed == [tiny.device] and manifest["trained_on"] == "cpu"
    assert "the medusa head trains on cpu in float32" in caplog.text
    assert "no GPU path" not in caplog.text


def test_the_device_name_in_a_manifest(monkeypatch):
    assert training_device_name(torch.device("cpu")) == "cpu"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device: "NVIDIA H200")
    assert training_device_name(torch.device("cuda:0")) == "cuda:0 (NVIDIA H200)"


def test_an_eagle_heads_chain_reads_the_labels_copy_of_the_lm_head_not_the_targets_module(tiny):
    """EAGLE-1's draft logits are the target's lm_head; the chain the trainer measures takes them from the labels'
    float32 copy, on the head's device, so a target on a GPU or in half precision is never multiplied with the
    head's float32 outputs."""
    module, spec, head, labels, sequences = prepared(tiny, "eagle")
    batch = make_batch(sequences, 2)
    expected = module.chain_tokens(head, labels, batch, "eagle", 2)

    class Refusing(torch.nn.Module):
        def forward(self, out):
            raise AssertionError("the target's own lm_head was called")

    object.__setattr__(head, "target_lm_head", Refusing())
    assert torch.equal(module.chain_tokens(head, labels, batch, "eagle", 2), expected)
    assert Path(training.__file__).name == "heads.py"  # the trainer these tests pin


def test_a_head_that_runs_out_of_gpu_memory_is_one_line_naming_the_host_build(tiny, tmp_path, monkeypatch):
    import specbench.artefacts.trained_head as trained_heads
    from specbench.errors import SpecbenchError

    monkeypatch.setattr(trained_heads, "training_conversations", lambda target, recipe: CONVERSATIONS * 2)

    def out_of_memory(*args, **kwargs):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 23.6 GiB total)\nmore")

    monkeypatch.setattr(trained_heads, "train", out_of_memory)
    with pytest.raises(SpecbenchError) as raised:
        build_trained_head(tiny, tmp_path / "head", "medusa", train_steps=2, batch_sequences=2, held_out=2, heads=2)
    message = str(raised.value)
    assert "\n" not in message and "ran out of GPU memory" in message and "Tried to allocate 2.00 GiB" in message
    assert message.endswith("--train-device cpu") and "scripts/train_head.py --model tiny-random --kind medusa" in message
    with pytest.raises(SpecbenchError, match="train_device='gpu' is unknown; choose one of target, cpu"):
        build_trained_head(tiny, tmp_path / "head", "medusa", train_device="gpu", heads=2)


def test_medusa_leaves_the_labels_on_the_host_and_the_others_take_them_along(tiny, tmp_path, monkeypatch):
    """Medusa's hard labels never read the target's lm_head copy, so it stays on the host (vocabulary x hidden in
    float32 is gigabytes for a large vocabulary); every other kind's labels go where the head trains."""
    import specbench.artefacts.trained_head as trained_heads

    monkeypatch.setattr(trained_heads, "training_conversations", lambda target, recipe: CONVERSATIONS * 2)
    moved = []
    monkeypatch.setattr(training.Labels, "to", lambda self, device: moved.append(device) or self)
    build_trained_head(tiny, tmp_path / "medusa", "medusa", train_steps=1, batch_sequences=2, held_out=2, heads=2)
    assert moved == []
    build_trained_head(tiny, tmp_path / "hydra", "hydra", train_steps=1, batch_sequences=2, held_out=2,
                       **KINDS["hydra"])
    assert moved == [tiny.device]
    assert methods.module("medusa").READS_LABELS is False
    assert all(getattr(methods.module(kind), "READS_LABELS", True) for kind in ("eagle", "eagle3", "hydra"))


def test_train_device_cpu_trains_on_the_host(tiny, tmp_path, monkeypatch):
    import specbench.artefacts.trained_head as trained_heads

    monkeypatch.setattr(trained_heads, "training_conversations", lambda target, recipe: CONVERSATIONS * 2)
    placed = []
    monkeypatch.setattr(trained_heads, "place", lambda head, module, kind, device: placed.append(device) or head)
    # a target said to run elsewhere (its features still come from the host)
    monkeypatch.setattr(type(tiny), "device", property(lambda self: META))
    manifest = build_trained_head(tiny, tmp_path / "head", "medusa", train_steps=1, batch_sequences=2, held_out=2,
                                  train_device="cpu", heads=2)
    assert placed == [torch.device("cpu")] and manifest["trained_on"] == "cpu"
