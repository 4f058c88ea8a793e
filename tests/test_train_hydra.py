"""Hydra's training hooks (specbench/training/hydra.py) on a tiny batch: the loss against a position-by-position
re-statement of zankner/Hydra's train.py @3f39fbd, dropout from the generator, what trains, the chain, the recipe."""

from types import SimpleNamespace

import pytest
import torch

from specbench.training import hydra as hooks
from specbench.training.heads import Labels, make_batch, target_sequences

SETTINGS = dict(hooks.METHOD_SETTINGS["hydra"])


def recipe(**method):
    return SimpleNamespace(method={**SETTINGS, **method}, seed=0)


@pytest.fixture(scope="module")
def data(tiny):
    conversations = [([1, 20, 30, 40], [50, 60, 70, 80, 90, 100, 110]), ([1, 25, 35], [45, 55, 65, 75, 85])]
    layers = hooks.feature_layers("hydra", tiny.num_layers, recipe())
    sequences = target_sequences(tiny, conversations, layers, "test")
    return sequences, make_batch(sequences, SETTINGS["num_heads"]), Labels(tiny, None)


@pytest.fixture
def head(tiny):
    head = hooks.new_head(tiny, "hydra", recipe(), None)
    with torch.no_grad():  # away from the zero start, so that every block matters
        for parameter in head.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=torch.Generator().manual_seed(2)) * 0.05)
    return head


def reference_loss(head, sequences, labels, teacher_weight, lm_weight):
    """Per head, per sequence, per position: Hydra's shift = i + 2 with the label x_{t+i+2} a trained token; each
    term a mean over all such positions of the batch, summed over the heads."""
    total = 0.0
    for index in range(head.config.num_heads):
        teacher_terms, lm_terms = [], []
        for sequence in sequences:
            length, prompt = len(sequence.token_ids), sequence.prompt_length
            prefix = head.prefix_sequences(sequence.features[None])[0]
            for t in range(length - 1):
                label = t + index + 2  # the data token predicted
                if not (label <= length - 1 and label >= prompt):
                    continue
                inputs = torch.cat((prefix[t], *(head.target_embedding[sequence.token_ids[t + 1 + k]]
                                                 for k in range(index + 1))))
                log_probs = head.head_logits(index, inputs[None])[0].log_softmax(-1)
                teacher = labels.logits(sequence.final[label - 1][None])[0].softmax(-1)
                teacher_terms.append(-(teacher * log_probs).sum())
                lm_terms.append(-log_probs[sequence.token_ids[label]])
        total = total + teacher_weight * torch.stack(teacher_terms).mean() + lm_weight * torch.stack(lm_terms).mean()
    return total


@pytest.mark.parametrize("teacher_weight, lm_weight", [(1.0, 0.0), (0.3, 0.7)])
def test_loss_is_hydras(head, data, teacher_weight, lm_weight):
    sequences, batch, labels = data
    value, parts = hooks.loss(head, labels, batch, "hydra", recipe(teacher_loss_weight=teacher_weight,
                                                                   lm_loss_weight=lm_weight), None)
    torch.testing.assert_close(value, reference_loss(head, sequences, labels, teacher_weight, lm_weight),
                               atol=1e-5, rtol=1e-5)
    assert set(parts) == {f"head{i}_{name}" for i in range(4) for name in ("teacher", "lm", "top1")}


def test_dropout_draws_from_the_generator_and_only_the_head_trains(head, data, tiny):
    _, batch, labels = data
    plain, _ = hooks.loss(head, labels, batch, "hydra", recipe(), None)
    first, _ = hooks.loss(head, labels, batch, "hydra", recipe(), torch.Generator().manual_seed(4))
    second, _ = hooks.loss(head, labels, batch, "hydra", recipe(), torch.Generator().manual_seed(4))
    assert first.item() != pytest.approx(plain.item()) and first.item() == second.item()
    unregularised, _ = hooks.loss(head, labels, batch, "hydra", recipe(dropout_rate=0.0),
                                  torch.Generator().manual_seed(4))
    assert unregularised.item() == pytest.approx(plain.item())
    first.backward()
    assert all(parameter.grad is not None for parameter in head.parameters())
    assert not head.target_embedding.requires_grad  # the base model's embedding stays frozen, as train.py:937


def test_chain_is_each_head_fed_the_true_tokens(head, data):
    sequences, batch, labels = data
    chain = hooks.chain_tokens(head, labels, batch, "hydra", 6)
    width = batch.features.shape[1]
    assert chain.shape == (2, width, 6)
    assert (chain[:, :, 4:] == -1).all()  # 4 heads: no fifth or sixth token
    sequence = sequences[0]
    prefix = head.prefix_sequences(sequence.features[None])[0]
    for t in (0, 3, 6):
        for k in range(1, 5):
            inputs = torch.cat((prefix[t], *(head.target_embedding[batch.token_ids[0, t + j]] for j in range(1, k + 1))))
            assert int(chain[0, t, k - 1]) == int(head.head_logits(k - 1, inputs[None]).argmax())


def test_a_batch_too_short_for_the_heads_is_refused(head, data):
    from conftest import refusal

    sequences, _, labels = data
    short = make_batch(sequences, 1)
    assert "needs make_batch(sequences, depth >= 4)" in refusal(hooks.loss, head, labels, short, "hydra", recipe(),
                                                                None)


def test_recipe_is_the_published_one():
    """README.md's training command @3f39fbd, re-stated."""
    assert hooks.KINDS == ("hydra",)
    published = hooks.PUBLISHED["hydra"]
    assert {key: published[key] for key in ("epochs", "lr", "schedule", "warmup_steps", "weight_decay",
                                            "grad_clip", "grad_clip_by", "betas", "batch_sequences", "precision",
                                            "max_length")} == {
        "epochs": 10, "lr": 5e-4, "schedule": "cosine", "warmup_steps": 100, "weight_decay": 0.1,
        "grad_clip": 1.0, "grad_clip_by": "norm", "betas": (0.9, 0.999), "batch_sequences": 32, "precision": "bf16",
        "max_length": 2048}
    assert hooks.METHOD_SETTINGS["hydra"] == {"num_heads": 4, "num_layers": 4, "hidden_state_offset": 0,
                                              "dropout_rate": 0.2, "lm_loss_weight": 0.0,
                                              "teacher_loss_weight": 1.0, "final_lr_multiplier": 0.33}
    assert set(hooks.SOURCES["hydra"]) == set(published)
    assert all("@3f39fbd" in where for where in hooks.SOURCES["hydra"].values())


def test_feature_layer_and_save_load(tiny, head, tmp_path):
    assert hooks.feature_layers("hydra", 12, recipe()) == (12,)
    assert hooks.feature_layers("hydra", 12, recipe(hidden_state_offset=2)) == (10,)
    hooks.save(head, "hydra", tmp_path)
    loaded = hooks.load(tiny, tmp_path, "hydra")
    assert all(torch.equal(loaded.state_dict()[key], value.detach()) for key, value in head.state_dict().items())


def test_specbenchs_hydra_recipe_is_the_published_one_but_for_the_named_differences():
    """recipe_of("hydra", {}) re-stated: what README.md's command ran where a 2-core CPU can run it (clipping,
    AdamW, weight decay, the cosine to 0.33 x, the heads and the loss), and specbench's own values, each with a
    reason in methods.DIFFERENCES, where it cannot."""
    from specbench.training import methods
    from specbench.training.heads import recipe_of

    recipe = recipe_of("hydra", {})
    ours = {"epochs": 1.0, "lr": 1e-3, "schedule": "cosine", "warmup_steps": None, "warmup_ratio": 0.1,
            "weight_decay": 0.1, "grad_clip": 1.0, "grad_clip_by": "norm", "betas": (0.9, 0.999),
            "batch_sequences": 4, "train_steps": None, "prompts": "head", "max_new_tokens": 256}
    assert {name: getattr(recipe, name) for name in ours} == ours
    assert recipe.method == SETTINGS  # every method setting is the published one
    published = hooks.PUBLISHED["hydra"]
    for name, value in ours.items():
        if name in published and published[name] != value:
            assert name in methods.DIFFERENCES["hydra"], f"hydra {name} differs without a reason"


def test_hydras_differences_give_hydras_reasons_not_eagles():
    # Where Hydra's recipe differs for a reason of its own (its 100 warm-up steps are not longer than specbench's
    # training, its heads do not start random, its data is not regenerated), the reason is Hydra's: none is an EAGLE
    # kind's sentence, and each names what it is about. Restated from README.md:146, 155, 157 @3f39fbd: 10 epochs,
    # lr 5e-4, 100 warm-up steps; prefix_mlp_head.py:28, 96-100: zero block weights, lm heads from the target's.
    from specbench.training import methods

    hydra = methods.DIFFERENCES["hydra"]
    eagle_reasons = {why for kind in ("eagle", "eagle3") for _, why in methods.DIFFERENCES[kind].values()}
    for name in ("lr", "warmup_steps", "warmup_ratio", "data"):
        assert hydra[name][1] not in eagle_reasons, f"hydra's {name} carries an EAGLE reason"
    assert "100 warm-up steps" in hydra["warmup_steps"][1] and "69% of specbench's one epoch" in hydra["warmup_steps"][1]
    assert hydra["warmup_ratio"][1] == hydra["warmup_steps"][1]
    assert "one epoch where Hydra trained ten" in hydra["lr"][1] and "randomly initialised" not in hydra["lr"][1]
    assert "teacher loss 1, data loss 0" in hydra["data"][1]
    assert (hooks.PUBLISHED["hydra"]["epochs"], hooks.PUBLISHED["hydra"]["lr"],
            hooks.PUBLISHED["hydra"]["warmup_steps"]) == (10, 5e-4, 100)


def test_the_trainer_builds_batches_deep_enough_for_every_head():
    from specbench.training import heads
    from specbench.training.heads import recipe_of

    assert heads.batch_depth(hooks, "hydra", recipe_of("hydra", {})) == heads.EVAL_POSITIONS  # 4 heads < 6
    assert heads.batch_depth(hooks, "hydra", recipe_of("hydra", {"num_heads": 9})) == 9


def test_the_learning_rate_decays_to_a_third_of_the_peak_as_hydras_scheduler_does(tiny, data, tmp_path, monkeypatch):
    """Over train(), the rate AdamW steps with: hydra/train/utils.py:11-17 @3f39fbd's cosine, factor
    0.33 + 0.67 x (1 + cos(pi x progress)) / 2 after the warm-up (specbench's warm-up: (step + 1) / (warmup + 1)),
    where the eagle kinds' decay reaches 0."""
    import math

    from specbench.training import heads
    from specbench.training.heads import recipe_of

    sequences, _, labels = data
    used = []
    original = torch.optim.AdamW.step

    def recording(optimizer, *args, **kwargs):
        used.append(optimizer.param_groups[0]["lr"])
        return original(optimizer, *args, **kwargs)

    monkeypatch.setattr(torch.optim.AdamW, "step", recording)
    recipe = recipe_of("hydra", {"train_steps": 6, "warmup_steps": 2, "batch_sequences": 2, "lr": 1e-3,
                                 "num_layers": 1})
    head = hooks.new_head(tiny, "hydra", recipe, sequences)
    heads.train(head, labels, sequences, "hydra", recipe, tmp_path / "staging", {"test": "hydra"})
    restated = [1e-3 * (step + 1) / 3 if step < 2 else
                1e-3 * (0.33 + 0.67 * 0.5 * (1 + math.cos(math.pi * (step - 2) / 4))) for step in range(6)]
    assert used == pytest.approx(restated)
    assert heads.schedule_factor("cosine", 6, 2, 6, heads.final_lr_multiplier(recipe)) == pytest.approx(0.33)
    assert heads.final_lr_multiplier(recipe_of("eagle", {})) == 0.0


def test_hydra_settings_out_of_range_are_one_line():
    from conftest import refusal

    from specbench.training.heads import recipe_of

    assert refusal(recipe_of, "hydra", {"final_lr_multiplier": 1.5}) == (
        "hydra training final_lr_multiplier must be a number in [0, 1], got 1.5")
    assert refusal(recipe_of, "hydra", {"num_heads": 0}) == "hydra training num_heads must be an integer >= 1, got 0"
    assert refusal(recipe_of, "hydra", {"dropout_rate": 1}) == (
        "hydra training dropout_rate must be a number in [0, 1), got 1")
    assert refusal(recipe_of, "hydra", {"lm_loss_weight": 0.0, "teacher_loss_weight": 0.0}) == (
        "hydra training lm_loss_weight and teacher_loss_weight are both 0, which trains nothing; give one a positive "
        "weight (the published recipe: teacher_loss_weight 1)")


def test_acceptance_is_measured_at_the_heads_positions_alone():
    """One chain token per head: a position no head drafts is not reported as a rejection."""
    from specbench.training import heads
    from specbench.training.heads import recipe_of

    assert heads.chain_positions(hooks, "hydra", recipe_of("hydra", {})) == 4
    assert heads.chain_positions(hooks, "hydra", recipe_of("hydra", {"num_heads": 9})) == heads.EVAL_POSITIONS


def test_a_new_head_reads_a_host_float32_copy_of_a_bfloat16_targets_embedding():
    """The trainer's token ids and features are float32 on the host: the embedding the head reads must be too,
    whatever the target's dtype and device (a target on a GPU is the case this stands for)."""
    from specbench.testing import tiny_random

    target = tiny_random(dtype="bfloat16")
    head = hooks.new_head(target, "hydra", recipe(num_layers=1), None)
    assert head.target_embedding.dtype == torch.float32 and head.target_embedding.device.type == "cpu"
    source = target.weights.input_embeddings()
    assert head.target_embedding.data_ptr() != source.data_ptr()
    assert torch.equal(head.target_embedding, source.detach().float())
