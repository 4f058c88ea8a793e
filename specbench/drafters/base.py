"""Helpers shared by the drafters in this folder. The drafter contract itself (``Draft``, ``Drafter``,
``StepOutcome``) lives next to the loop, in ``specbench.decoding.contract``."""

from __future__ import annotations

import math
from pathlib import Path

import torch

from specbench.decoding.contract import Draft
from specbench.errors import SpecbenchError


# The largest count a drafter setting takes. Every count sizes an array, a tensor or a loop, and two of them
# multiplied stay inside int64 (2**31 x 2**31 < 2**63); a larger one (2**63, say) would pass a check of its sign
# and overflow the int64 arithmetic of what it sizes or indexes, deep inside numpy or torch, in a traceback.
MAX_COUNT = 2**31 - 1


def _is_count(value, low: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= MAX_COUNT


def require_positive(**settings) -> None:
    """Reject a drafter setting that is not a positive integer up to ``MAX_COUNT``, naming it and the range:
    ``drafter.gamma must be a positive integer <= 2147483647, got 0``."""
    for key, value in settings.items():
        if not _is_count(value, 1):
            raise SpecbenchError(f"drafter.{key} must be a positive integer <= {MAX_COUNT}, got {value!r}")


def require_non_negative(**settings) -> None:
    """Reject a drafter setting that is not a non-negative integer up to ``MAX_COUNT``, naming it and the range."""
    for key, value in settings.items():
        if not _is_count(value, 0):
            raise SpecbenchError(f"drafter.{key} must be a non-negative integer <= {MAX_COUNT}, got {value!r}")


def require_number(key: str, value, low: float | None = None, high: float | None = None,
                   above_low: bool = False, why: str | None = None) -> float:
    """A real-valued drafter setting, checked and returned as a float: a finite int or float (not a bool, whose
    arithmetic would pass as 0 or 1, nor a string, nor inf or nan, which every comparison with a bound lets
    through or none does) within ``[low, high]`` (``(low, high]`` with ``above_low``); ``why`` (the reason for
    the bounds) ends the message. A setting that scales a count has the finite ``high`` past which it changes
    nothing, so that no finite value overflows the arithmetic it feeds (a float32 product, an int())."""
    if low is not None and high is not None:
        wanted = f"a number in {'(' if above_low else '['}{low:g}, {high:g}]"
    elif low is not None:
        wanted = f"a number {'>' if above_low else '>='} {low:g}"
    else:
        wanted = "a number" + ("" if high is None else f" <= {high:g}")
    wanted += ", not inf or nan"
    if (not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value)
            or (low is not None and (value <= low if above_low else value < low))
            or (high is not None and value > high)):
        raise SpecbenchError(f"drafter.{key} must be {wanted}, got {value!r}{f' ({why})' if why else ''}")
    return float(value)


def require_flag(**settings) -> None:
    """Reject a drafter setting that is not true or false (a string such as "no" would be truthy), naming it."""
    for key, value in settings.items():
        if not isinstance(value, bool):
            raise SpecbenchError(f"drafter.{key} must be true or false, got {value!r}")


def require_choice(key: str, value, choices) -> None:
    """Reject a drafter setting that is not one of ``choices``, listing them."""
    if value not in choices:
        raise SpecbenchError(f"drafter.{key}={value!r} is not known; choose one of: {', '.join(choices)}")


def check_token_id(key: str, value) -> int | None:
    """A drafter setting that is a token id or null, checked: ``drafter.no_match_token must be ...``."""
    if value is not None and not _is_count(value, 0):
        raise SpecbenchError(f"drafter.{key} must be a token id (an integer in [0, {MAX_COUNT}]) or null, got "
                             f"{value!r}")
    return value


def require_in_vocabulary(key: str, token: int | None, target) -> None:
    """Reject a token-id setting outside the target's vocabulary, naming the key and the vocabulary size."""
    size = target.vocab_size
    if token is not None and token >= size:
        raise SpecbenchError(f"drafter.{key}={token} is not a token of {target.name} (vocabulary of {size}); "
                             "use a smaller id, or null for no draft when nothing matches")


def no_match_draft(token: int | None) -> Draft:
    """The draft of a step where the method found nothing: Spec-Bench's PLD and REST verify one dummy token
    (id 100) rather than decoding one token alone, so such a step costs a two-token pass, which is part of
    what their numbers measured; ``None``: no draft."""
    if token is None:
        return Draft.empty()
    return Draft(torch.tensor([token], dtype=torch.int64), sources=("no-match",))


def chosen_or_listed(chosen: dict, listed: dict, key: str) -> dict | None:
    """The model a drafter config names itself (``chosen`` with a ``hub_id`` or ``path``), else the entry of
    ``listed`` for ``key`` (the target's family or name); None when neither has one (the caller names the fix)."""
    if any(chosen.get(field) for field in ("hub_id", "path")):
        return chosen
    return listed.get(key) or None



class HeadSource:
    """Where a head-drafting drafter (EAGLE's, Medusa's, Hydra's) gets its head: the drafter's own ``head`` setting
    when it names one ({hub_id|path, revision}), else ``heads_by_model[target.name]``: a published head ({hub_id} or
    {path}), or one trained for the target ({trained: {...}}: built in the cache on first use by
    ``artefacts.trained_head``, or, with a {path} beside it, read from there as the user's own).

    drafter: the drafter's name (in messages and the prepare command); kind: the head kind the trainer builds
    (eagle, eagle3, medusa, hydra, longspec); what: how messages name the head ("eagle3 head", "Medusa heads")."""

    def __init__(self, drafter: str, kind: str, what: str, chosen: dict, listed: dict, cache_dir: str | None):
        self.drafter, self.kind, self.what = drafter, kind, what
        self.chosen, self.listed, self.cache_dir = chosen, listed, cache_dir

    def spec(self, target) -> dict:
        """The head entry for ``target``, or a one-line SpecbenchError naming the models it knows and the fixes."""
        spec = chosen_or_listed(self.chosen, self.listed, target.name)
        if spec is None:
            known = ", ".join(sorted(self.listed)) or "none"
            raise SpecbenchError(
                f"drafter={self.drafter} knows no {self.what} for model {target.name} (it knows {known}); pass "
                f"drafter.head.hub_id=... or drafter.head.path=..., or list {target.name}: {{trained: {{}}}} in "
                f"drafter.heads_by_model to train one (python scripts/train_head.py --model {target.name} --kind "
                f"{self.kind} builds it ahead)")
        return spec

    def trained_recipe(self, target):
        """The checked ``training.heads.Recipe`` of the head entry for ``target`` when it names a head trained for it
        ({trained: {...}}), else None: what a drafter compares with what it reads before anything is built. A recipe
        out of range is a one-line SpecbenchError."""
        from specbench.training.heads import recipe_of

        spec = self.spec(target)
        return recipe_of(self.kind, dict(spec["trained"] or {})) if "trained" in spec else None

    def cached(self, target) -> dict:
        """{"head": the TrainedHead artefact} when the head is trained in the cache; {} for a published head (downloaded
        or read, not built) and for a trained head at the user's own path."""
        from specbench.artefacts.base import prepare_command
        from specbench.artefacts.trained_head import TrainedHead, trained_head_directory

        spec = self.spec(target)
        if "trained" not in spec or spec.get("path"):
            return {}
        settings = dict(spec["trained"] or {})
        directory = trained_head_directory(target, self.kind, settings, self.cache_dir)
        return {"head": TrainedHead(target, directory, self.kind, settings,
                                    command=prepare_command(target.name, self.drafter))}

    def load(self, target, read_published):
        """(the head, what the run records of its source, where another engine reads it from). A published head is
        read by ``read_published(source, revision)``, source a local directory or a hub id."""
        spec = self.spec(target)
        if "trained" in spec:
            from specbench.artefacts.base import fetch
            from specbench.artefacts.trained_head import TrainedHead

            settings = dict(spec["trained"] or {})
            if spec.get("path"):
                directory = Path(spec["path"]).expanduser()
                head = TrainedHead(target, directory, self.kind, settings, given=True).get()
            else:
                cached = self.cached(target)
                directory = cached["head"].directory
                head = fetch(cached)["head"]
            return head, {"trained": settings, "directory": str(directory)}, str(directory)
        source = spec.get("path") or spec.get("hub_id")
        local = str(Path(source).expanduser()) if spec.get("path") else source
        head = read_published(local, spec.get("revision"))
        return head, {"source": source, "revision": spec.get("revision")}, head_checkpoint(spec)


def head_checkpoint(spec: dict) -> str:
    """Where another engine (vLLM) reads a published head from: its local directory, else its hub snapshot in
    the local cache, else its hub id."""
    from specbench import hub_cache

    if spec.get("path"):
        return str(Path(spec["path"]).expanduser())
    return str(hub_cache.cached_snapshot(spec["hub_id"], spec.get("revision")) or spec["hub_id"])
