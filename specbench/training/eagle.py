"""Training EAGLE heads (``eagle``: EAGLE-1/EAGLE-2's; ``eagle3``) for any target, so that an EAGLE drafter runs on a
model no published head exists for.

Data (given by ``artefacts.trained_head``, which builds and publishes heads): the target's own greedy answers to
specbench's built-in prompt set, disjoint from the evaluation questions, plus ``sampled_answers`` answers per
training prompt sampled from the target (cached like them). ``held_out`` prompts are kept out of both and measure the head (``held_out_acceptance``). The target runs
over each prompt + answer once and gives the head its features (EAGLE-1: the post-norm last state; EAGLE-3: three
layers concatenated) and its labels (the target's next-token distribution), with the loss on the positions that
predict answer tokens (EAGLE trains on assistant turns).

Recipes (see the papers' code, SafeAILab/EAGLE ``eagle/train/main.py`` and ``eagle/traineagle3/cnets.py``):

- ``eagle``: SmoothL1 regression of the target's next feature plus ``p_weight`` x soft cross-entropy of the
  target's lm_head on the head's output against the target's distribution; uniform noise on the input features.
- ``eagle3``: a draft vocabulary of the ``draft_vocab_size`` most frequent target tokens (``d2t`` offsets), and
  "training-time test": the head is unrolled ``ttt_steps`` steps, each step fed its own previous outputs as EAGLE-3
  drafts, with soft cross-entropy against the target's distribution over the draft vocabulary at every step
  (weighted ``ttt_decay ** step``).

Index conventions, used throughout: a sequence x_0..x_{L-1} holds a prompt of P tokens and an answer. The head's
pair at index t is (feature f_t, token x_{t+1}) at rotary position t; at unroll step j the pair at index t is (the
head's own step j-1 output at t, token x_{t+1+j}) at position t + j, and every step predicts the target's
distribution at position t + 1 + j. A label position s is trained when P - 1 <= s <= L - 1 (it predicts an answer
token, or what follows the answer).

Layout beside a head's directory ``D`` (published whole by ``storage.publish.replace_directory``)::

    D.partial/checkpoint.pt    the head, optimizer, schedule and step of a training under way, replaced atomically
                               every CHECKPOINT_S seconds and when the build is interrupted; a re-run resumes from
                               it. The target's features are not kept there: recomputing them takes about 30 s for
                               SmolLM2-135M on 2 cores, while keeping them would take about 250 MB of disk.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import time
from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

from specbench.errors import SpecbenchError
from specbench.storage.atomic import write_atomically
from specbench.storage.refusal import refusing_writes

log = logging.getLogger(__name__)

KINDS = ("eagle", "eagle3")
# Part of every cached head's key: a change of the training code that changes what a recipe builds bumps it.
RECIPE_VERSION = 1
CHECKPOINT = "checkpoint.pt"
CHECKPOINT_S = 60.0  # at most this much training is lost to a killed build (an interrupted one loses nothing)
EVAL_POSITIONS = 6  # draft positions whose held-out acceptance is measured (a chain this deep)
# Seconds per 1000 (tokens x unroll steps) of training measured on the 2-core CPU of the development machine, for
# the one-line estimate printed before a build on first use (see build_seconds_estimate).
SECONDS_PER_KILO_TOKEN_STEP = {"eagle": 1.55, "eagle3": 0.31}
DATA_SECONDS = 60.0  # the target's features over the greedy and the sampled answers (SmolLM2-135M, 2 cores)
# The steps of the heads drafter=eagle / eagle2 (100) and eagle3 (300) train for SmolLM2-135M (conf/drafter/*.yaml,
# heads_by_model), so that scripts/train_eagle.py's defaults build exactly the heads the drafters look up; each
# builds in 4 to 5 minutes on 2 CPU cores (eagle's steps cost 2.5 times eagle3's: its loss runs the target's whole
# 49152-row lm_head, forward and backward). tests/test_train_eagle.py checks that the two agree.
DEFAULT_TRAIN_STEPS = {"eagle": 100, "eagle3": 300}


@dataclass(frozen=True)
class Recipe:
    """The settings of a head's training (a drafter's ``trained`` entry; unset keys take these defaults, which are
    the recommended ones for SmolLM2-135M on a CPU, see docs)."""

    train_steps: int | None = None  # optimizer steps (None: DEFAULT_TRAIN_STEPS of the kind); 0 = the random head
    batch_sequences: int = 4      # prompt + answer sequences per step
    lr: float = 1e-3              # AdamW peak learning rate (linear warm-up, cosine decay to 0)
    warmup_steps: int = 30
    weight_decay: float = 0.0
    grad_clip: float = 0.5        # EAGLE's gradient clipping (by value)
    seed: int = 0
    held_out: int = 16            # prompts whose answers are kept out of training to measure acceptance; 0 = none
    sampled_answers: int = 1      # answers sampled per training prompt, added to the greedy ones (0 = none)
    sample_temperature: float = 1.0
    feature_layers: tuple | None = None  # target layers read (None: the kind's, EAGLE-3's 2, N/2, N-3)
    draft_vocab_size: int | None = 4096  # eagle3: rows of its lm_head (None = the target's whole vocabulary)
    ttt_steps: int = 2            # eagle3: unroll steps of training-time test (EAGLE-3 uses 7; docs/fidelity.md)
    ttt_decay: float = 0.8        # eagle3: weight of step j's loss is ttt_decay ** j (EAGLE-3's)
    p_weight: float = 0.1         # eagle: weight of the token loss (EAGLE-1's p_w)
    v_weight: float = 1.0         # eagle: weight of the feature regression (EAGLE-1's v_w)
    noise: float = 0.2            # eagle: uniform feature noise, (U - 0.5) * noise * 512 / length (EAGLE-1's)

    def key(self, kind: str) -> dict:
        """What names a head of ``kind`` built with this recipe: every setting that applies to the kind (defaults
        included, so a changed default builds a new head) and the training code's version."""
        settings = dataclasses.asdict(self)
        for name in EAGLE3_ONLY if kind == "eagle" else EAGLE_ONLY:
            del settings[name]
        settings["feature_layers"] = list(self.feature_layers) if self.feature_layers is not None else None
        return {"recipe_version": RECIPE_VERSION, **settings}


EAGLE_ONLY = ("p_weight", "v_weight", "noise")
EAGLE3_ONLY = ("draft_vocab_size", "ttt_steps", "ttt_decay")


def recipe_of(kind: str, spec: dict | None) -> Recipe:
    """The Recipe of a drafter's ``trained`` entry ``spec``, checked: a one-line SpecbenchError names an unknown key,
    a key of the other kind, or a value out of range."""
    if kind not in KINDS:
        raise SpecbenchError(f"EAGLE head kind {kind!r} is unknown; choose one of {', '.join(KINDS)}")
    spec = dict(spec or {})
    names = [field.name for field in fields(Recipe)]
    unknown = sorted(set(spec) - set(names))
    if unknown:
        raise SpecbenchError(f"unknown EAGLE training setting(s) {', '.join(unknown)}; settings: {', '.join(names)}")
    foreign = sorted(set(spec) & set(EAGLE3_ONLY if kind == "eagle" else EAGLE_ONLY))
    if foreign:
        other = "eagle3" if kind == "eagle" else "eagle"
        raise SpecbenchError(f"EAGLE training setting(s) {', '.join(foreign)} apply to {other} heads only, not "
                             f"{kind}")
    values = {"train_steps": DEFAULT_TRAIN_STEPS[kind]}
    for field in fields(Recipe):
        if field.name in spec and not (field.name == "train_steps" and spec[field.name] is None):
            values[field.name] = _checked(field.name, spec[field.name], field.default)
    return Recipe(**values)


_INTEGERS = {"train_steps": 0, "batch_sequences": 1, "warmup_steps": 0, "seed": 0, "held_out": 0, "ttt_steps": 1,
             "draft_vocab_size": 1, "sampled_answers": 0}
_NUMBERS = {"lr": (0.0, False), "weight_decay": (0.0, True), "grad_clip": (0.0, False), "ttt_decay": (0.0, True),
            "p_weight": (0.0, True), "v_weight": (0.0, True), "noise": (0.0, True), "sample_temperature": (0.0, False)}
# (minimum, whether the minimum itself is allowed)


def _checked(name: str, value, default):
    """``value`` of setting ``name`` in its canonical type (so a yaml's 1 and 1.0 name the same head), or a
    one-line SpecbenchError."""
    if name == "feature_layers":
        if value is None:
            return None
        if not isinstance(value, (list, tuple)) or not value or not all(
                isinstance(layer, int) and not isinstance(layer, bool) and layer >= 0 for layer in value):
            raise SpecbenchError(f"EAGLE training feature_layers must be a list of target layer numbers (0 = the "
                                 f"embeddings), or null, got {value!r}")
        return tuple(int(layer) for layer in value)
    if name == "draft_vocab_size" and value is None:
        return None
    if name in _INTEGERS:
        if not isinstance(value, int) or isinstance(value, bool) or value < _INTEGERS[name]:
            raise SpecbenchError(f"EAGLE training {name} must be an integer >= {_INTEGERS[name]}"
                                 f"{' or null (the whole vocabulary)' if name == 'draft_vocab_size' else ''}, "
                                 f"got {value!r}")
        return int(value)
    minimum, inclusive = _NUMBERS[name]
    if (not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value)
            or value < minimum or (value == minimum and not inclusive)):
        bound = ">=" if inclusive else ">"
        raise SpecbenchError(f"EAGLE training {name} must be a number {bound} {minimum:g}, got {value!r}")
    return float(value)


# ---- data ------------------------------------------------------------------------------------------------------


@dataclass
class Sequence:
    """One prompt + answer with what the target made of it."""

    token_ids: torch.LongTensor   # [L]
    prompt_length: int            # P
    features: torch.Tensor        # [L, w] the head's input features (eagle: the post-norm last state)
    final: torch.Tensor           # [L, H] the target's post-norm last state, whose lm_head gives the labels
    greedy: torch.LongTensor      # [L] the target's greedy next token at each position


def held_out_indices(count: int, held_out: int) -> list[int]:
    """``held_out`` of ``count`` conversations, evenly spaced, so that every category of the built-in prompt set
    (grouped in file order) is measured.

    Example: held_out_indices(10, 3) -> [0, 4, 9]."""
    if held_out >= count:
        raise SpecbenchError(f"EAGLE training held_out={held_out} leaves none of the {count} conversations to train "
                             f"on; choose fewer than {count}")
    if held_out == 0:
        return []
    return sorted({int(round(i)) for i in np.linspace(0, count - 1, held_out)})


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


def select_draft_vocabulary(counts: np.ndarray, size: int) -> np.ndarray:
    """The ``size`` most frequent token ids by ``counts`` [vocab], ties going to the smaller id, returned in ascending
    id order (EAGLE-3's d2t is built from the sorted list). Ids never seen fill the rest, smallest first.

    Example: counts [5, 0, 9, 5, 1], size 3 -> [0, 2, 3] (9 and the two 5s; id 0 before id 3 would break a tie).
    """
    counts = np.asarray(counts)
    if not 1 <= size <= counts.size:
        raise SpecbenchError(f"draft_vocab_size={size} must be between 1 and the target's vocabulary, {counts.size}")
    order = np.argsort(-counts, kind="stable")  # stable: equal counts keep ascending ids
    return np.sort(order[:size])


def greedy_token_counts(sequences: list[Sequence], vocab_size: int) -> np.ndarray:
    """How often each token is the target's greedy choice at a trained label position (P - 1 .. L - 1): what the
    draft vocabulary must cover."""
    counts = np.zeros(vocab_size, dtype=np.int64)
    for sequence in sequences:
        np.add.at(counts, sequence.greedy[sequence.prompt_length - 1:].numpy(), 1)
    return counts


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


# ---- the head unrolled over whole sequences ----------------------------------------------------------------------


def unrolled_outputs(head, token_ids: torch.LongTensor, features: torch.Tensor, steps: int) -> list[torch.Tensor]:
    """The head's outputs [B, T, h] at each of ``steps`` unroll steps over whole padded sequences, as decoding would
    compute them one draft at a time (``EagleHead.forward`` with a cache), but batched and differentiable.

    token_ids [B, T + steps (or more)]: x_1.. (the token of index t at step j is ``token_ids[:, t + j]``);
    features [B, T, w]: the target features f_0..f_{T-1}.

    At step 0 index t attends causally to the step-0 entries 0..t. At step j it attends to those same entries
    (the target-fed cache a chain drafts from) and to its own chain's entries at steps 1..j (index t only): the
    mask of a greedy chain drafted from position t, EAGLE-3's training-time test."""
    assert token_ids.ndim == 2 and features.ndim == 3, "token_ids [B, T + steps], features [B, T, w]"
    config = head.config
    layer = head.layers[0]
    attention = layer.self_attn
    count, width = features.shape[:2]
    heads, kv_heads, head_dim = config.num_attention_heads, config.num_key_value_heads, config.head_dim
    groups = heads // kv_heads
    causal = torch.ones(width, width, dtype=torch.bool, device=features.device).tril()
    scale = 1.0 / math.sqrt(head_dim)
    hidden, outputs = features, []
    base_keys = base_values = None
    chain_keys, chain_values = [], []
    for step in range(steps):
        embeddings = head.embed_tokens(token_ids[:, step:step + width]).to(features.dtype)
        if config.kind == "eagle":
            fused = head.fc(torch.cat((embeddings, hidden), dim=-1))
            attention_input = fused
        else:
            fused = head.fc(hidden) if step == 0 else hidden
            attention_input = torch.cat((layer.input_layernorm(embeddings), layer.hidden_norm(fused)), dim=-1)
        positions = torch.arange(step, step + width, device=features.device)
        cos, sin = attention.rotary(positions, features.dtype)  # [T, head_dim]
        queries = attention.q_proj(attention_input).view(count, width, heads, head_dim).transpose(1, 2)
        keys = attention.k_proj(attention_input).view(count, width, kv_heads, head_dim).transpose(1, 2)
        values = attention.v_proj(attention_input).view(count, width, kv_heads, head_dim).transpose(1, 2)
        queries = queries * cos + _rotate_half(queries) * sin
        keys = (keys * cos + _rotate_half(keys) * sin).repeat_interleave(groups, dim=1)  # [B, heads, T, d]
        values = values.repeat_interleave(groups, dim=1)
        if step == 0:
            base_keys, base_values = keys, values
        else:
            chain_keys.append(keys)
            chain_values.append(values)
        scores = torch.matmul(queries, base_keys.transpose(2, 3)) * scale  # [B, heads, T, T]
        scores = scores.masked_fill(~causal, float("-inf"))
        # each index's own chain: one score per earlier step, [B, heads, T, j]
        own = [(queries * chain).sum(-1, keepdim=True) * scale for chain in chain_keys]
        weights = torch.softmax(torch.cat([scores, *own], dim=-1), dim=-1)
        attended = torch.matmul(weights[..., :width], base_values)
        for i, chain in enumerate(chain_values):
            attended = attended + weights[..., width + i:width + i + 1] * chain
        attended = attention.o_proj(attended.transpose(1, 2).reshape(count, width, heads * head_dim))
        out = fused + attended
        out = out + layer.mlp(layer.post_attention_layernorm(out))
        outputs.append(out)
        hidden = out
    return outputs


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


class Labels:
    """The target's distributions over the draft vocabulary from its post-norm last states: only the lm_head rows
    of the draft vocabulary are multiplied (softmax over them is the target's distribution restricted to the draft
    vocabulary and renormalised, EAGLE-3's label)."""

    def __init__(self, target, draft_ids: torch.LongTensor | None):
        weight = dense_weight(target.weights.output_layer()).float().cpu()
        self.weight = weight if draft_ids is None else weight[draft_ids]  # [draft vocab, H]
        self.in_draft = None
        if draft_ids is not None:
            self.in_draft = torch.zeros(weight.shape[0], dtype=torch.bool)
            self.in_draft[draft_ids] = True

    def logits(self, final: torch.Tensor) -> torch.Tensor:
        return F.linear(final, self.weight)


def soft_cross_entropy(logits: torch.Tensor, target_logits: torch.Tensor, mask: torch.BoolTensor) -> torch.Tensor:
    """Mean over the ``mask``ed positions of -sum_v p_target(v) log p_draft(v) (EAGLE's "ploss")."""
    log_draft = torch.log_softmax(logits.float(), dim=-1)
    target_probs = torch.softmax(target_logits.float(), dim=-1)
    per_position = -(target_probs * log_draft).sum(-1)
    return (per_position * mask).sum() / mask.sum().clamp(min=1)


def step_loss(head, labels: Labels, batch: Batch, kind: str, recipe: Recipe, generator: torch.Generator | None):
    """The training loss of one batch, and the top-1 accuracy of the first draft (for the progress bar)."""
    width = batch.features.shape[1]
    features = batch.features
    if kind == "eagle" and recipe.noise > 0 and generator is not None:
        # EAGLE-1's uniform noise, wider for shorter sequences
        amplitude = (recipe.noise * 512 / batch.lengths.float())[:, None, None]
        features = features + (torch.rand(features.shape, generator=generator) - 0.5) * amplitude
    steps = recipe.ttt_steps if kind == "eagle3" else 1
    outputs = unrolled_outputs(head, batch.token_ids[:, 1:], features, steps)
    total, first_accuracy = 0.0, None
    for step, out in enumerate(outputs):
        label_final = batch.final[:, 1 + step:1 + step + width]
        mask = batch.labelled[:, 1 + step:1 + step + width]
        greedy = batch.greedy[:, 1 + step:1 + step + width]
        if labels.in_draft is not None:
            # EAGLE-3's rule: a position whose greedy choice the draft vocabulary cannot name teaches nothing
            mask = mask & labels.in_draft[greedy]
        draft_logits = head.lm_head(head.norm(out)) if kind == "eagle3" else F.linear(out, labels.weight)
        target_logits = labels.logits(label_final)
        token_loss = soft_cross_entropy(draft_logits, target_logits, mask)
        if kind == "eagle":
            regression = F.smooth_l1_loss(out, label_final, reduction="none").mean(-1)
            feature_loss = (regression * mask).sum() / mask.sum().clamp(min=1)
            total = recipe.v_weight * feature_loss + recipe.p_weight * token_loss
        else:
            total = total + recipe.ttt_decay ** step * token_loss
        if step == 0:
            with torch.no_grad():
                hits = (draft_logits.argmax(-1) == target_logits.argmax(-1)) & mask
                first_accuracy = float(hits.sum() / mask.sum().clamp(min=1))
    return total, first_accuracy


@torch.no_grad()
def held_out_acceptance(head, sequences: list[Sequence], positions: int = EVAL_POSITIONS,
                        batch_sequences: int = 8) -> dict:
    """How often the head's greedy chain matches the target on held-out answers, per draft position.

    Position 1: the first draft token (from the true prefix up to an answer position) equals the target's greedy
    next token. Position k: the k-th token of the head's own chain equals the target's, among the chains whose
    first k - 1 tokens did (its tokens are then the true ones, so feeding the answer's tokens is exact). Returns
    ``acceptance`` [positions] (conditional rates), ``chain_tokens`` (expected draft tokens a greedy chain of
    ``positions`` gets accepted, the bonus token not included) and ``drafts`` (chains measured)."""
    if not sequences:
        return {"acceptance": [], "chain_tokens": None, "drafts": 0}
    reached = np.zeros(positions + 1)  # reached[k]: chains whose first k tokens were all right
    tried = np.zeros(positions)  # tried[k]: chains measured at position k + 1 (its label exists)
    for begin in range(0, len(sequences), batch_sequences):
        batch = make_batch(sequences[begin:begin + batch_sequences], positions)
        width = batch.features.shape[1]
        outputs = unrolled_outputs(head, batch.token_ids[:, 1:], batch.features, positions)
        alive = batch.first_draft.clone()
        reached[0] += float(alive.sum())
        for step, out in enumerate(outputs):
            label_positions = torch.arange(width)[None, :] + 1 + step
            exists = label_positions < batch.lengths[:, None]
            alive &= exists
            tried[step] += float(alive.sum())
            drafted = head.to_target_ids(head.draft_logits(out).argmax(-1))
            alive &= drafted == batch.greedy[:, 1 + step:1 + step + width]
            reached[step + 1] += float(alive.sum())
    acceptance = [float(reached[k + 1] / tried[k]) if tried[k] else 0.0 for k in range(positions)]
    chain = float(np.sum(np.cumprod(acceptance)))
    return {"acceptance": [round(rate, 4) for rate in acceptance], "chain_tokens": round(chain, 3),
            "drafts": int(reached[0])}


# ---- training, resumable -----------------------------------------------------------------------------------------


def _trainable(head) -> dict[str, torch.Tensor]:
    return {name: parameter for name, parameter in head.named_parameters() if parameter.requires_grad}


def _save_checkpoint(staging: Path, identity: dict, head, optimizer, schedule, step: int, losses: list[float],
                     seconds: float) -> None:
    """Replace ``staging``/checkpoint.pt atomically (``storage.atomic``), so a kill leaves the old one or the new one."""
    state = {"identity": identity, "step": step, "losses": losses, "seconds": seconds,
             "head": {name: tensor.detach().clone() for name, tensor in _trainable(head).items()},
             "optimizer": optimizer.state_dict(), "schedule": schedule.state_dict()}

    def write(partial: Path) -> None:
        # Through a file object: given a path, torch's writer reports a full disk as a RuntimeError without the
        # errno ("basic_ios::clear: iostream error"); given a file, the write's OSError is in the error's context.
        with open(partial, "wb") as handle:
            torch.save(state, handle)

    with refusing_writes(staging / CHECKPOINT):
        staging.mkdir(parents=True, exist_ok=True)
    write_atomically(staging / CHECKPOINT, write)


def _load_checkpoint(staging: Path, identity: dict) -> dict | None:
    """The checkpoint of a training of the same ``identity`` (target, kind, recipe) in ``staging``, or None (none
    there, another recipe's, or unreadable: then training starts over, with a line saying so)."""
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
    return state


def _schedule(optimizer, recipe: Recipe):
    """Linear warm-up over ``warmup_steps``, then cosine decay to 0 at ``train_steps``."""
    total, warmup = recipe.train_steps, min(recipe.warmup_steps, recipe.train_steps)

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / (warmup + 1)
        progress = (step - warmup) / max(1, total - warmup)
        return 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def train(head, labels: Labels, sequences: list[Sequence], kind: str, recipe: Recipe, staging: Path,
          identity: dict, checkpoint_s: float = CHECKPOINT_S, on_step=None) -> tuple[list[float], float]:
    """Train ``head`` in place for ``recipe.train_steps`` steps, resuming from ``staging``'s checkpoint of the same
    ``identity``; return the loss of every step and the training seconds (over all runs of it).

    The checkpoint is written every ``checkpoint_s`` seconds and, when the training is interrupted between two
    optimizer updates (Ctrl-C or any error), at once. ``on_step(step)`` (tests) is called after each step."""
    parameters = list(_trainable(head).values())
    optimizer = torch.optim.AdamW(parameters, lr=recipe.lr, betas=(0.9, 0.95), weight_decay=recipe.weight_decay)
    schedule = _schedule(optimizer, recipe)
    step, losses, seconds = 0, [], 0.0
    state = _load_checkpoint(staging, identity)
    if state is not None:
        with torch.no_grad():
            for name, tensor in _trainable(head).items():
                tensor.copy_(state["head"][name])
        optimizer.load_state_dict(state["optimizer"])
        schedule.load_state_dict(state["schedule"])
        step, losses, seconds = state["step"], list(state["losses"]), state["seconds"]
        log.info("resuming the %s head's training at step %d of %d from %s", kind, step, recipe.train_steps, staging)
    if step >= recipe.train_steps:
        return losses, seconds
    started, saved_at = time.perf_counter(), time.perf_counter()
    depth = recipe.ttt_steps if kind == "eagle3" else 1
    lengths = [len(sequence.token_ids) for sequence in sequences]
    head.train()
    bar = tqdm(total=recipe.train_steps, initial=step, desc=f"training {kind} head", unit="step")
    updating = False
    try:
        while step < recipe.train_steps:
            chosen = batch_indices(step, lengths, recipe.batch_sequences, recipe.seed)
            batch = make_batch([sequences[i] for i in chosen], depth)
            generator = torch.Generator().manual_seed(recipe.seed * 1_000_003 + step)
            optimizer.zero_grad(set_to_none=True)
            loss, accuracy = step_loss(head, labels, batch, kind, recipe, generator)
            loss.backward()
            torch.nn.utils.clip_grad_value_(parameters, recipe.grad_clip)
            updating = True
            optimizer.step()
            schedule.step()
            step += 1
            losses.append(float(loss.detach()))
            updating = False
            bar.update(1)
            bar.set_postfix_str(f"loss {np.mean(losses[-20:]):.3f} top-1 {accuracy:.2f}")
            if time.perf_counter() - saved_at >= checkpoint_s and step < recipe.train_steps:
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
                            step, recipe.train_steps, staging)
        raise
    finally:
        bar.close()
        head.eval()
    seconds += time.perf_counter() - started
    # also at the end: an interruption while measuring or publishing resumes with the training done
    _save_checkpoint(staging, identity, head, optimizer, schedule, step, losses, seconds)
    return losses, seconds


def new_head(target, kind: str, recipe: Recipe):
    """A randomly initialised head (seeded by the recipe) shaped like ``target``'s layers, reading its feature layers
    (resolved, so the checkpoint names them), on the host in float32."""
    from specbench.heads.eagle_heads import build_head, head_config_for, resolve_feature_layers

    vocab = recipe.draft_vocab_size if kind == "eagle3" else None
    if vocab is not None and vocab >= target.vocab_size:
        vocab = None  # the whole vocabulary: no d2t
    layers = recipe.feature_layers
    if kind == "eagle" and layers is None:
        layers = (target.num_layers,)  # EAGLE-1's: the post-norm last state
    config = head_config_for(target, kind, draft_vocab_size=vocab, feature_layers=layers,
                             format="speculators" if kind == "eagle3" else "eagle")
    layers = resolve_feature_layers(config, target.num_layers)
    config = dataclasses.replace(config, feature_layers=layers)
    generator_state = torch.random.get_rng_state()
    torch.manual_seed(recipe.seed)
    try:
        head = build_head(config, target.weights.output_layer() if kind == "eagle" else None,
                          target.weights.input_embeddings())
    finally:
        torch.random.set_rng_state(generator_state)  # the caller's random stream is not this build's business
    return head
