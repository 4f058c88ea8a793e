"""Whether heads train on a device as they train on the host (the GPU check's row 5: scripts/gpu_check.py,
``specbench.device_check``): each kind's head trained a few steps by the one trainer (``training.heads``) on the
device and on the host from the same start and the same data, its losses, weights and chains compared; and what a
whole build's manifest must say. The comparison is pure (``training_verdict``, ``weight_distance``,
``build_verdict``) and checked on hand-built numbers (tests/test_gpu_check.py)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch

# Each kind's recipe for the check: a few steps of a small head on tiny-random (the trainer's settings otherwise),
# at learning rates that move every kind's head well away from its start in those steps.
TRAINING_KINDS = {
    "eagle": {"noise": 0.2, "lr": 3e-3},
    "eagle3": {"feature_layers": [0, 1, 2], "draft_vocab_size": 64, "ttt_steps": 2, "lr": 3e-3},
    "medusa": {"heads": 2, "lr": 3e-3},
    "hydra": {"num_heads": 2, "num_layers": 2, "dropout_rate": 0.1, "lr": 3e-3},
    "longspec": {"lr": 3e-3},
}
TRAINING_STEPS = 8
LOSS_TOLERANCE = 1e-3  # relative, per step: float32 on the device against float32 on the host
# The device's trained weights against the host's, relative to how far training moved them: a device whose updates
# went nowhere is 1.0 away, float32's differences between the two are orders of magnitude under this.
WEIGHT_TOLERANCE = 1e-2
CHAIN_AGREEMENT = 0.99  # the share of the trained heads' chain tokens the two runs must draft alike (near-ties aside)


def training_conversations(vocab: int, count: int = 8) -> list[tuple[list[int], list[int]]]:
    """(prompt, answer) token ids drawn at random (seeded): the trainer reads the target's features of whatever it
    is given, and the check compares two devices on the same data, not what a head learns."""
    rng = np.random.default_rng(7)
    return [(rng.integers(3, vocab, 12).tolist(), rng.integers(3, vocab, 40).tolist()) for _ in range(count)]


def training_recipe(kind: str):
    """The check's recipe of ``kind`` (TRAINING_KINDS, TRAINING_STEPS steps of 2 sequences, nothing held out)."""
    from specbench.training.heads import recipe_of

    return recipe_of(kind, {"train_steps": TRAINING_STEPS, "batch_sequences": 2, "held_out": 0, "warmup_steps": 1,
                            **TRAINING_KINDS[kind]})


def train_on(model, kind: str, sequences: list, scratch: Path) -> dict:
    """A head of ``kind`` for ``model`` trained on ``model``'s device as ``build_trained_head`` trains one (a new head
    on the host, placed on the device with its labels, ``train``), over the given ``sequences`` (the target's features
    on the host, computed once for both runs); its chains over the same sequences; saved and loaded back by the
    kind's hooks. Returns the losses, the seconds, the weights before and after (on the host), the chains and the
    devices the head's parameters were on."""
    from specbench.training import methods
    from specbench.training.heads import Labels, batch_depth, chain_positions, make_batch, place, train

    module = methods.module(kind)
    recipe = training_recipe(kind)
    head = module.new_head(model, kind, recipe, sequences)
    initial = {name: tensor.detach().clone() for name, tensor in head.named_parameters() if tensor.requires_grad}
    draft_ids = getattr(module, "draft_ids", None)
    labels = Labels(model, draft_ids(head, kind) if draft_ids is not None else None)
    head = place(head, module, kind, model.device)
    labels.to(model.device)
    losses, seconds = train(head, labels, sequences, kind, recipe, scratch / f"{kind}-{model.device.type}",
                            {"gpu_check": kind})
    where = {str(tensor.device) for tensor in head.parameters()}
    positions = chain_positions(module, kind, recipe)
    head.eval()
    with torch.no_grad():
        batch = make_batch(sequences, batch_depth(module, kind, recipe)).to(model.device)
        chain = module.chain_tokens(head, labels, batch, kind, positions).cpu()
    trained = {name: tensor.detach().cpu() for name, tensor in head.named_parameters() if name in initial}
    saved = scratch / f"{kind}-{model.device.type}-head"
    module.save(head, kind, saved)
    module.load(model, saved, kind)  # strict: it fits the target it was trained for
    return {"losses": losses, "seconds": seconds, "devices": where, "initial": initial, "trained": trained,
            "chain": chain}


def weight_distance(there: dict, here: dict) -> float:
    """||trained there - trained here|| / ||trained here - initial||: 0 for the same training, 1 for a device run that
    never moved its head; infinite when the host's training did not move it either."""
    apart = sum(float((there["trained"][name] - here["trained"][name]).float().pow(2).sum()) for name in here["trained"])
    moved = sum(float((here["trained"][name] - here["initial"][name]).float().pow(2).sum()) for name in here["trained"])
    return float("inf") if moved == 0 else (apart / moved) ** 0.5


def training_verdict(there: dict, here: dict, device: torch.device) -> tuple[str, str]:
    """PASS when the head stayed on ``device``, every loss is finite, and the device's run (``there``, as
    ``train_on`` returns it) is the host's (``here``): each step's loss within LOSS_TOLERANCE (relative), the trained
    weights within WEIGHT_TOLERANCE of the host's (relative to how far training moved them) and at least
    CHAIN_AGREEMENT of the chain tokens alike; (status, detail)."""
    problems = []
    if {torch.device(name).type for name in there["devices"]} != {device.type}:
        problems.append(f"the head's parameters are on {sorted(there['devices'])}")
    if not all(math.isfinite(loss) for loss in there["losses"]):
        problems.append("a loss is not finite")
    worst = max((abs(a - b) / max(abs(b), 1e-8) for a, b in zip(there["losses"], here["losses"])), default=0.0)
    if len(there["losses"]) != len(here["losses"]) or worst > LOSS_TOLERANCE:
        problems.append(f"losses differ from the host's by up to {worst:.1e} (relative)")
    distance = weight_distance(there, here)
    if not distance <= WEIGHT_TOLERANCE:
        problems.append(f"trained weights {distance:.2g} of the training's own movement away from the host's"
                        if math.isfinite(distance) else "training did not move the head on the host")
    agreement = float((there["chain"] == here["chain"]).float().mean()) if there["chain"].shape == here["chain"].shape \
        else 0.0
    if agreement < CHAIN_AGREEMENT:
        problems.append(f"{agreement:.1%} of the chain tokens alike")
    detail = (f"{len(there['losses'])} steps in {there['seconds']:.1f} s, loss {there['losses'][0]:.3f} -> "
              f"{there['losses'][-1]:.3f}; against the host's: losses within {worst:.1e}, weights {distance:.1e} of "
              f"their movement, chains {agreement:.1%} alike; saved, loads back")
    return ("FAIL", "; ".join(problems)) if problems else ("PASS", detail)


def build_verdict(manifest: dict, device: torch.device) -> tuple[str, str]:
    """Whether a whole build's manifest (``build_trained_head``'s) says the head trained on ``device``'s kind of
    device with finite first and last losses; (status, detail)."""
    losses = [manifest["loss"]["first"], manifest["loss"]["last20"]]
    problems = []
    if not str(manifest["trained_on"]).startswith(device.type):
        problems.append(f"the manifest says it trained on {manifest['trained_on']}")
    if not all(isinstance(loss, (int, float)) and math.isfinite(loss) for loss in losses):
        problems.append(f"losses {losses}")
    detail = (f"trained on {manifest['trained_on']}, loss {losses[0]} -> {losses[1]}, held out "
              f"{manifest['held_out_acceptance']['acceptance'][:2]}..., published and loaded back")
    return ("FAIL", "; ".join(problems)) if problems else ("PASS", detail)
