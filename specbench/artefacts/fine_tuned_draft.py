"""A draft model fine-tuned on the target's own translations: the multilingual specialized drafter's recipe
(Yi et al., EMNLP 2024; Kthyeon/Multilingual-SpecBench, docs/fidelity.md), built once per target, base draft and
settings, and published as a checkpoint with the target's tokenizer and a manifest.

The recipe: the target translates the training prompts greedily and at temperatures 0.3, 0.7 and 1.0
(data_generation/scripts/self_distill_generation.sh), the four answer sets are pooled and shuffled
(convert_to_train.py, seed 20), and the base draft (the family's: vicuna-68m for Vicuna, the pruned copy for the
embedded model) is trained on them for 3 epochs at learning rate 2e-5 (train/scripts/train_vicuna_68m.sh), here by
the pruned-draft builder's distillation (``training.pruning.distill``: the target's next-token distributions on
those texts, not the sampled tokens alone). The training prompts are specbench's own
(``specbench/data/translation_train_prompts.jsonl``, 24 a language, none of them an evaluation question): the
original's are WMT's training sets, which no run here may download.
"""

from __future__ import annotations

import copy
import json
import logging
import random
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from specbench.artefacts import target_answers as answers
from specbench.artefacts.base import Artefact, relative_size
from specbench.artefacts.pruned_draft import SECONDS_PER_DISTILL_TOKEN, load_pruned_draft
from specbench.errors import SpecbenchError
from specbench.storage.cache import cached_path
from specbench.storage.publish import replace_directory
from specbench.training.pruning import distill, token_blocks

log = logging.getLogger(__name__)

TRANSLATION_PROMPTS = Path(__file__).resolve().parents[1] / "data" / "translation_train_prompts.jsonl"
# The recipe's defaults, each traced in docs/fidelity.md; the keys of a drafter's ``finetuned`` entry.
RECIPE = {"temperatures": [0.0, 0.3, 0.7, 1.0], "shuffle_seed": 20, "epochs": 3, "lr": 2e-5, "max_new_tokens": 256,
          "block_size": 256, "batch_size": 8, "seed": 0, "prompts": None}
ANSWER_TOKENS_GUESS = 40  # a translation's length in tokens, for the estimate before any is generated


def recipe_of(settings: dict) -> dict:
    """The recipe: RECIPE updated by ``settings`` (a drafter's ``finetuned`` entry without its ``base``), checked in
    one line naming the key."""
    unknown = set(settings) - set(RECIPE)
    if unknown:
        raise SpecbenchError(f"finetuned has no setting {sorted(unknown)[0]!r}; the settings are base, "
                             f"{', '.join(RECIPE)}")
    recipe = {**RECIPE, **settings}
    temperatures = recipe["temperatures"]
    if (not isinstance(temperatures, (list, tuple)) or not temperatures
            or not all(isinstance(t, (int, float)) and not isinstance(t, bool) and 0 <= t <= 100 for t in temperatures)):
        raise SpecbenchError(f"finetuned.temperatures must be a list of numbers in [0, 100], got {temperatures!r}")
    for key in ("shuffle_seed", "epochs", "max_new_tokens", "block_size", "batch_size", "seed", "prompts"):
        value = recipe[key]
        if key == "prompts" and value is None:  # every training prompt
            continue
        low = 0 if key in ("shuffle_seed", "seed") else 1
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= 2**31 - 1:
            raise SpecbenchError(f"finetuned.{key} must be an integer in [{low}, {2**31 - 1}], got {value!r}")
    lr = recipe["lr"]
    if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not 0 < lr <= 1:
        raise SpecbenchError(f"finetuned.lr must be a number in (0, 1], got {lr!r}")
    recipe["temperatures"] = [float(t) for t in temperatures]
    return recipe


def translation_prompts(count: int | None = None) -> list[str]:
    """The first ``count`` (None: all) of specbench's translation training prompts."""
    from specbench.datastores.prompts import model_db_prompts

    return model_db_prompts(str(TRANSLATION_PROMPTS), limit=count)


class FineTunedDraft(Artefact):
    """The base draft fine-tuned on ``target``'s translations, at ``directory`` in the cache.

    base_key: what names the base draft (its spec and, for a built one, its directory), in the cache key;
    load_base(): the base draft's module, loaded (built first if need be) by the drafter that owns it;
    base_inputs: the base draft's own artefacts, planned beside this one while it is not cached."""

    def __init__(self, target, base_key: dict, load_base: Callable[[], torch.nn.Module], settings: dict,
                 cache_dir: str | None, command: str, base_inputs: list | None = None):
        self.target, self.base_key, self.load_base = target, base_key, load_base
        self.recipe = recipe_of(settings)
        self.command, self.base_inputs = command, list(base_inputs or [])
        self.directory = cached_path(cache_dir, "drafts", f"{target.name}-translation-tuned",
                                     {"source": target.source, "base": base_key, **self.recipe})

    @property
    def what(self) -> str:
        return (f"the translation-tuned draft of {self.target.name} ({len(translation_prompts(self.recipe['prompts']))} prompts x "
                f"{len(self.recipe['temperatures'])} temperatures, {self.recipe['epochs']} epochs at lr "
                f"{self.recipe['lr']:g})")

    @property
    def label(self) -> str:
        return f"translation-tuned draft of {self.target.name}"

    def estimate(self) -> tuple[float | None, str]:
        prompts = len(translation_prompts(self.recipe['prompts']))
        sets = len(self.recipe["temperatures"])
        generate = answers.answers_seconds(self.target, prompts * sets, ANSWER_TOKENS_GUESS)
        tokens = prompts * sets * 2 * ANSWER_TOKENS_GUESS * self.recipe["epochs"]
        train = tokens * SECONDS_PER_DISTILL_TOKEN * relative_size(self.target)
        return (generate + train, f"{prompts} prompts x {sets} answers of about {ANSWER_TOKENS_GUESS} tokens generated, "
                f"then about {tokens} tokens distilled at {SECONDS_PER_DISTILL_TOKEN * 1000:.1f} ms each (SmolLM2-135M),"
                f" x {relative_size(self.target):.3g} for this target")

    def rebuild_command(self) -> str:
        return self.command

    def inputs(self) -> list[Artefact]:
        return self.base_inputs

    def build(self) -> None:
        self.announce()
        started = time.perf_counter()
        recipe, target = self.recipe, self.target
        prompts = translation_prompts(recipe["prompts"])
        documents = []
        for temperature in recipe["temperatures"]:
            if temperature == 0:
                pairs = answers.target_answers(target, prompts, recipe["max_new_tokens"],
                                               purpose="the translation-tuned draft trains on them",
                                               command=self.command)
            else:
                pairs = answers.sampled_answers(target, prompts, 1, temperature, recipe["shuffle_seed"],
                                                recipe["max_new_tokens"])
            documents += [list(prompt) + list(answer) for prompt, answer in pairs]
        random.Random(recipe["shuffle_seed"]).shuffle(documents)  # convert_to_train.py: random.seed(20), shuffle
        total = sum(len(document) for document in documents)
        # A corpus too small for one batch of full blocks (a tiny test model's few short answers) trains on shorter
        # blocks rather than failing; any real target's fills them many times over.
        block_size = max(1, min(recipe["block_size"], total // recipe["batch_size"]))
        torch.manual_seed(recipe["seed"])
        draft = copy.deepcopy(self.load_base()).to(target.device).float()
        losses = distill(draft, target.weights, token_blocks(documents, block_size, recipe["batch_size"], recipe["seed"]),
                         recipe["epochs"] * total, recipe["lr"], target.device)
        manifest = {"target": {"name": target.name, "source": target.source}, "base": self.base_key,
                    "recipe": recipe, "block_size_used": block_size, "prompts": len(prompts),
                    "documents": len(documents), "tokens": total,
                    "kl_first": losses[0] if losses else None,
                    "kl_last10": float(np.mean(losses[-10:])) if losses else None,
                    "seconds": round(time.perf_counter() - started, 1)}

        def write(staging: Path) -> None:
            draft.save_pretrained(staging)
            if hasattr(target.tokenizer, "save_pretrained"):
                target.tokenizer.save_pretrained(staging)
            (staging / "specbench_draft.json").write_text(json.dumps(manifest, indent=2) + "\n")

        replace_directory(self.directory, write, {"kind": "translation-tuned draft", **manifest})
        log.info("translation-tuned draft of %s saved to %s in %.0f s (KL %.3f -> %.3f)", target.name, self.directory,
                 manifest["seconds"], manifest["kl_first"] or 0, manifest["kl_last10"] or 0)

    def load(self) -> torch.nn.Module:
        return load_pruned_draft(self.directory, self.target.dtype, f"rebuild it with `{self.command}`")
