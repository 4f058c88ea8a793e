"""The skip set Draft & Verify's offline search finds for a target (searching.py, search.ipynb): Bayesian
optimisation over one number per sublayer (``training.layer_search``), each candidate scored by the greedy tokens/s
of self-speculative decoding with it (``max_step_draft`` 8, threshold 0.8 adapting, the original's ``essg``
defaults) on a few prompts, the best one kept. Built once per target and settings, published with a manifest.

The search is long (the original ran 1000 candidates of 8 prompts x 32 tokens on a 13B model), so every scored
candidate is appended to a progress file beside the cache entry as it is scored: an interrupted search resumes from
the last one, and a resumed search suggests what an uninterrupted one would have (candidate i's random draws come
from the seed and i alone).

The prompts: Draft & Verify searched on 4 CNN/DailyMail and 4 XSum articles, which no run here may download;
specbench's own model-database prompts (``specbench/data/model_db_prompts.jsonl``, none of them a measured question)
stand in, in the target's prompt format.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tqdm import tqdm

from specbench.artefacts.base import Artefact, relative_size
from specbench.errors import SpecbenchError
from specbench.storage.cache import cached_path
from specbench.storage.manifest import read_manifest, verify_files
from specbench.storage.publish import replace_directory
from specbench.training.layer_search import GaussianProcessUCB, Sublayers, threshold_skip_set

log = logging.getLogger(__name__)

# The search as Draft & Verify ran it (searching.py, search.ipynb; docs/fidelity.md).
SEARCH_DEFAULTS = {"iterations": 1000, "prompts": 8, "new_tokens": 32, "kappa": 2.576, "alpha": 1e-2, "seed": 1,
                   "max_step_draft": 8, "th_stop_draft": 0.8}
# A scored candidate costs about its decoded tokens at this many seconds each on 2 cores for SmolLM2-135M (random
# skip sets accept little: 21.7 s for 8 prompts x 32 tokens, measured), plus the optimiser's fit.
SECONDS_PER_TOKEN = 0.085
SECONDS_PER_SUGGESTION = 1.0


def search_settings(search: dict, for_model: dict | None, model: str | None = None) -> dict:
    """The search's settings: SEARCH_DEFAULTS, the drafter's ``search``, then its entry for ``model``, each checked
    in one line naming it (``drafter.search.iterations must be ...``)."""
    settings = {**SEARCH_DEFAULTS, **(search or {}), **(for_model or {})}
    unknown = set(settings) - set(SEARCH_DEFAULTS)
    if unknown:
        raise SpecbenchError(f"drafter.search has no setting {sorted(unknown)[0]!r}; the settings are "
                             f"{', '.join(SEARCH_DEFAULTS)}")
    where = "search" if model is None else f"searches_by_model.{model}"
    for key in ("iterations", "prompts", "new_tokens", "max_step_draft", "seed"):
        value = settings[key]
        if (isinstance(value, bool) or not isinstance(value, int) or value < (0 if key == "seed" else 1)
                or value > 2**31 - 1):
            raise SpecbenchError(f"drafter.{where}.{key} must be a {'non-negative' if key == 'seed' else 'positive'} "
                                 f"integer <= {2**31 - 1}, got {value!r}")
    for key, high in (("kappa", 1e6), ("alpha", 1e6), ("th_stop_draft", 1.0)):
        value = settings[key]
        if (isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= high
                or (key == "alpha" and value == 0)):
            raise SpecbenchError(f"drafter.{where}.{key} must be a number in {'(' if key == 'alpha' else '['}0, "
                                 f"{high:g}], not inf or nan, got {value!r}")
    return settings


# The search's objective: a skip set -> its score (higher is better). The original's, the greedy tokens/s of
# self-speculative decoding with the set, is the drafter's to give (``drafters.self_spec.decoding_speed``): the
# builders sit below the drafters.
Objective = Callable[[Sublayers], float]


@dataclass(frozen=True)
class FoundSkipSet:
    skip: Sublayers
    score: float  # the greedy tokens/s it decoded at in the search
    iterations: int


class SearchedSkipSet(Artefact):
    """The searched skip set of ``settings`` for ``target``, in the cache; ``objective()`` gives the function a build
    scores candidates with (made only when building)."""

    def __init__(self, target, settings: dict, cache_dir: str | None, command: str,
                 objective: Callable[[], Objective]):
        self.target, self.settings, self.command, self.objective = target, settings, command, objective
        self.directory = cached_path(cache_dir, "skip-sets", f"{target.name}-self-spec",
                                     {"source": target.source, **settings})

    @property
    def progress_file(self) -> Path:
        return self.directory.with_name(f".{self.directory.name}.search.jsonl")

    @property
    def what(self) -> str:
        s = self.settings
        return (f"the self-spec skip set of {self.target.name} (Draft & Verify's Bayesian search: {s['iterations']} "
                f"candidates x {s['prompts']} prompts x {s['new_tokens']} tokens)")

    @property
    def label(self) -> str:
        return f"skip set of {self.target.name}"

    def estimate(self) -> tuple[float | None, str]:
        s = self.settings
        per_candidate = s["prompts"] * s["new_tokens"] * SECONDS_PER_TOKEN * relative_size(self.target)
        return (s["iterations"] * (per_candidate + SECONDS_PER_SUGGESTION),
                f"{s['iterations']} candidates of {s['prompts'] * s['new_tokens']} tokens at "
                f"{SECONDS_PER_TOKEN * 1000:.0f} ms each measured for SmolLM2-135M, x {relative_size(self.target):.3g} "
                f"for this target's size, plus about {SECONDS_PER_SUGGESTION:g} s of optimiser per candidate")

    def rebuild_command(self) -> str:
        return self.command

    def build(self) -> None:
        self.announce()
        found, record = search_skip_set(self.target, self.settings, self.progress_file, self.objective())
        replace_directory(self.directory, lambda staging: (staging / "skip_set.json").write_text(
            json.dumps(record, indent=2) + "\n"), {"kind": "self-spec skip set", **record})
        self.progress_file.unlink(missing_ok=True)
        log.info("self-spec skip set of %s: %d attention and %d MLP sublayers skipped, %.1f tokens/s in the search",
                 self.target.name, len(found.skip.attention), len(found.skip.mlp), found.score)

    def load(self) -> FoundSkipSet:
        fix = f"rebuild it with `{self.command}`"
        manifest = read_manifest(self.directory, "skip set", fix)
        problem = verify_files(self.directory, manifest)
        if problem:
            raise SpecbenchError(f"{self.directory}: damaged skip set ({problem}); {fix}")
        try:
            record = json.loads((self.directory / "skip_set.json").read_text())
            skip = Sublayers(frozenset(record["attention"]), frozenset(record["mlp"]))
            found = FoundSkipSet(skip, float(record["tokens_per_s"]), int(record["iterations"]))
        except Exception as error:  # a file of another shape: damaged all the same
            raise SpecbenchError(f"{self.directory}: damaged skip set ({type(error).__name__}); {fix}") from None
        if record.get("target", {}).get("layers") != self.target.num_layers:
            raise SpecbenchError(f"{self.directory}: a skip set for a target of {record.get('target', {}).get('layers')}"
                                 f" layers, not {self.target.name}'s {self.target.num_layers}; {fix}")
        return found


def search_prompts(target, count: int) -> list[list[int]]:
    """The first ``count`` of specbench's model-database prompts in ``target``'s prompt format."""
    from specbench.datastores.prompts import model_db_prompts

    prompts = model_db_prompts(None)
    if count > len(prompts):
        raise SpecbenchError(f"drafter.search.prompts={count} is more than the {len(prompts)} prompts the search "
                             "reads (specbench/data/model_db_prompts.jsonl)")
    return [target.encode_conversation([text], []) for text in prompts[:count]]


def _read_progress(path: Path, settings: dict, dimensions: int) -> list[tuple[np.ndarray, float]]:
    """The candidates an interrupted search of the same settings scored, in order; a file of other settings or a
    cut-short last line is read up to where it is whole."""
    if not path.is_file():
        return []
    scored = []
    for line in path.read_text().splitlines():
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            break  # the line being written when the search was stopped
        if entry.get("settings") != settings or len(entry.get("point", ())) != dimensions:
            return []  # another search's: started again
        scored.append((np.asarray(entry["point"], dtype=float), float(entry["score"])))
    return scored


def search_skip_set(target, settings: dict, progress_file: Path, score: Objective) -> tuple[FoundSkipSet, dict]:
    """Run (or resume) the search; (what it found, the record published). ``score``: the objective; a set skipping
    every sublayer, which would draft from the embeddings alone, is scored 0 without calling it."""
    layers = target.num_layers
    dimensions = 2 * layers
    optimizer = GaussianProcessUCB(dimensions, settings["kappa"], settings["alpha"])
    done = _read_progress(progress_file, settings, dimensions)
    for point, value in done:
        optimizer.register(point, value)
    if done:
        log.info("resuming the skip-set search of %s after %d of %d candidates (%s)", target.name, len(done),
                 settings["iterations"], progress_file)
    started = time.perf_counter()
    progress_file.parent.mkdir(parents=True, exist_ok=True)
    if done:  # rewritten whole: a line cut short by the interruption goes
        progress_file.write_text("".join(_progress_line(settings, point, value) for point, value in done))
    elif progress_file.exists():
        progress_file.unlink()  # another search's
    with open(progress_file, "a") as progress, tqdm(total=settings["iterations"], initial=len(done),
                                                     desc=f"skip-set search ({target.name})", unit="candidate") as bar:
        for iteration in range(len(done), settings["iterations"]):
            point = optimizer.suggest(np.random.default_rng([settings["seed"], iteration]))
            skip = threshold_skip_set(point, layers)
            value = score(skip) if len(skip.attention) + len(skip.mlp) < dimensions else 0.0
            optimizer.register(point, value)
            progress.write(_progress_line(settings, point, value))
            progress.flush()
            bar.update(1)
            bar.set_postfix(best=f"{max(optimizer.scores):.1f} tok/s")
    point, value = optimizer.best()
    skip = threshold_skip_set(point, layers)
    record = {"target": {"name": target.name, "source": target.source, "layers": layers},
              "attention": sorted(skip.attention), "mlp": sorted(skip.mlp), "tokens_per_s": value,
              "iterations": settings["iterations"], "settings": settings,
              "seconds": round(time.perf_counter() - started, 1)}
    return FoundSkipSet(skip, value, settings["iterations"]), record


def _progress_line(settings: dict, point: np.ndarray, score: float) -> str:
    return json.dumps({"settings": settings, "point": point.tolist(), "score": score}) + "\n"
