import json
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from specbench.decoding.loop import Decoder
from specbench.drafters.draft_model import DraftModel
from specbench.errors import SpecbenchError
from specbench.artefacts.pruned_draft import build_pruned_draft
from specbench.targets.transformers import prune
from specbench.testing import greedy_reference
from specbench.training.pruning import distill, select_layers, token_blocks


def test_layer_selection():
    assert select_layers(30, 4, "evenly") == [0, 10, 19, 29]
    assert select_layers(30, 3, "first") == [0, 1, 2]
    assert select_layers(30, 2, "last") == [28, 29]
    assert select_layers(30, [29, 3, 3]) == [3, 29]
    assert select_layers(5, 5, "evenly") == [0, 1, 2, 3, 4]
    with pytest.raises(SpecbenchError, match="between 1 and 30"):
        select_layers(30, 0)
    with pytest.raises(SpecbenchError, match="within 0..29"):
        select_layers(30, [30])
    with pytest.raises(SpecbenchError, match="selection"):
        select_layers(30, 2, "random")


def test_keeping_every_layer_reproduces_the_model(tiny):
    copy = prune(tiny.weights.module, [0, 1])
    ids = torch.tensor([tiny.encode_conversation(["hello"], [])])
    with torch.no_grad():
        torch.testing.assert_close(copy(input_ids=ids).logits, tiny.weights.module(input_ids=ids).logits, rtol=1e-4,
                                   atol=1e-4)


def test_pruned_checkpoint_round_trip(tiny, tmp_path):
    manifest = build_pruned_draft(tiny, tmp_path / "draft", 1, "last", 0, "python-docs")
    assert manifest["kept_layers"] == [1] and manifest["distill"]["tokens"] == 0
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "draft")
    assert loaded.config.num_hidden_layers == 1
    reference = prune(tiny.weights.module, [1])
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=ids).logits, reference(input_ids=ids).logits)
    assert json.loads((tmp_path / "draft" / "specbench_draft.json").read_text())["target"]["layers"] == 2


def test_distillation_brings_the_draft_closer_to_the_target(tiny):
    draft = prune(tiny.weights.module, [0])
    rng = np.random.default_rng(0)
    documents = [rng.integers(0, 256, 400).tolist() for _ in range(8)]
    losses = distill(draft, tiny.weights, token_blocks(documents, 32, 4, 0), tokens=32 * 4 * 30, lr=3e-3, device="cpu")
    assert np.mean(losses[-5:]) < 0.7 * np.mean(losses[:5])


def test_an_identical_draft_model_has_every_token_accepted(tiny, prompt_ids, caplog):
    drafter = DraftModel(drafts_by_family={"tiny-random": {"pruned": {"layers": 2, "selection": "first",
                                                                      "distill_tokens": 0}}}, gamma=4)
    with caplog.at_level("WARNING"):
        drafter.prepare(tiny)
    assert "is not smaller than target tiny-random" in caplog.text
    decoder = Decoder(tiny.target, frozenset(), 64)
    for ids in prompt_ids:
        generation = decoder.generate(ids, drafter, 31)
        assert generation.token_ids == greedy_reference(tiny.weights.module, ids, 31)
        # The first draft comes from the prompt (transformers' assisted decoding), so the prefill settles nothing:
        # six full drafts of 4 + the bonus, then the 31st token alone.
        assert [s.accepted_tokens for s in generation.steps] == [0] + [5] * 6 + [1]


def test_a_prepared_draft_model_shares_its_directory_and_fingerprint_and_frees_them(tiny, tmp_path):
    """The drafter contract's word to another engine (vLLM) and to run.json: where the same draft loads from (the
    pruned draft's cache directory), its weights' fingerprint, and its release."""
    from specbench.decoding.contract import SharedWeights
    from specbench.targets.transformers import weights_fingerprint

    drafter = DraftModel(drafts_by_family={"tiny-random": {"pruned": {"layers": 1, "selection": "first",
                                                                      "distill_tokens": 0}}}, cache_dir=str(tmp_path))
    assert drafter.shared_weights() is None and drafter.draft_weights_fingerprint() is None
    drafter.prepare(tiny)
    shared = drafter.shared_weights()
    assert shared.kind == "draft_model" and Path(shared.location).parent.parent == tmp_path
    assert (Path(shared.location) / "config.json").is_file()  # a checkpoint another engine can read
    assert drafter.draft_weights_fingerprint() == weights_fingerprint(drafter.draft)
    drafter.release_weights()
    assert drafter.draft is None and drafter.draft_weights_fingerprint() is None
    assert shared == SharedWeights("draft_model", shared.location)


def test_a_draft_checkpoint_that_does_not_load_is_a_clear_error(tiny, tmp_path):
    (tmp_path / "config.json").write_text("{ not json")
    drafter = DraftModel(drafts_by_family={"tiny-random": {"path": str(tmp_path), "pruned": {"layers": 1}}})
    with pytest.raises(SpecbenchError, match="does not load"):
        drafter.prepare(tiny)


def test_unknown_family_and_bad_gamma(tiny):
    with pytest.raises(SpecbenchError, match="knows no draft model for tiny-random"):
        DraftModel(drafts_by_family={"vicuna": {"hub_id": "x/y"}}).prepare(tiny)
    with pytest.raises(SpecbenchError, match="drafter.gamma"):
        DraftModel(gamma=0)


def test_a_rejected_draft_is_rolled_back_exactly(tiny, prompt_ids):
    """After every step, also after rejections, the draft's cached context must be exactly what the target
    accepted: each proposal equals the draft model's own greedy continuation computed from scratch."""
    drafter = DraftModel(drafts_by_family={"tiny-random": {"pruned": {"layers": 1, "selection": "first",
                                                                      "distill_tokens": 0}}}, gamma=4)
    drafter.prepare(tiny)
    proposals = []
    propose = drafter.propose

    def recording_propose(context_ids):
        draft = propose(context_ids)
        proposals.append((context_ids.tolist(), draft.token_ids.tolist()))
        return draft

    drafter.propose = recording_propose
    decoder = Decoder(tiny.target, frozenset(), 64)
    generation = decoder.generate(prompt_ids[0], drafter, 40)
    assert generation.token_ids == greedy_reference(tiny.weights.module, prompt_ids[0], 40)
    accepted = [step.accepted_tokens for step in generation.steps[1:]]
    assert min(accepted) < 5  # rejections happened, so rollbacks too
    assert any(1 < count < 5 for count in accepted)  # a partial accept keeps some drafted entries
    for context, tokens in proposals:
        assert tokens == greedy_reference(drafter.draft, context, len(tokens))


def test_target_answers_are_generated_once_and_cached(tiny, tmp_path, monkeypatch):
    import specbench.artefacts.target_answers as answers_module

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "Name three colours."}\n{"prompt": "Count to five."}\n')
    pairs = answers_module.target_answers(tiny, str(prompts), max_new_tokens=12, batch_size=2, cache_dir=str(tmp_path))
    assert len(pairs) == 2
    for (prompt_ids, answer_ids), text in zip(pairs, ["Name three colours.", "Count to five."]):
        assert prompt_ids == tiny.encode_conversation([text], [])
        assert answer_ids == greedy_reference(tiny.weights.module, prompt_ids, 12,
                                              tiny.eos_token_ids)[: len(answer_ids)]
        assert 0 < len(answer_ids) <= 12

    def no_generation(*args, **kwargs):
        raise AssertionError("answers were generated again instead of read from the cache")

    monkeypatch.setattr(answers_module, "generate_answers", no_generation)
    assert answers_module.target_answers(tiny, str(prompts), max_new_tokens=12, cache_dir=str(tmp_path)) == pairs


def test_distilling_on_the_target_answers(tiny, tmp_path, monkeypatch):
    import specbench.artefacts.target_answers as answers_module
    from specbench.training.pruning import TARGET_ANSWERS

    rng = np.random.default_rng(1)
    conversations = [(rng.integers(0, 256, 40).tolist(), rng.integers(0, 256, 60).tolist()) for _ in range(6)]
    monkeypatch.setattr(answers_module, "target_answers", lambda target: conversations)
    manifest = build_pruned_draft(tiny, tmp_path / "draft", 1, "first", 32 * 8 * 3, TARGET_ANSWERS, block_size=32)
    assert manifest["distill"]["corpus"] == TARGET_ANSWERS and manifest["distill"]["kl_first"] is not None


def test_distilling_in_row_slices_equals_whole_batches(tiny, monkeypatch):
    """Large vocabularies make the batch run in slices of rows; the training must not change."""
    from specbench.training import pruning

    rng = np.random.default_rng(2)
    documents = [rng.integers(0, 256, 300).tolist() for _ in range(4)]

    def train():
        torch.manual_seed(0)
        student = prune(tiny.weights.module, [0])
        losses = distill(student, tiny.weights, token_blocks(documents, 16, 4, 0), tokens=16 * 4 * 3, lr=3e-3,
                         device="cpu")
        return losses, student.state_dict()

    whole_losses, whole_state = train()
    monkeypatch.setattr(pruning, "LOGIT_FLOATS_PER_SLICE", 1)  # one row per slice
    sliced_losses, sliced_state = train()
    assert sliced_losses == pytest.approx(whole_losses, rel=1e-4)
    for name, tensor in whole_state.items():
        torch.testing.assert_close(sliced_state[name], tensor, rtol=1e-4, atol=1e-5)
