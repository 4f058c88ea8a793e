"""Which module trains each kind of head, and where specbench's recipe for a kind differs from the method's own.

A kind's module (``training.heads``' docstring lists its hooks) is imported on first use only, so a method whose
module needs more than the trainer does costs nothing to the others. ``DIFFERENCES`` is the one place a specbench
default departs from a method's published recipe: ``heads.recipe_of`` starts from the method's ``PUBLISHED`` values
and applies these, and docs/fidelity.md's tables "Trained heads: specbench's recipe against each method's" are
written from ``PUBLISHED``, ``SOURCES`` and these by scripts/recipe_tables.py (tests/test_train_heads.py fails when
they are stale, or when a published value that cannot run here has no reason).
"""

from __future__ import annotations

import importlib

from specbench.errors import SpecbenchError

MODULES = {
    "eagle": "specbench.training.eagle",
    "eagle3": "specbench.training.eagle",
    "medusa": "specbench.training.medusa",
    "hydra": "specbench.training.hydra",
    "longspec": "specbench.training.longspec",
}
KINDS = tuple(MODULES)
# Rows of a PUBLISHED recipe that document how the method trained without being a setting here (what no CPU run can
# copy, or what specbench derives).
DOCUMENTED = ("precision", "data", "decay_steps", "gradient_accumulation", "max_length")

# Why each difference: the development machine trains on 2 CPU cores, where one epoch over specbench's head prompts
# costs minutes (docs/fidelity.md's tables give each build's time), and the published recipes ran for days on GPUs.
_FLOAT32 = ("float32, on the device the target ran on (the CPU here; a GPU with `run.device=cuda`): bfloat16/float16 "
            "autocast is a GPU's speed-up, not part of what a head learns")
_DATA = ("the target's greedy answers (max_new_tokens 256) to specbench's head prompts (specbench/data/"
         "head_prompts.jsonl, about 600 written for specbench, none sharing an 8-word run with Spec-Bench's "
         "questions), 16 held out to measure the head")
_DATA_WHY = ("ShareGPT is opt-in (`prompts: sharegpt`: a 13 MB download specbench does not ship); the target's own "
             "answers are the text it drafts, and the method's data is the target's own answers too where it "
             "regenerates them")
_LR = ("specbench's training is hundreds of steps, not hundreds of thousands: at the published rate a randomly "
       "initialised head barely moves in that many (specbench's first recipe was tuned at 1e-3)")
_WARMUP = "the published warm-up is longer than specbench's whole training; a ratio scales with it"
_HYDRA_WARMUP = ("Hydra's 100 warm-up steps are a few percent of its run at most (ten epochs of ShareGPT's tens of "
                 "thousands of conversations at 32 a step: over 3,000 steps), but 69% of specbench's one epoch of "
                 "about 145 steps; a ratio of 0.1 (15 steps) keeps the warm-up a small share of the training")
DIFFERENCES = {
    "eagle": {
        "epochs": (2.0, "20 epochs of 68,000 dialogues took days on GPUs; 2 epochs of specbench's data trained in "
                        "10 minutes on 2 CPU cores (609 s measured, beside 6 minutes of features)"),
        "lr": (1e-3, _LR),
        "warmup_steps": (None, _WARMUP),
        "warmup_ratio": (0.1, _WARMUP),
        "decay_steps": ("the last step", "the published decay ends at step 800,000, which 20 epochs never reach: "
                                         "specbench decays to 0 at its own last step"),
        "precision": ("float32", _FLOAT32),
        "data": (_DATA, _DATA_WHY),
    },
    "eagle3": {
        "epochs": (4.0, "40 epochs took days on GPUs; 4 epochs of specbench's data at 2 unrolled steps trained "
                        "in 9 minutes on 2 CPU cores (518 s measured)"),
        "lr": (1e-3, _LR),
        "warmup_steps": (None, _WARMUP),
        "warmup_ratio": (0.1, _WARMUP),
        "batch_sequences": (4, "one sequence per step with 2 accumulated, on every GPU; specbench takes 4 "
                               "sequences per step on one CPU (no accumulation)"),
        "gradient_accumulation": (1, "see batch_sequences"),
        "decay_steps": ("the last step", "the published decay ends at step 800,000, which 40 epochs never reach: "
                                         "specbench decays to 0 at its own last step"),
        "precision": ("float32", _FLOAT32),
        "data": (_DATA, _DATA_WHY),
        "ttt_steps": (2, "each unrolled step is one more forward and backward of the head over every position: "
                         "7 steps make a build about 3 times longer (`ttt_steps: 7` builds with EAGLE-3's unroll)"),
        "draft_vocab_size": (4096, "32,000 of Llama-3.1's 128,256 tokens; specbench's data names far fewer "
                                   "distinct tokens of SmolLM2's 49,152 (a head's manifest records the share "
                                   "of its greedy choices the 4,096 cover, draft_vocab_coverage)"),
    },
    "medusa": {
        "batch_sequences": (4, "128 sequences per step (8 per GPU x 4 GPUs x 4 accumulated) would make one epoch of "
                               "specbench's ~580 answers 5 steps, and on the CPU the 4 heads' logits over 49,152 "
                               "tokens are over a gigabyte per 4 sequences: 4 sequences per step, 145 steps an epoch"),
        "precision": ("float32", _FLOAT32),
        "data": (_DATA, "ShareGPT is opt-in (`prompts: sharegpt`: a 13 MB download specbench does not ship); "
                        "Medusa-1 trained Vicuna's heads on ShareGPT's answers, Vicuna's own fine-tuning data, and "
                        "Medusa's README adds self-distillation (the target's own answers) for a target without "
                        "its training data, which is specbench's case"),
        "max_length": ("none (the whole prompt + answer)",
                       "specbench's head prompts are under 500 characters and its answers at most max_new_tokens "
                       "(256): no sequence comes near 2048 tokens, so none is cut"),
        "heads": (4, "Spec-Bench drafts with the first 4 heads (evaluation/inference_medusa.py:200) and the heads "
                     "train independently (the loss is a plain sum over heads): a 5th would cost a quarter more "
                     "training and never be read (`heads: 5` trains it)"),
    },
    "hydra": {
        "epochs": (1.0, "10 epochs of ShareGPT ran on 8 GPUs; one epoch of specbench's data (about 145 steps of 4 "
                        "sequences) is already specbench's longest head build on 2 CPU cores (about 36 minutes of training "
                        "alone, from the 14.7 s a step measured), as each of the 4 heads trains its own 49,152-row "
                        "lm head"),
        "lr": (1e-3, "specbench trains one epoch where Hydra trained ten (epochs): at twice Hydra's rate, the rate "
                     "specbench's other heads train at (Medusa-1's published one), the parts of the head that start "
                     "random (the prefix layer and each head's projecting residual connection; the other blocks "
                     "start at a zero weight and the lm heads' weights as the target's, as Hydra initialises "
                     "them) move further in that tenth of the steps; 5e-4 was not measured against it"),
        "warmup_steps": (None, _HYDRA_WARMUP),
        "warmup_ratio": (0.1, _HYDRA_WARMUP),
        "batch_sequences": (4, "4 sequences on each of 8 GPUs; specbench takes 4 sequences per step on one CPU, so "
                               "an epoch of its few hundred answers is 150 steps rather than 19"),
        "precision": ("float32", _FLOAT32),
        "data": (_DATA, "ShareGPT is opt-in (`prompts: sharegpt`: a 13 MB download specbench does not ship); Hydra's "
                        "published loss learns the target's own distribution at every position (teacher loss 1, "
                        "data loss 0), which on the target's own answers is the text it drafts"),
        "max_length": ("prompt + 256 answer tokens", "specbench's answers are max_new_tokens long (256), well inside "
                                                     "the published 2,048-token truncation, which never cuts them"),
    },
    "longspec": {
        "epochs": (2.0, "stage 1's one epoch is over SlimPajama-6B, billions of tokens; specbench's data is about "
                        "145,000 tokens (its ~580 answers), which a layer starting from random weights needs more "
                        "than one pass over"),
        "batch_sequences": (4, "2,048 sequences of 1,024 tokens a step on 8 GPUs; 4 of specbench's answers a step on "
                               "one CPU, so an epoch is about 145 steps rather than a fraction of one"),
        "precision": ("float32", _FLOAT32),
        "data": (_DATA + "; every token labelled, stage 1's way",
                 "SlimPajama is not reachable here and its 6B tokens are weeks of a CPU; stages 2 and 3 (long-context "
                 "and long-CoT SFT at 32,768 tokens) are not run: a sequence that long is beyond 2 CPU cores' "
                 "memory and time for the target's features alone. The anchor-offset positions, the part of stage "
                 "1 that prepares the drafter for long contexts, are kept"),
        "max_length": ("prompt + 256 answer tokens", "specbench's answers are at most 256 tokens: no sequence "
                                                     "reaches stage 1's 1,024"),
    },
}


def module(kind: str):
    """The training module of ``kind``, imported now; an unknown kind is a one-line SpecbenchError."""
    if kind not in MODULES:
        raise SpecbenchError(f"head kind {kind!r} is unknown; choose one of {', '.join(KINDS)}")
    try:
        loaded = importlib.import_module(MODULES[kind])
    except ModuleNotFoundError as error:
        if error.name != MODULES[kind]:
            raise
        raise SpecbenchError(f"head kind {kind!r}: its training module {MODULES[kind]} is not in this "
                             "specbench") from None
    if kind not in loaded.KINDS:
        raise SpecbenchError(f"{MODULES[kind]} does not train {kind!r} heads (it trains {', '.join(loaded.KINDS)})")
    return loaded
