"""A depth-pruned draft of the target (``training.pruning``: some of its layers kept at full width, optionally
distilled against it), built once per target and settings and published with its tokenizer and a manifest."""

from __future__ import annotations

import json
import logging
import shlex
import time
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from specbench.artefacts import target_answers as answers
from specbench.artefacts.base import Artefact, relative_size
from specbench.artefacts.statistics_datastore import checked_corpus
from specbench.errors import SpecbenchError
from specbench.storage.cache import cache_root, cached_path
from specbench.storage.manifest import MANIFEST, read_manifest, verify_files
from specbench.storage.publish import replace_directory
from specbench.training.pruning import TARGET_ANSWERS, check_pruned_settings, distill, select_layers, token_blocks

log = logging.getLogger(__name__)
# Measured on 2 cores: distilling a pruned SmolLM2-135M on 100k tokens takes 7.5 to 9.5 minutes whatever the depth
# (docs/usage.md; the target's forward pass dominates, so a larger target costs in proportion to its size).
SECONDS_PER_DISTILL_TOKEN = 8.5 * 60 / 100_000


def pruned_draft_directory(target, spec: dict, cache_dir: str | None) -> Path:
    """Where the cache keeps the pruned draft of ``spec`` (a drafter's ``pruned`` entry) for ``target``."""
    return cached_path(cache_dir, "drafts", f"{target.name}-pruned", {"source": target.source, **spec})


def check_distillation_corpus(corpus: str, distill_tokens: int) -> None:
    """A one-line SpecbenchError when a text ``corpus`` that a distillation would read is missing or empty: checked
    before the target is pruned and distilled, which takes minutes."""
    if distill_tokens > 0 and corpus != TARGET_ANSWERS:
        checked_corpus(corpus)



class PrunedDraft(Artefact):
    """The pruned draft of ``settings`` (a drafter's ``pruned`` entry) at ``directory``, built there first if
    missing, by one process while others wait. A damaged draft in the cache (not ``given``) is rebuilt with a
    warning, since its directory's key covers everything it was built from; a damaged one in a directory the user
    has ``given`` (``path`` beside ``pruned``) stops the run with one line naming the damaged file and the command
    that rebuilds it, since that directory is the user's own. A build is announced in one line naming ``command``
    (default: scripts/prune_draft.py's), what builds it ahead of time. The target's answers it distils on (corpus
    ``target-answers``) are planned beside it while it is not cached."""

    def __init__(self, target, directory: Path, settings: dict, given: bool = False, command: str | None = None):
        check_pruned_settings(settings)
        self.target, self.directory, self.settings, self.given = target, Path(directory), settings, given
        self.command = command or rebuild_command(target, self.directory, settings)

    @property
    def tokens(self) -> int:
        return int(self.settings.get("distill_tokens", 0))

    @property
    def what(self) -> str:
        return (f"the pruned draft of {self.target.name} ({self.settings['layers']} layers, "
                + (f"distilled on {self.tokens} tokens of {self.settings.get('corpus', 'python-docs')})"
                   if self.tokens else "not distilled)"))

    @property
    def label(self) -> str:
        return f"pruned draft of {self.target.name}"

    def estimate(self) -> tuple[float | None, str]:
        scale = relative_size(self.target)
        return (self.tokens * SECONDS_PER_DISTILL_TOKEN * scale + 10,
                f"{self.tokens} tokens at {SECONDS_PER_DISTILL_TOKEN * 1000:.1f} ms each measured for SmolLM2-135M, "
                f"x {scale:.3g} for this target's size; plus about 10 s of pruning and saving")

    def rebuild_command(self) -> str:
        return rebuild_command(self.target, self.directory, self.settings)

    def inputs(self) -> list[Artefact]:
        if self.tokens == 0 or self.settings.get("corpus") != TARGET_ANSWERS:
            return []
        return [answers.TargetAnswers(self.target, answers.resolve_prompts(None), 256,
                                      purpose="the pruned draft is distilled on them", command=self.command)]

    def check(self) -> None:
        # Its inputs first: the layers to keep and the distillation corpus, before minutes of pruning and distilling.
        select_layers(self.target.num_layers, self.settings["layers"], self.settings.get("selection", "evenly"))
        check_distillation_corpus(self.settings.get("corpus", "python-docs"), self.settings.get("distill_tokens", 0))

    def build(self) -> None:
        rest = dict(self.settings)
        self.check()
        self.announce()
        build_pruned_draft(self.target, self.directory, rest.pop("layers"), rest.pop("selection", "evenly"),
                           rest.pop("distill_tokens", 0), rest.pop("corpus", "python-docs"), **rest)

    def load(self) -> torch.nn.Module:
        return load_pruned_draft(self.directory, self.target.dtype, f"rebuild it with `{self.rebuild_command()}`",
                                 require_manifest=not self.given)

    def get(self) -> torch.nn.Module:
        if self.given:
            directory = self.directory
            if directory.is_dir() and not directory.is_symlink() and not any(directory.iterdir()):
                try:
                    directory.rmdir()  # an empty directory made for the draft: built as if missing, without a warning
                except OSError:
                    pass
            if directory.exists():
                return self.load()
        return super().get()


def pruned_draft(target, directory: Path, settings: dict, given: bool, command: str | None = None) -> torch.nn.Module:
    """The ``PrunedDraft`` of ``settings`` at ``directory``, built first if need be."""
    return PrunedDraft(target, directory, settings, given, command).get()


def build_pruned_draft(target, directory: Path, layers, selection: str, distill_tokens: int, corpus: str,
                       block_size: int = 256, batch_size: int = 8, lr: float = 3e-4, seed: int = 0) -> dict:
    """Prune ``target`` (a LoadedModel) to ``layers`` (a count with ``selection``, or indices), distil it on
    ``distill_tokens`` tokens of ``corpus`` when that is positive, and save a checkpoint with the target's
    tokenizer and a manifest to ``directory``; return the manifest."""
    from specbench.datastores.corpus import iter_documents, resolve_corpus

    started = time.perf_counter()
    total = target.num_layers
    kept = select_layers(total, layers, selection)
    check_distillation_corpus(corpus, distill_tokens)
    torch.manual_seed(seed)
    draft = target.weights.pruned_copy(kept).to(target.device)
    losses = []
    if distill_tokens > 0:
        if corpus == TARGET_ANSWERS:
            documents = [prompt + answer for prompt, answer in answers.target_answers(target)]
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
    times changed the SHA-256, that its manifest.json recorded when it was built (``storage.manifest.verify_files``).
    A checkpoint without manifest.json (saved by other tools) is loaded unchecked unless ``require_manifest``.
    Anything wrong is a one-line SpecbenchError naming the file and ``rebuild``."""
    from transformers import AutoModelForCausalLM

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
