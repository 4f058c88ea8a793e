"""Multilingual-SpecBench (drafter=multilingual-draft, task=multilingual): the drafter's recipe and its settings,
pinned against the original (Kthyeon/Multilingual-SpecBench @79c3fb0; docs/fidelity.md). The five translation sets'
reading is tests/test_questions.py's; the drafter's losslessness the contract tests'."""

from __future__ import annotations

import json

import pytest
from conftest import refusal

from specbench.artefacts.fine_tuned_draft import RECIPE, recipe_of, translation_prompts
from specbench.config import compose
from specbench.questions import read_questions
from specbench.testing import configured_drafter


def test_the_recipe_restates_the_originals():
    # self_distill_generation.sh:2-7 temperatures "0.0 0.3 0.7 1.0"; convert_to_train.py:58-78 random.seed(20);
    # train_vicuna_68m.sh:62-90 num_train_epochs 3, learning_rate 2e-5
    assert RECIPE["temperatures"] == [0.0, 0.3, 0.7, 1.0] and RECIPE["shuffle_seed"] == 20
    assert (RECIPE["epochs"], RECIPE["lr"]) == (3, 2e-5)


def test_the_drafter_runs_spss_schedule_over_spss_drafts_fine_tuned():
    mine, sps = compose(["drafter=multilingual-draft"]).drafter, compose(["drafter=sps"]).drafter
    for key in ("gamma", "adaptive_gamma", "max_gamma", "first_draft_from_prompt", "_target_"):
        assert mine[key] == sps[key], key
    assert set(mine.drafts_by_family) == set(sps.drafts_by_family)
    for family, entry in mine.drafts_by_family.items():
        if family != "tiny-random":  # a shorter base for the tests' model
            assert entry.finetuned.base == sps.drafts_by_family[family], family
    # the paper's draft for Vicuna-7B (train_vicuna_68m.sh: --model_name_or_path double7/vicuna-68m)
    assert mine.drafts_by_family.vicuna.finetuned.base.hub_id == "double7/vicuna-68m"


def test_the_training_prompts_are_our_own_and_no_evaluation_question():
    prompts = translation_prompts()
    assert len(prompts) == 120
    for language in ("German", "French", "Japanese", "Russian", "Chinese"):
        assert sum(prompt.startswith(f"Translate {language} to English: ") for prompt in prompts) == 24
    sentences = {prompt.split(": ", 1)[1] for prompt in prompts}
    evaluation = {turn.split(":", 1)[1] for q in read_questions(None) if q.task in ("deen", "fren", "jaen", "ruen", "zhen")
                  for turn in q.turns}
    assert not sentences & evaluation and len(translation_prompts(16)) == 16


def test_a_recipe_out_of_range_or_without_a_base_is_one_line(tiny):
    assert "no setting 'epoch'" in refusal(recipe_of, {"epoch": 3})
    assert "finetuned.lr must be" in refusal(recipe_of, {"lr": 0})
    assert "finetuned.temperatures" in refusal(recipe_of, {"temperatures": []})
    from specbench.drafters.draft_model import DraftModel

    drafter = DraftModel(name="multilingual-draft", drafts_by_family={"tiny-random": {"finetuned": {"epochs": 1}}})
    assert "needs base" in refusal(drafter.prepare, tiny)


def test_the_tuned_draft_is_built_from_the_pooled_answers_and_recorded(tiny, tmp_path):
    drafter = configured_drafter("multilingual-draft", tiny, overrides=[f"drafter.cache_dir={tmp_path}"])
    manifest = json.loads((tmp_path / "drafts").glob("tiny-random-translation-tuned-*/specbench_draft.json")
                          .__next__().read_text())
    assert manifest["documents"] == 16 * 2 and manifest["recipe"]["epochs"] == 1
    assert manifest["base"] == {"pruned": {"layers": 1, "selection": "first", "distill_tokens": 0,
                                           "corpus": "python-docs"}}
    assert drafter.draft_name.startswith("translation-tuned ")
