"""One trainer for every draft head trained for a target (EAGLE-1's and EAGLE-3's heads, Medusa's, Hydra's): the
data, the recipe, the resumable training loop and the acceptance measure; each method's own parts are the hooks of
its module (``training.methods`` maps a kind to it).

Data (given by ``artefacts.trained_head``, which builds and publishes heads): the target's own greedy answers to a
prompt set disjoint from the evaluation questions (``Recipe.prompts``, by default specbench's head-training set),
plus ``sampled_answers`` answers per training prompt sampled from the target. ``held_out`` prompts are kept out of
both and measure the head. The target runs over each prompt + answer once and gives the head its features (the
layers the method's ``feature_layers`` hook names) and its labels (the target's next-token distribution from its
post-norm last state), with the loss on the positions that predict answer tokens.

A method's module defines (the contract the trainer calls):

    KINDS                     the kinds it trains
    METHOD_SETTINGS[kind]     {name: specbench's default}: settings only this method has, checked by the default's
                              type (an int takes ints, a float numbers, a tuple a list of non-negative ints, a str
                              strings; numbers must be >= 0); part of the head's cache key
    PUBLISHED[kind], SOURCES[kind]  the method's own published recipe and where each value is written
    feature_layers(kind, num_layers, recipe) -> tuple[int, ...]
    new_head(target, kind, recipe, sequences) -> nn.Module   initialised as the method does (seeded by the recipe)
    loss(head, labels, batch, kind, recipe, generator) -> (scalar tensor, {part: float})
    chain_tokens(head, labels, batch, kind, positions) -> LongTensor [B, T, positions]   (-1: no token)
    save(head, kind, directory), load(target, directory, kind)

and optionally ``place(head, kind, device)`` (the head on the device it trains on, where ``Module.to`` does not
move all it reads: Hydra's copy of the target's embedding), ``READS_LABELS = False`` (its loss and chain never
read ``Labels``, which then stay on the host: Medusa's), ``NULLABLE[kind]`` (method settings that may also be
null), ``check(kind, settings)`` (ranges the types cannot say; raises SpecbenchError), ``batch_depth(kind, recipe)``
(label positions a batch must reach past each index; default EVAL_POSITIONS), ``decays(kind, name)`` (whether AdamW
decays the trainable parameter ``name``; default: every one), ``TRAINING_VERSION[kind]`` (bumped when a change of
the kind's training changes what its recipes build: part of its heads' keys alone, where RECIPE_VERSION is every
kind's), ``chain_length(kind, recipe)`` (the draft positions the method's chain has, when fewer than
EVAL_POSITIONS: acceptance is measured at those alone), ``draft_ids(head, kind)`` (the target ids of a reduced draft
vocabulary, whose lm_head rows alone ``Labels`` multiplies), ``notes(head, kind, training, held_out)``
(method-specific counts for the manifest's ``data``) and ``SECONDS_PER_KILO_TOKEN[kind]`` (for the estimate said
before a build). A method setting named ``final_lr_multiplier`` (Hydra's) ends the cosine or linear decay at that
fraction of the peak learning rate; a kind without one decays to 0.

Index conventions, used throughout: a sequence x_0..x_{L-1} holds a prompt of P tokens and an answer. At index t the
head knows the true tokens x_0..x_{t+1} and the features f_0..f_t; its k-th chain token guesses x_{t+1+k}, the
target's greedy choice at position t + k (``greedy[t + k]``). A label position s is trained when
P - 1 <= s <= L - 1 (it predicts an answer token, or what follows the answer).

Layout beside a head's directory ``D`` (published whole by ``storage.publish.replace_directory``)::

    D.partial/checkpoint.pt    the head, optimizer, schedule and step of a training under way, replaced atomically
                               every CHECKPOINT_S seconds and when the build is interrupted; a re-run resumes from
                               it. The target's features are not kept there: recomputing them takes about 30 s for
                               SmolLM2-135M on 2 cores, while keeping them would take hundreds of MB of disk.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from dataclasses import dataclass, field, fields
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

from specbench.errors import SpecbenchError
from specbench.storage.atomic import write_atomically
from specbench.storage.refusal import refusing_writes
from specbench.training import methods

log = logging.getLogger(__name__)

# Part of every cached head's key: a change of the training code that changes what a recipe builds bumps it.
# 2: one trainer for every kind (epochs, schedules, warm-up ratio, betas, the prompt set and answer length).
RECIPE_VERSION = 2
CHECKPOINT = "checkpoint.pt"
CHECKPOINT_S = 60.0  # at most this much training is lost to a killed build (an interrupted one loses nothing)
EVAL_POSITIONS = 6  # draft positions whose acceptance is measured (a chain this deep)
SCHEDULES = ("cosine", "linear", "constant")
CLIP_KINDS = ("value", "norm")
# The most optimizer steps a training takes (train_steps, warmup_steps, or epochs of batches): an int32's range, far
# past any training, so that a finite setting never overflows the float and int arithmetic of the step counts.
MOST_STEPS = 2**31 - 1


@dataclass(frozen=True)
class Recipe:
    """The settings of a head's training (a drafter's ``trained`` entry): the common ones as attributes, the
    kind's own in ``method``. The defaults here are the trainer's; ``recipe_of`` starts from the kind's (the
    method's published recipe, with specbench's differences, ``methods.DIFFERENCES``)."""

    kind: str
    train_steps: int | None = None  # optimizer steps; None: ``epochs`` over the training sequences; 0 = untrained
    epochs: float = 1.0           # passes over the training sequences when train_steps is None
    batch_sequences: int = 4      # prompt + answer sequences per step
    lr: float = 1e-3              # AdamW peak learning rate
    # after the linear warm-up: cosine or linear decay to 0 (or a kind's final_lr_multiplier) at the last step, or
    # constant
    schedule: str = "cosine"
    warmup_steps: int | None = None  # steps of linear warm-up; None: warmup_ratio of the steps
    warmup_ratio: float = 0.0
    weight_decay: float = 0.0     # AdamW's (decoupled)
    grad_clip: float = 0.5        # gradient clipping threshold (0 = none)
    grad_clip_by: str = "value"   # value (each gradient entry) or norm (the global L2 norm)
    betas: tuple = (0.9, 0.95)    # AdamW's
    seed: int = 0                 # the head's initialisation and the data order
    held_out: int = 16            # prompts whose answers are kept out of training to measure acceptance; 0 = none
    prompts: str = "head"         # the prompt set answered: head, built-in, sharegpt[:FILE], hf:..., or a file
    max_new_tokens: int = 256     # the length of the target's answers
    sampled_answers: int = 0      # answers sampled per training prompt, added to the greedy ones
    sample_temperature: float = 1.0
    method: dict = field(default_factory=dict)  # the kind's METHOD_SETTINGS, checked

    def key(self) -> dict:
        """What names a head built with this recipe: every setting (defaults included, so a changed default builds
        a new head) and the training code's version. The prompt set's text is the artefact's to add
        (``artefacts.trained_head.head_key``): the trainer is given its data, it does not read it."""
        settings = {name: _plain(getattr(self, name)) for name in common_names()}
        # a kind's own version (its module's TRAINING_VERSION) changes its heads' keys alone
        version = getattr(methods.module(self.kind), "TRAINING_VERSION", {}).get(self.kind)
        return {"recipe_version": RECIPE_VERSION, **({"training_version": version} if version else {}), **settings,
                **{name: _plain(value) for name, value in self.method.items()}}

    def steps(self, sequences: int) -> int:
        """Optimizer steps over ``sequences`` training sequences: train_steps, or ``epochs`` of batches."""
        if self.train_steps is not None:
            return self.train_steps
        steps = self.epochs * math.ceil(sequences / self.batch_sequences)
        if not steps <= MOST_STEPS:  # a finite epochs can still make an infinite float (1e308 x 145)
            raise SpecbenchError(f"{self.kind} training epochs={self.epochs:g} over {sequences} sequences is more than "
                                 f"{MOST_STEPS} steps; choose fewer epochs")
        return int(math.ceil(steps))

    def warmup(self, steps: int) -> int:
        """Warm-up steps of a training of ``steps`` steps."""
        warmup = self.warmup_steps if self.warmup_steps is not None else int(round(self.warmup_ratio * steps))
        return min(warmup, steps)

    def describe_steps(self) -> str:
        if self.train_steps is not None:
            return f"{self.train_steps} training steps"
        return f"{self.epochs:g} epoch{'' if self.epochs == 1 else 's'}"


def _plain(value):
    return list(value) if isinstance(value, tuple) else value


def common_names() -> list[str]:
    """The common settings' names, in Recipe's order."""
    return [item.name for item in fields(Recipe) if item.name not in ("kind", "method")]


def kind_defaults(kind: str) -> dict:
    """specbench's defaults for a head of ``kind``: the trainer's, then the method's published values of the common
    settings, then specbench's differences from them (``methods.DIFFERENCES``)."""
    module = methods.module(kind)
    names = set(common_names())
    values = {name: value for name, value in module.PUBLISHED[kind].items() if name in names}
    for name, (value, _why) in methods.DIFFERENCES.get(kind, {}).items():
        if name in names:
            values[name] = value
    return values


def recipe_of(kind: str, spec: dict | None) -> Recipe:
    """The Recipe of a drafter's ``trained`` entry ``spec`` for a head of ``kind``, checked: a one-line
    SpecbenchError names an unknown key (listing the valid ones) or a value out of range."""
    module = methods.module(kind)
    spec = dict(spec or {})
    method_defaults = module.METHOD_SETTINGS[kind]
    common = common_names()
    clash = sorted(set(common) & set(method_defaults))
    if clash:
        raise SpecbenchError(f"{module.__name__}.METHOD_SETTINGS[{kind!r}] redefines the trainer's {', '.join(clash)}")
    unknown = sorted(set(spec) - set(common) - set(method_defaults))
    if unknown:
        raise SpecbenchError(f"unknown {kind} training setting(s) {', '.join(unknown)}; settings: "
                             f"{', '.join([*common, *method_defaults])}")
    defaults = {item.name: item.default for item in fields(Recipe) if item.name in common}
    defaults.update(kind_defaults(kind))
    values = {}
    for name in common:
        value = spec.get(name, defaults[name])
        values[name] = _checked(kind, name, value)
    if values["warmup_steps"] is not None and "warmup_steps" in spec and values["warmup_ratio"] > 0 \
            and "warmup_ratio" in spec:
        raise SpecbenchError(f"{kind} training: give warmup_steps or warmup_ratio, not both (got "
                             f"{values['warmup_steps']} and {values['warmup_ratio']:g})")
    if "warmup_ratio" in spec and "warmup_steps" not in spec:
        values["warmup_steps"] = None  # a ratio given replaces the kind's default step count
    nullable = getattr(module, "NULLABLE", {}).get(kind, ())
    settings = {name: _checked_method(kind, name, spec.get(name, default), default, name in nullable)
                for name, default in method_defaults.items()}
    check = getattr(module, "check", None)
    if check is not None:
        check(kind, settings)
    return Recipe(kind=kind, **values, method=settings)


_INTEGERS = {"batch_sequences": 1, "seed": 0, "held_out": 0, "max_new_tokens": 1, "sampled_answers": 0}
_NUMBERS = {"epochs": (0.0, False), "lr": (0.0, False), "warmup_ratio": (0.0, True), "weight_decay": (0.0, True),
            "grad_clip": (0.0, True), "sample_temperature": (0.0, False)}
# (minimum, whether the minimum itself is allowed)
_CHOICES = {"schedule": SCHEDULES, "grad_clip_by": CLIP_KINDS}


def _checked(kind: str, name: str, value):
    """``value`` of common setting ``name`` in its canonical type (so a yaml's 1 and 1.0 name the same head), or a
    one-line SpecbenchError."""
    if name in ("train_steps", "warmup_steps"):
        if value is None:
            return None
        if not _is_int(value) or not 0 <= value <= MOST_STEPS:
            raise SpecbenchError(f"{kind} training {name} must be an integer in [0, {MOST_STEPS}] or null, got "
                                 f"{value!r}")
        return int(value)
    if name in _INTEGERS:
        if not _is_int(value) or value < _INTEGERS[name]:
            raise SpecbenchError(f"{kind} training {name} must be an integer >= {_INTEGERS[name]}, got {value!r}")
        return int(value)
    if name in _NUMBERS:
        minimum, inclusive = _NUMBERS[name]
        if (not _is_number(value) or value < minimum or (value == minimum and not inclusive)):
            raise SpecbenchError(f"{kind} training {name} must be a number {'>=' if inclusive else '>'} "
                                 f"{minimum:g}, got {value!r}")
        if name == "warmup_ratio" and value > 1:
            raise SpecbenchError(f"{kind} training warmup_ratio must be between 0 and 1, got {value!r}")
        return float(value)
    if name in _CHOICES:
        if value not in _CHOICES[name]:
            raise SpecbenchError(f"{kind} training {name}={value!r} is unknown; choose one of "
                                 f"{', '.join(_CHOICES[name])}")
        return value
    if name == "betas":
        if (not isinstance(value, (list, tuple)) or len(value) != 2
                or not all(_is_number(beta) and 0 <= beta < 1 for beta in value)):
            raise SpecbenchError(f"{kind} training betas must be two numbers in [0, 1), got {value!r}")
        return tuple(float(beta) for beta in value)
    if name == "prompts":
        if not isinstance(value, str) or not value:
            raise SpecbenchError(f"{kind} training prompts must be a prompt set: head, built-in, "
                                 f"sharegpt[:FILE], hf:owner/name or a file; got {value!r}")
        return value
    raise AssertionError(f"setting {name} has no check")  # a new Recipe field needs one


def _checked_method(kind: str, name: str, value, default, nullable: bool):
    """``value`` of method setting ``name``, checked by the type of its ``default``."""
    if value is None and (nullable or default is None):
        return None
    expected = type(default).__name__
    if isinstance(default, bool):
        ok = isinstance(value, bool)
    elif isinstance(default, int):
        ok = _is_int(value) and value >= 0
        value = int(value) if ok else value
    elif isinstance(default, float):
        ok = _is_number(value) and value >= 0
        value = float(value) if ok else value
        expected = "number"
    elif isinstance(default, str):
        ok = isinstance(value, str)
    elif isinstance(default, tuple):
        ok = isinstance(value, (list, tuple)) and all(_is_int(item) and item >= 0 for item in value)
        value = tuple(int(item) for item in value) if ok else value
        expected = "list of non-negative integers"
    else:
        raise AssertionError(f"METHOD_SETTINGS[{kind!r}][{name!r}]: a default of type {expected} cannot be checked")
    if not ok:
        bound = " >= 0" if expected in ("int", "number") else ""
        wanted = {"int": "an integer", "bool": "true or false", "str": "a string"}.get(expected, f"a {expected}")
        raise SpecbenchError(f"{kind} training {name} must be {wanted}{bound}"
                             f"{' or null' if nullable else ''}, got {value!r}")
    return value


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


# ---- data ------------------------------------------------------------------------------------------------------


@dataclass
class Sequence:
    """One prompt + answer with what the target made of it."""

    token_ids: torch.LongTensor   # [L]
    prompt_length: int            # P
    features: torch.Tensor        # [L, w] the head's input features (the feature layers' states, concatenated)
    final: torch.Tensor           # [L, H] the target's post-norm last state, whose lm_head gives the labels
    greedy: torch.LongTensor      # [L] the target's greedy next token at each position


def held_out_indices(count: int, held_out: int) -> list[int]:
    """``held_out`` of ``count`` conversations, evenly spaced, so that every category of a prompt set grouped in
    file order is measured.

    Example: held_out_indices(10, 3) -> [0, 4, 9]."""
    if held_out >= count:
        raise SpecbenchError(f"head training held_out={held_out} leaves none of the {count} conversations to train "
                             f"on; choose fewer than {count}")
    if held_out == 0:
        return []
    return sorted({int(round(i)) for i in np.linspace(0, count - 1, held_out)})


def training_sample(count: int, size: int) -> list[int]:
    """``size`` of ``count`` training sequences, evenly spaced: the sample whose acceptance is measured beside the
    held-out one's, to show how much of the training figure is fitting.

    Example: training_sample(10, 3) -> [0, 4, 9]; training_sample(2, 5) -> [0, 1]."""
    if size <= 0 or count == 0:
        return []
    return sorted({int(round(i)) for i in np.linspace(0, count - 1, min(size, count))})


def dense_weight(module: torch.nn.Module) -> torch.Tensor:
    """The weight of a linear layer as a plain tensor, also for one running on oneDNN (whose weight is packed)."""
    packed = getattr(module, "packed_weight", None)
    return (packed.to_dense() if packed is not None else module.weight).detach()


@torch.inference_mode()
def target_sequences(target, conversations, feature_layers: tuple[int, ...], description: str) -> list[Sequence]:
    """Run the target over each prompt + answer (one at a time: no padding to get wrong) and keep the head's
    features, the post-norm last state and the greedy next tokens, in float32 on the host."""
    last = target.num_layers
    sequences = []
    for prompt_ids, answer_ids in tqdm(conversations, desc=description, unit="answer"):
        ids = torch.tensor(list(prompt_ids) + list(answer_ids), dtype=torch.long)
        states, logits = target.weights.hidden_states_and_logits(ids, (*feature_layers, last))
        features = torch.cat(states[:-1], dim=-1).float().cpu()
        final = states[-1].float().cpu()
        greedy = logits.argmax(-1).cpu()
        sequences.append(Sequence(ids, len(prompt_ids), features, final, greedy))
    return sequences


@dataclass
class Batch:
    """Sequences padded on the right to one length; index t of the head's inputs covers t = 0..T-1 with T the
    longest L - 1, and the label arrays reach past it by the unroll depth."""

    token_ids: torch.LongTensor   # [B, T + 1 + depth]
    features: torch.Tensor        # [B, T, w]
    final: torch.Tensor           # [B, T + 1 + depth, H]
    greedy: torch.LongTensor      # [B, T + 1 + depth]
    labelled: torch.BoolTensor    # [B, T + 1 + depth]: a trained label position (P - 1 <= s <= L - 1)
    first_draft: torch.BoolTensor  # [B, T]: indices t >= P - 1, the ones that draft at decoding time
    lengths: torch.LongTensor     # [B] L

    def to(self, device: torch.device) -> "Batch":
        """The batch on ``device`` (itself where it already is): a head trains where its parameters are."""
        return Batch(**{item.name: getattr(self, item.name).to(device) for item in fields(self)})


def make_batch(sequences: list[Sequence], depth: int) -> Batch:
    """Pad ``sequences`` for an unroll of ``depth`` steps (see ``Batch``)."""
    width = max(len(sequence.token_ids) for sequence in sequences) - 1
    span = width + 1 + depth
    count = len(sequences)
    first = sequences[0]
    token_ids = torch.zeros(count, span, dtype=torch.long)
    features = torch.zeros(count, width, first.features.shape[1])
    final = torch.zeros(count, span, first.final.shape[1])
    greedy = torch.zeros(count, span, dtype=torch.long)
    labelled = torch.zeros(count, span, dtype=torch.bool)
    first_draft = torch.zeros(count, width, dtype=torch.bool)
    for row, sequence in enumerate(sequences):
        length, prompt = len(sequence.token_ids), sequence.prompt_length
        token_ids[row, :length] = sequence.token_ids
        features[row, :length - 1] = sequence.features[:-1]
        final[row, :length] = sequence.final
        greedy[row, :length] = sequence.greedy
        labelled[row, max(prompt - 1, 0):length] = True
        first_draft[row, max(prompt - 1, 0):length - 1] = True
    lengths = torch.tensor([len(sequence.token_ids) for sequence in sequences])
    return Batch(token_ids, features, final, greedy, labelled, first_draft, lengths)


SORTED_BATCHES = 8  # batches whose sequences are sorted by length together: less padding, still a shuffled order


def epoch_batches(lengths: list[int], batch_sequences: int, seed: int, epoch: int) -> list[list[int]]:
    """The batches of one epoch: every sequence once, in an order drawn from (seed, epoch) alone, so that a resumed
    training reads exactly what an uninterrupted one would. Runs of ``SORTED_BATCHES`` batches are sorted by length
    before they are cut, so a batch pads little (measured: 1.6x the tokens per second of random batches), and the
    batches are then shuffled.

    Example: lengths [5, 9, 6, 8], batch_sequences 2 -> two batches, {0, 2} and {1, 3} in some order (for a run of
    up to 8 batches, the short sequences go together)."""
    rng = np.random.default_rng([seed, epoch])
    order = rng.permutation(len(lengths))
    run = batch_sequences * SORTED_BATCHES
    batches = []
    for begin in range(0, order.size, run):
        chunk = sorted(order[begin:begin + run].tolist(), key=lambda index: (lengths[index], index))
        batches += [chunk[i:i + batch_sequences] for i in range(0, len(chunk), batch_sequences)]
    return [batches[i] for i in rng.permutation(len(batches))]


def batch_indices(step: int, lengths: list[int], batch_sequences: int, seed: int) -> list[int]:
    """The training sequences of optimizer step ``step`` (``epoch_batches`` of its epoch)."""
    per_epoch = math.ceil(len(lengths) / batch_sequences)
    epoch, offset = divmod(step, per_epoch)
    return epoch_batches(lengths, batch_sequences, seed, epoch)[offset]


class Labels:
    """The target's distributions from its post-norm last states: over the whole vocabulary, or over a reduced
    draft vocabulary ``draft_ids`` (only those lm_head rows are multiplied: softmax over them is the target's
    distribution restricted to the draft vocabulary and renormalised, EAGLE-3's label)."""

    def __init__(self, target, draft_ids: torch.LongTensor | None):
        weight = dense_weight(target.weights.output_layer()).float().cpu()
        self.weight = weight if draft_ids is None else weight[draft_ids]  # [draft vocab, H]
        self.in_draft = None
        if draft_ids is not None:
            self.in_draft = torch.zeros(weight.shape[0], dtype=torch.bool)
            self.in_draft[draft_ids] = True

    def logits(self, final: torch.Tensor) -> torch.Tensor:
        return F.linear(final, self.weight)

    def to(self, device: torch.device) -> "Labels":
        """These labels with their weight (and draft-vocabulary mask) moved to ``device``, in place."""
        self.weight = self.weight.to(device)
        if self.in_draft is not None:
            self.in_draft = self.in_draft.to(device)
        return self


def soft_cross_entropy(logits: torch.Tensor, target_logits: torch.Tensor, mask: torch.BoolTensor) -> torch.Tensor:
    """Mean over the ``mask``ed positions of -sum_v p_target(v) log p_draft(v) (EAGLE's "ploss")."""
    log_draft = torch.log_softmax(logits.float(), dim=-1)
    target_probs = torch.softmax(target_logits.float(), dim=-1)
    per_position = -(target_probs * log_draft).sum(-1)
    return (per_position * mask).sum() / mask.sum().clamp(min=1)


# ---- the acceptance, measured one way ------------------------------------------------------------------------------


def batch_depth(module, kind: str, recipe: Recipe) -> int:
    """Label positions a batch of ``kind`` must reach past each index (the method's ``batch_depth`` hook, else the
    measured chain's depth)."""
    hook = getattr(module, "batch_depth", None)
    return max(EVAL_POSITIONS, hook(kind, recipe)) if hook is not None else EVAL_POSITIONS


def chain_positions(module, kind: str, recipe) -> int:
    """The draft positions a head's acceptance is measured at: EVAL_POSITIONS, or fewer where the method's chain
    is shorter (its ``chain_length`` hook: Medusa's and Hydra's one token per head), so no position the head cannot
    draft is reported as rejected."""
    chain_length = getattr(module, "chain_length", None)
    return EVAL_POSITIONS if chain_length is None else min(EVAL_POSITIONS, int(chain_length(kind, recipe)))


@torch.no_grad()
def acceptance(head, module, labels: Labels, sequences: list[Sequence], kind: str, positions: int = EVAL_POSITIONS,
               batch_sequences: int = 8) -> dict:
    """How often the head's greedy chain (the method's ``chain_tokens`` hook) matches the target's greedy tokens,
    per draft position, over every index that drafts at decoding time (t >= P - 1).

    Position 1: the first chain token after index t equals ``greedy[t + 1]``. Position k: the k-th equals
    ``greedy[t + k]``, among the chains whose first k - 1 tokens did (their tokens are then the true ones, so
    feeding the answer's tokens is exact). A token the head cannot name (-1, outside a draft vocabulary) is a miss.
    The same function measures held-out and training sequences. Returns ``acceptance`` [positions] (conditional
    rates), ``chain_tokens`` (expected draft tokens a greedy chain of ``positions`` gets accepted, the bonus token
    not included) and ``drafts`` (chains measured).

    Example: one chain per index; chains (right, right, wrong), (right, wrong, -), (wrong, -, -) give rates
    [2/3, 1/2, 0] and chain_tokens 2/3 + 2/3 * 1/2 = 1.0."""
    if not sequences:
        return {"acceptance": [], "chain_tokens": None, "drafts": 0}
    reached = np.zeros(positions + 1)  # reached[k]: chains whose first k tokens were all right
    tried = np.zeros(positions)  # tried[k]: chains measured at position k + 1 (its label exists)
    was_training = head.training
    device = head_device(head)
    head.eval()
    try:
        for begin in range(0, len(sequences), batch_sequences):
            batch = make_batch(sequences[begin:begin + batch_sequences], positions)
            width = batch.features.shape[1]
            # the chain where the head is; the counting on the host
            chain = module.chain_tokens(head, labels, batch.to(device), kind, positions).cpu()  # [B, T, positions]
            assert chain.shape == (batch.features.shape[0], width, positions), (
                f"chain_tokens gave {tuple(chain.shape)}, expected [B, T, positions]")
            alive = batch.first_draft.clone()
            reached[0] += float(alive.sum())
            for step in range(positions):
                label_positions = torch.arange(width)[None, :] + 1 + step
                alive &= label_positions < batch.lengths[:, None]
                tried[step] += float(alive.sum())
                alive &= chain[:, :, step] == batch.greedy[:, 1 + step:1 + step + width]
                reached[step + 1] += float(alive.sum())
    finally:
        head.train(was_training)
    rates = [float(reached[k + 1] / tried[k]) if tried[k] else 0.0 for k in range(positions)]
    chain_tokens = float(np.sum(np.cumprod(rates)))
    return {"acceptance": [round(rate, 4) for rate in rates], "chain_tokens": round(chain_tokens, 3),
            "drafts": int(reached[0])}


# ---- training, resumable -----------------------------------------------------------------------------------------


def place(head, module, kind: str, device: torch.device):
    """``head`` moved to ``device`` for training (the method's ``place`` hook, else ``Module.to``)."""
    hook = getattr(module, "place", None)
    return hook(head, kind, device) if hook is not None else head.to(device)


def head_device(head) -> torch.device:
    """Where ``head``'s parameters are: where it trains and drafts its chains (``build_trained_head`` puts it on the
    target's device)."""
    return next(head.parameters()).device


def _trainable(head) -> dict[str, torch.Tensor]:
    return {name: parameter for name, parameter in head.named_parameters() if parameter.requires_grad}


def _save_checkpoint(staging: Path, identity: dict, head, optimizer, schedule, step: int, losses: list[float],
                     seconds: float) -> None:
    """Replace ``staging``/checkpoint.pt atomically (``storage.atomic``), so a kill leaves the old one or the new one."""
    state = {"identity": identity, "step": step, "losses": losses, "seconds": seconds,
             # not copied: torch.save writes them before the next update (Medusa's heads for SmolLM2 are 453 MB)
             "head": {name: tensor.detach() for name, tensor in _trainable(head).items()},
             "optimizer": optimizer.state_dict(), "schedule": schedule.state_dict()}

    def write(partial: Path) -> None:
        # Through a file object: given a path, torch's writer reports a full disk as a RuntimeError without the
        # errno ("basic_ios::clear: iostream error"); given a file, the write's OSError is in the error's context.
        with open(partial, "wb") as handle:
            torch.save(state, handle)

    with refusing_writes(staging / CHECKPOINT):
        staging.mkdir(parents=True, exist_ok=True)
    write_atomically(staging / CHECKPOINT, write)


def _load_checkpoint(staging: Path, identity: dict, trainable: set[str] | None = None) -> dict | None:
    """The checkpoint of a training of the same ``identity`` (target, kind, recipe) in ``staging``, or None (none
    there, another recipe's, unreadable, or holding other parameters than ``trainable``, the head's names, as after
    a code change that kept the recipe version: then training starts over, with a line saying so)."""
    file = staging / CHECKPOINT
    if not file.is_file():
        return None
    try:
        state = torch.load(file, map_location="cpu", weights_only=True)
    except Exception as error:  # a torn or damaged file: the training starts over, which is always correct
        log.warning("%s is unreadable (%s); training starts over", file, type(error).__name__)
        return None
    if not isinstance(state, dict) or state.get("identity") != identity:
        log.warning("%s is the checkpoint of another training; training starts over", file)
        return None
    saved = state.get("head")
    if trainable is not None and (not isinstance(saved, dict) or set(saved) != trainable):
        log.warning("%s holds other parameters than this head's; training starts over", file)
        return None
    return state


def schedule_factor(schedule: str, step: int, warmup: int, total: int, final: float = 0.0) -> float:
    """The learning rate's factor at optimizer step ``step`` (0-based) of ``total``: linear warm-up over ``warmup``
    steps, then ``schedule``: cosine or linear decay to ``final`` at ``total`` (0 but for Hydra's
    final_lr_multiplier, which decays the factor d to final + (1 - final) x d), or constant.

    Example: linear, warmup 2, total 6: steps 0..5 -> 1/3, 2/3, 1, 0.75, 0.5, 0.25; with final 0.2 the last three
    are 0.8, 0.6, 0.4."""
    if step < warmup:
        return (step + 1) / (warmup + 1)
    if schedule == "constant":
        return 1.0
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    decay = 1.0 - progress if schedule == "linear" else 0.5 * (1 + math.cos(math.pi * progress))
    return final + (1.0 - final) * decay


def final_lr_multiplier(recipe: Recipe) -> float:
    """The fraction of the peak learning rate the decay ends at: the kind's ``final_lr_multiplier`` setting, else 0."""
    return float(recipe.method.get("final_lr_multiplier", 0.0))


def _schedule(optimizer, recipe: Recipe, total: int):
    warmup, final = recipe.warmup(total), final_lr_multiplier(recipe)
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: schedule_factor(recipe.schedule, step, warmup, total, final))


def new_optimizer(head, module, kind: str, recipe: Recipe) -> torch.optim.AdamW:
    """AdamW over ``head``'s trainable parameters as the method's own trainer builds it: ``recipe.weight_decay`` on
    the parameters the method decays, 0 on the others. Which ones the kind's ``decays(kind, name)`` hook says; a
    kind without one decays every parameter (EAGLE's ``AdamW(model.parameters())``, DeepSpeed's AdamW for EAGLE-3).
    The undecayed ones form a second parameter group, present only when there are any."""
    trainable = _trainable(head)
    decays = getattr(module, "decays", None)
    decayed = [parameter for name, parameter in trainable.items() if decays is None or decays(kind, name)]
    undecayed = [parameter for name, parameter in trainable.items() if decays is not None and not decays(kind, name)]
    groups = [{"params": params, "weight_decay": decay}
              for params, decay in ((decayed, recipe.weight_decay), (undecayed, 0.0)) if params]
    return torch.optim.AdamW(groups, lr=recipe.lr, betas=recipe.betas)


def train(head, labels: Labels, sequences: list[Sequence], kind: str, recipe: Recipe, staging: Path,
          identity: dict, checkpoint_s: float = CHECKPOINT_S, on_step=None) -> tuple[list[float], float]:
    """Train ``head`` in place for ``recipe.steps(len(sequences))`` steps with the method's ``loss`` hook, resuming
    from ``staging``'s checkpoint of the same ``identity``; return the loss of every step and the training seconds
    (over all runs of it). The head trains where its parameters are (``head_device``; ``labels`` must be there
    too): each batch is made on the host and moved there, and the random draws (EAGLE's noise, Hydra's dropout)
    come from a host generator, so the data a step sees is the same on every device. A checkpoint resumes on any
    device.

    The checkpoint is written every ``checkpoint_s`` seconds and, when the training is interrupted between two
    optimizer updates (Ctrl-C or any error), at once. ``on_step(step)`` (tests) is called after each step."""
    module = methods.module(kind)
    total = recipe.steps(len(sequences))
    parameters = list(_trainable(head).values())
    optimizer = new_optimizer(head, module, kind, recipe)
    schedule = _schedule(optimizer, recipe, total)
    step, losses, seconds = 0, [], 0.0
    state = _load_checkpoint(staging, identity, set(_trainable(head)))
    if state is not None:
        with torch.no_grad():
            for name, tensor in _trainable(head).items():
                tensor.copy_(state["head"][name])
        optimizer.load_state_dict(state["optimizer"])
        schedule.load_state_dict(state["schedule"])
        step, losses, seconds = state["step"], list(state["losses"]), state["seconds"]
        log.info("resuming the %s head's training at step %d of %d from %s", kind, step, total, staging)
    if step >= total:
        return losses, seconds
    started, saved_at = time.perf_counter(), time.perf_counter()
    depth = batch_depth(module, kind, recipe)
    device = head_device(head)
    lengths = [len(sequence.token_ids) for sequence in sequences]
    head.train()
    bar = tqdm(total=total, initial=step, desc=f"training {kind} head", unit="step")
    updating = False
    try:
        while step < total:
            chosen = batch_indices(step, lengths, recipe.batch_sequences, recipe.seed)
            batch = make_batch([sequences[i] for i in chosen], depth).to(device)
            generator = torch.Generator().manual_seed(recipe.seed * 1_000_003 + step)
            optimizer.zero_grad(set_to_none=True)
            loss, parts = module.loss(head, labels, batch, kind, recipe, generator)
            loss.backward()
            if recipe.grad_clip > 0:
                if recipe.grad_clip_by == "value":
                    torch.nn.utils.clip_grad_value_(parameters, recipe.grad_clip)
                else:
                    torch.nn.utils.clip_grad_norm_(parameters, recipe.grad_clip)
            updating = True
            optimizer.step()
            schedule.step()
            step += 1
            losses.append(float(loss.detach()))
            updating = False
            bar.update(1)
            shown = " ".join(f"{name} {value:.3f}" for name, value in list(parts.items())[:3])
            bar.set_postfix_str(f"loss {np.mean(losses[-20:]):.3f} {shown}".strip())
            if time.perf_counter() - saved_at >= checkpoint_s and step < total:
                _save_checkpoint(staging, identity, head, optimizer, schedule, step, losses,
                                 seconds + time.perf_counter() - started)
                saved_at = time.perf_counter()
            if on_step is not None:
                on_step(step)
    except BaseException:
        if not updating and step > 0:  # between two updates: the state is exactly that of `step` steps
            with contextlib.suppress(Exception):
                _save_checkpoint(staging, identity, head, optimizer, schedule, step, losses,
                                 seconds + time.perf_counter() - started)
                log.warning("training interrupted at step %d of %d; the checkpoint in %s resumes it",
                            step, total, staging)
        raise
    finally:
        bar.close()
        head.eval()
    seconds += time.perf_counter() - started
    # also at the end: an interruption while measuring or publishing resumes with the training done
    _save_checkpoint(staging, identity, head, optimizer, schedule, step, losses, seconds)
    return losses, seconds
