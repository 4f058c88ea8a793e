"""Depth-pruned ("wide") draft models: keep a few of the target's layers at full width, optionally distilled
against the target ("Decoding Speculative Decoding" finds such shallow, wide drafts beat deep, narrow ones,
because a draft's latency is driven by its depth)."""

from __future__ import annotations

import json
import logging
import math
import shlex
import time
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from specbench.errors import SpecbenchError

log = logging.getLogger(__name__)
SELECTIONS = ("first", "evenly", "last")
# Distillation corpus made of the target's own chat conversations: its greedy answers (with the chat template)
# to the built-in prompt set that HD's model database uses, disjoint from the evaluation questions. It matches
# what the draft must predict at run time far better than general text does.
TARGET_ANSWERS = "target-answers"
LOGIT_FLOATS_PER_SLICE = 2**25  # 128 MB of fp32 logits per distillation forward pass
# Measured on 2 cores: distilling a pruned SmolLM2-135M on 100k tokens takes 7.5 to 9.5 minutes whatever the depth
# (docs/usage.md; the target's forward pass dominates, so a larger target costs in proportion to its size).
SECONDS_PER_DISTILL_TOKEN = 8.5 * 60 / 100_000


def select_layers(num_layers: int, keep, selection: str = "evenly") -> list[int]:
    """Indices of the layers to keep: ``keep`` of ``num_layers`` chosen by ``selection`` (first, evenly
    spaced with the first and last included, last), or an explicit list of indices.

    Example: select_layers(30, 4, "evenly") -> [0, 10, 19, 29].
    """
    if isinstance(keep, (list, tuple)):
        layers = sorted({int(i) for i in keep})
        if not layers or layers[0] < 0 or layers[-1] >= num_layers:
            raise SpecbenchError(f"layers {list(keep)} are not all within 0..{num_layers - 1}")
        return layers
    if not isinstance(keep, int) or not 1 <= keep <= num_layers:
        raise SpecbenchError(f"layers to keep must be between 1 and {num_layers}, got {keep!r}")
    if selection not in SELECTIONS:
        raise SpecbenchError(f"layer selection {selection!r} is not known; choose one of {', '.join(SELECTIONS)}")
    if selection == "first":
        return list(range(keep))
    if selection == "last":
        return list(range(num_layers - keep, num_layers))
    return sorted({int(round(i)) for i in np.linspace(0, num_layers - 1, keep)})


def token_blocks(token_documents, block_size: int, batch_size: int, seed: int):
    """Endless batches [batch_size, block_size] of consecutive tokens cut from the concatenated documents,
    in a shuffled order."""
    tokens = np.concatenate([np.asarray(doc, dtype=np.int64) for doc in token_documents if len(doc)])
    blocks = tokens[: tokens.size // block_size * block_size].reshape(-1, block_size)
    if blocks.shape[0] < batch_size:
        raise SpecbenchError(f"the distillation corpus has {tokens.size} tokens, too few for one batch")
    rng = np.random.default_rng(seed)
    while True:
        order = rng.permutation(blocks.shape[0])
        for begin in range(0, order.size - batch_size + 1, batch_size):
            yield torch.from_numpy(blocks[order[begin : begin + batch_size]])


def distill(student, teacher, batches, tokens: int, lr: float, device) -> list[float]:
    """Train ``student`` to match ``teacher``'s next-token distributions (KL(teacher || student), averaged
    over positions) on about ``tokens`` tokens; return the KL of every step. ``teacher``: the target's
    ``TargetWeights``."""
    student.train()
    optimizer = torch.optim.AdamW(student.parameters(), lr=lr, weight_decay=0.0)
    first = next(batches)
    steps = max(1, math.ceil(tokens / first.numel()))
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 - step / steps)
    losses = []
    bar = tqdm(range(steps), desc="distilling", unit="step")
    batch = first
    # Logits are [rows, block, vocab] floats several times over (teacher, student, gradients): with a large
    # vocabulary a whole batch does not fit in memory, so the batch runs in slices of rows whose gradients add
    # up to those of the whole batch.
    vocab = teacher.vocab_size
    rows_per_slice = max(1, LOGIT_FLOATS_PER_SLICE // (first.shape[1] * vocab))
    for _ in bar:
        batch = batch.to(device)
        optimizer.zero_grad()
        loss_value = 0.0
        for rows in batch.split(rows_per_slice):
            with torch.no_grad():
                target_log_probs = torch.log_softmax(teacher.logits(rows).float(), dim=-1)
            student_log_probs = torch.log_softmax(student(input_ids=rows).logits.float(), dim=-1)
            loss = torch.nn.functional.kl_div(student_log_probs, target_log_probs, log_target=True,
                                              reduction="none").sum(-1).mean() * (rows.shape[0] / batch.shape[0])
            loss.backward()
            loss_value += float(loss.detach())
            del target_log_probs, student_log_probs, loss
        torch.nn.utils.clip_grad_norm_(student.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        losses.append(loss_value)
        bar.set_postfix_str(f"KL {np.mean(losses[-10:]):.3f}")
        batch = next(batches)
    student.eval()
    return losses


def check_distillation_corpus(corpus: str, distill_tokens: int) -> None:
    """A one-line SpecbenchError when a text ``corpus`` that a distillation would read is missing or empty: checked
    before the target is pruned and distilled, which takes minutes."""
    if distill_tokens > 0 and corpus != TARGET_ANSWERS:
        from specbench.datastores.build import checked_corpus

        checked_corpus(corpus)


# The numbers of a drafter's ``pruned`` entry (build_pruned_draft's keyword arguments): the least each may be.
_PRUNED_COUNTS = {"distill_tokens": 0, "block_size": 1, "batch_size": 1, "seed": 0}


def check_pruned_settings(settings: dict) -> None:
    """The numbers of a drafter's ``pruned`` entry, checked before anything is planned or built, in one line
    naming the key: counts that are ints (not bools, fractions, strings, inf or nan), a finite positive lr,
    and layers a count or a list of layer indices (their range is checked against the target by select_layers)."""
    layers = settings.get("layers")
    entries = layers if isinstance(layers, (list, tuple)) else [layers]
    if not entries or not all(isinstance(layer, int) and not isinstance(layer, bool) for layer in entries):
        raise SpecbenchError(f"pruned.layers must be a number of layers or a list of layer indices, got {layers!r}")
    for key, least in _PRUNED_COUNTS.items():
        value = settings.get(key, least)
        if not isinstance(value, int) or isinstance(value, bool) or value < least:
            raise SpecbenchError(f"pruned.{key} must be an integer >= {least}, got {value!r}")
    lr = settings.get("lr", 3e-4)
    if not isinstance(lr, (int, float)) or isinstance(lr, bool) or not math.isfinite(lr) or lr <= 0:
        raise SpecbenchError(f"pruned.lr must be a number > 0, not inf or nan, got {lr!r}")


def planned_pruned_draft(target, directory: Path, settings: dict, command: str) -> list:
    """What ``pruned_draft`` looks up, as plan entries: the target's answers when it distils on them (unless the
    draft is cached) and the draft."""
    from specbench.artefacts import PlannedArtefact, relative_size
    from specbench.target_answers import planned_answers, resolve_prompts

    check_pruned_settings(settings)
    tokens = int(settings.get("distill_tokens", 0))
    scale = relative_size(target)
    draft = PlannedArtefact(
        what=f"the pruned draft of {target.name} ({settings['layers']} layers, "
             + (f"distilled on {tokens} tokens of {settings.get('corpus', 'python-docs')})" if tokens else
                "not distilled)"),
        directory=directory, seconds=tokens * SECONDS_PER_DISTILL_TOKEN * scale + 10,
        basis=f"{tokens} tokens at {SECONDS_PER_DISTILL_TOKEN * 1000:.1f} ms each measured for SmolLM2-135M, "
              f"x {scale:.3g} for this target's size; plus about 10 s of pruning and saving",
        command=command)
    if tokens == 0 or settings.get("corpus") != TARGET_ANSWERS or directory.exists():
        return [draft]
    return [planned_answers(target, resolve_prompts(None), 256, purpose="the pruned draft is distilled on them",
                            command=command), draft]


def build_pruned_draft(target, directory: Path, layers, selection: str, distill_tokens: int, corpus: str,
                       block_size: int = 256, batch_size: int = 8, lr: float = 3e-4, seed: int = 0) -> dict:
    """Prune ``target`` (a LoadedModel) to ``layers`` (a count with ``selection``, or indices), distil it on
    ``distill_tokens`` tokens of ``corpus`` when that is positive, and save a checkpoint with the target's
    tokenizer and a manifest to ``directory``; return the manifest."""
    from specbench.datastores.corpus import iter_documents, resolve_corpus
    from specbench.artefacts import cache_root, replace_directory
    from specbench.target_answers import target_answers

    started = time.perf_counter()
    total = target.num_layers
    kept = select_layers(total, layers, selection)
    check_distillation_corpus(corpus, distill_tokens)
    torch.manual_seed(seed)
    draft = target.weights.pruned_copy(kept).to(target.device)
    losses = []
    if distill_tokens > 0:
        if corpus == TARGET_ANSWERS:
            documents = [prompt + answer for prompt, answer in target_answers(target)]
        else:
            texts = iter_documents(resolve_corpus(corpus, cache_root(None)))
            documents = [target.tokenizer.encode(text, add_special_tokens=False)
                         for text in tqdm(texts, desc="tokenizing", unit="doc")]
        losses = distill(draft, target.weights, token_blocks(documents, block_size, batch_size, seed), distill_tokens,
                         lr, target.device)
    manifest = {
        "target": {"name": target.name, "source": target.source, "layers": total},
        "kept_layers": kept,
        "selection": selection if not isinstance(layers, (list, tuple)) else "explicit",
        "distill": {"tokens": distill_tokens, "corpus": corpus if distill_tokens > 0 else None,
                    "block_size": block_size, "batch_size": batch_size, "lr": lr, "seed": seed,
                    "kl_first": losses[0] if losses else None,
                    "kl_last10": float(np.mean(losses[-10:])) if losses else None},
        "parameters": sum(p.numel() for p in draft.parameters()),
        "seconds": round(time.perf_counter() - started, 1),
    }
    def write(staging: Path) -> None:
        draft.save_pretrained(staging)
        if hasattr(target.tokenizer, "save_pretrained"):  # the draft shares the target's tokenizer by construction
            target.tokenizer.save_pretrained(staging)
        (staging / "specbench_draft.json").write_text(json.dumps(manifest, indent=2) + "\n")

    # A new version published whole: a job reading the previous draft keeps a complete directory.
    replace_directory(directory, write, {"kind": "pruned draft", **manifest})
    log.info("pruned draft (%d of %d layers) saved to %s in %.0f s", len(kept), total, directory, manifest["seconds"])
    return manifest


def rebuild_command(target, directory: Path, settings: dict) -> str:
    """The scripts/prune_draft.py command that builds the pruned draft of ``settings`` (a drafter's ``pruned``
    entry: layers, selection, distill_tokens, corpus, and any of build_pruned_draft's other settings) at
    ``directory``."""
    settings = dict(settings)
    layers = settings.pop("layers")
    if isinstance(layers, (list, tuple)):
        # prune_draft.py reads a number without a comma as a count, so one explicit layer is written twice.
        layers = ",".join(str(layer) for layer in (list(layers) * 2 if len(layers) == 1 else layers))
    words = ["python", "scripts/prune_draft.py", "--model", target.name, "--layers", str(layers),
             "--selection", settings.pop("selection", "evenly"),
             "--distill-tokens", str(settings.pop("distill_tokens", 0)),
             "--corpus", settings.pop("corpus", "python-docs")]
    for name, value in settings.items():
        words += [f"--{name.replace('_', '-')}", str(value)]
    return shlex.join([*words, "--out", str(directory)])


def load_pruned_draft(directory: Path, dtype, rebuild: str, require_manifest: bool = True) -> torch.nn.Module:
    """The pruned draft checkpoint at ``directory``, found whole first: every file of the size, and when its
    times changed the SHA-256, that its manifest.json recorded when it was built (``artefacts.verify_files``).
    A checkpoint without manifest.json (saved by other tools) is loaded unchecked unless ``require_manifest``.
    Anything wrong is a one-line SpecbenchError naming the file and ``rebuild``."""
    from transformers import AutoModelForCausalLM

    from specbench.artefacts import MANIFEST, read_manifest, verify_files

    if require_manifest or (directory / MANIFEST).exists():
        problem = verify_files(directory, read_manifest(directory, "pruned draft", rebuild))
        if problem:
            raise SpecbenchError(f"{directory}: damaged pruned draft ({problem}); {rebuild}")
    try:
        return AutoModelForCausalLM.from_pretrained(directory, dtype=dtype, attn_implementation="sdpa",
                                                    local_files_only=True)
    except Exception as error:  # transformers' OSError and ValueError, safetensors' SafetensorError, json's
        reason = " ".join(str(error).split()) or type(error).__name__  # RecursionError, ...: messages may span lines
        raise SpecbenchError(f"draft checkpoint {directory} does not load ({reason[:300]}); {rebuild}") from None


def pruned_draft(target, directory: Path, settings: dict, given: bool, command: str | None = None) -> torch.nn.Module:
    """The pruned draft of ``settings`` (a drafter's ``pruned`` entry) at ``directory``, built there first if
    missing, by one process while others wait (``artefacts.load_or_rebuild``). A damaged draft in the cache (not
    ``given``) is rebuilt with a warning, since its directory's key covers everything it was built from; a damaged
    one in a directory the user has ``given`` (``path`` beside ``pruned``) stops the run with one line naming the
    damaged file and the command that rebuilds it, since that directory is the user's own. A build is announced
    in one line naming ``command`` (default: scripts/prune_draft.py's), what builds it ahead of time."""
    from specbench.artefacts import announce_build, load_or_rebuild

    check_pruned_settings(settings)
    rebuild = f"rebuild it with `{rebuild_command(target, directory, settings)}`"

    def load() -> torch.nn.Module:
        return load_pruned_draft(directory, target.dtype, rebuild, require_manifest=not given)

    def build() -> None:
        rest = dict(settings)
        # Its inputs first: the layers to keep and the distillation corpus, before minutes of pruning and distilling.
        select_layers(target.num_layers, rest["layers"], rest.get("selection", "evenly"))
        check_distillation_corpus(rest.get("corpus", "python-docs"), rest.get("distill_tokens", 0))
        announce_build(planned_pruned_draft(target, directory, settings,
                                            command or rebuild_command(target, directory, settings))[-1])
        build_pruned_draft(target, directory, rest.pop("layers"), rest.pop("selection", "evenly"),
                           rest.pop("distill_tokens", 0), rest.pop("corpus", "python-docs"), **rest)

    if given:
        if directory.is_dir() and not directory.is_symlink() and not any(directory.iterdir()):
            try:
                directory.rmdir()  # an empty directory made for the draft: built as if missing, without a warning
            except OSError:
                pass
        if directory.exists():
            return load()
    return load_or_rebuild(directory, f"pruned draft of {target.name}", load, build)
