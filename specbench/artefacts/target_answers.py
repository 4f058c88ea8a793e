"""The target's greedy answers to a prompt set, generated once per model and cached: HD's model database and the
distillation of pruned drafts both read them.

Layout in the cache (``<cache>/answers``)::

    <model>-<key>/                    published whole by storage.publish.replace_directory: answers.jsonl and the
                                      manifest.json that records its size and SHA-256 (checked on every read)
    <model>-<key>[.rank<r>].partial   the rows of a generation under way, one batch appended at a time; an
                                      interrupted generation resumes from its whole, valid rows
    <model>-<key>.jsonl               an answers file of an earlier specbench (no checksum): taken as the staging
                                      of its generation, so its rows are kept and published with a checksum

The package ships the embedded model's answers to the built-in prompts at HD's length (``specbench/data/
answers-<model>.json`` and its ``.jsonl.gz``), so that HD's first use on a fresh machine skips the ~18 minutes of
generating them, and may ship more answer sets beside them (``answers-<model>--<set>.json``, e.g. ``--head``: the
answers trained heads learn from, scripts/ship_answers.py --prompts head): a lookup whose cache has no answers
installs the shipped set whose key is the one the lookup computes (same model source, prompts and length) when its
checksum holds; otherwise it generates, with a warning.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from specbench.artefacts.base import Artefact, PlannedArtefact, prepare_command, relative_size
from specbench.datastores.prompts import HEAD_PROMPTS, MODEL_DB_PROMPTS, PACKAGE_DATA, model_db_prompts
from specbench.errors import SpecbenchError, damage_reason
from specbench.storage.atomic import append_whole
from specbench.storage.cache import cached_path, settings_key
from specbench.storage.locks import rank_tag
from specbench.storage.manifest import read_manifest, verify_files
from specbench.storage.publish import replace_directory
from specbench.storage.refusal import raise_refusal

log = logging.getLogger(__name__)
ANSWERS_FILE = "answers.jsonl"
SHIPPED_ANSWERS_DIR = Path(__file__).resolve().parent.parent / "data"
SHIPPED_KIND = "shipped target answers"
# Measured: SmolLM2-135M's greedy answers to the 96 built-in prompts, up to 1024 tokens, batches of 8, took 17 min
# 37 s on 2 cores (docs/usage.md): 1057 s / (96 x 1024) per answer-token slot. A batch decodes until its longest
# answer ends, so slots, not the tokens finally kept, are what costs; a larger model costs in proportion to its size.
SECONDS_PER_ANSWER_SLOT = 1057 / (96 * 1024)


# Named prompt sets of the package (a trained head's ``prompts`` setting); anything else is a prompt set spec of
# datastores.prompts.
PROMPT_SETS = {"head": "head_prompts.jsonl", "built-in": "model_db_prompts.jsonl"}


def prompts_digest(spec: str) -> str | None:
    """The SHA-256 of a local prompt file's bytes (a named set's or a path's), so an edited set names another head;
    None for hub and ShareGPT sources (their text is only read when the answers are generated)."""
    path = prompt_file(spec)
    if path is None or not path.is_file():
        return None
    return hashlib.sha256(path.read_bytes()).hexdigest()


def prompt_file(spec: str) -> Path | None:
    """The local file of a prompt set spec, or None for hub and ShareGPT sources."""
    if spec in PROMPT_SETS:
        return PACKAGE_DATA / PROMPT_SETS[spec]
    if spec.startswith(("hf:", "sharegpt")):
        return None
    return Path(spec).expanduser()


def resolve_prompt_set(spec: str) -> list[str]:
    """The prompts of ``Recipe.prompts``."""
    path = prompt_file(spec)
    return read_prompts(path if path is not None else spec)


def read_prompts(path: str | Path) -> list[str]:
    """Prompts of a prompt set: a jsonl file (``prompt`` field, or the first of Spec-Bench ``turns``), a text
    file (one per line), or a named source (``sharegpt``, ``hf:OpenAssistant/oasst1``; see
    specbench/datastores/prompts.py)."""
    return model_db_prompts(str(path))


@torch.inference_mode()
def generate_answers(target, prompts: list[str], max_new_tokens: int, batch_size: int, on_batch=None,
                     done: int = 0) -> list[list[int]]:
    """The target's greedy answers (token ids, up to its EOS) to ``prompts[done:]``, in batches; ``on_batch``
    (if given) receives each batch's answers as soon as they exist, so a long build can be resumed."""
    pad = min(target.eos_token_ids)
    answers = []
    batches = range(done, len(prompts), batch_size)
    for begin in tqdm(batches, desc=f"{target.name} answering prompts", unit="batch"):
        encoded = [target.encode_conversation([prompt], []) for prompt in prompts[begin : begin + batch_size]]
        width = max(len(ids) for ids in encoded)
        input_ids = torch.full((len(encoded), width), pad, dtype=torch.long)
        attention = torch.zeros((len(encoded), width), dtype=torch.long)
        for row, ids in enumerate(encoded):  # left padding, so every answer starts at the same column
            input_ids[row, width - len(ids):] = torch.tensor(ids)
            attention[row, width - len(ids):] = 1
        continuations = target.weights.generate(input_ids, attention, max_new_tokens, target.eos_token_ids, pad)
        batch = []
        for row in continuations.tolist():
            cut = next((i for i, token in enumerate(row) if token in target.eos_token_ids), len(row))
            batch.append(row[:cut])
        answers += batch
        if on_batch is not None:
            on_batch(list(zip(encoded, batch)))
    return answers


def answers_settings(target, prompts: list[str], max_new_tokens: int) -> dict:
    """What a cached answer set is keyed by: the model's source, the prompts' text itself (not a prompt file's
    path, so an edited prompt file gets new answers) and the answer length."""
    return {"source": target.source, "prompts": prompts, "max_new_tokens": max_new_tokens}


def answers_directory(target, prompts: list[str], max_new_tokens: int, cache_dir: str | None = None) -> Path:
    return cached_path(cache_dir, "answers", target.name, answers_settings(target, prompts, max_new_tokens))


def resolve_prompts(prompts: str | list[str] | None) -> list[str]:
    return prompts if isinstance(prompts, list) else read_prompts(prompts if prompts else MODEL_DB_PROMPTS)


def answers_seconds(target, prompts: int, max_new_tokens: int) -> float:
    """A rough time to generate answers to ``prompts`` prompts of up to ``max_new_tokens`` tokens on 2 cores."""
    return prompts * max_new_tokens * SECONDS_PER_ANSWER_SLOT * relative_size(target)


class TargetAnswers(Artefact):
    """The target's greedy answers to a prompt set: a list of prompts, or a prompt set spec (``read_prompts``;
    default: the built-in set, disjoint from the evaluation questions). Generated once per model, prompt set and
    length, and cached with a checksum: HD's model database and the distillation of pruned drafts read the same
    answers, and damaged ones are generated again with a warning. An interrupted generation resumes from the
    batches already answered. Answers shipped with the package for exactly these settings are installed instead of
    generated (``install_shipped_answers``). ``purpose`` and ``command`` (what builds them ahead of time) go into
    the one line said before a generation starts."""

    def __init__(self, target, prompts: str | list[str] | None = None, max_new_tokens: int = 256,
                 batch_size: int = 8, cache_dir: str | None = None, purpose: str = "", command: str | None = None):
        self.target, self.prompts = target, resolve_prompts(prompts)
        self.max_new_tokens, self.batch_size, self.cache_dir, self.purpose = max_new_tokens, batch_size, cache_dir, purpose
        self.directory = answers_directory(target, self.prompts, max_new_tokens, cache_dir)
        self.command = command or prepare_command(target.name)

    @property
    def settings(self) -> dict:
        return answers_settings(self.target, self.prompts, self.max_new_tokens)

    @property
    def what(self) -> str:
        return (f"the greedy answers of {self.target.name} to {len(self.prompts)} prompts, up to "
                f"{self.max_new_tokens} tokens each" + (f" ({self.purpose})" if self.purpose else ""))

    @property
    def label(self) -> str:
        return f"answer set of {self.target.name}"

    def estimate(self) -> tuple[float | None, str]:
        scale = relative_size(self.target)
        return (answers_seconds(self.target, len(self.prompts), self.max_new_tokens),
                f"{len(self.prompts)} prompts x {self.max_new_tokens} tokens at {SECONDS_PER_ANSWER_SLOT * 1000:.1f} "
                f"ms per token measured for SmolLM2-135M, x {scale:.3g} for this model's size; shorter answers end "
                "sooner")

    def shipped_copy(self) -> tuple[bool, str | None]:
        # The very check the install acts on (a few ms): a plan never promises an install that would then fail and
        # generate for many minutes.
        found = shipped_answer_set(self.target.name, self.settings)
        return found.data is not None, found.damage

    def rebuild_command(self) -> str:
        return self.command

    def build(self) -> None:
        # Answers the package ships are installed, under the build lock, where none are cached and where the
        # cached copy is damaged (reinstalled whole from the package rather than generated for many minutes).
        if install_shipped_answers(self.target, self.directory, self.settings):
            return
        self.announce()
        _generate_into(self.directory, self.target, self.prompts, self.max_new_tokens, self.batch_size)

    def load(self) -> list[tuple[list[int], list[int]]]:
        return read_answers(self.directory, len(self.prompts))


def planned_answers(target, prompts: list[str], max_new_tokens: int, cache_dir: str | None = None,
                    purpose: str = "", command: str | None = None) -> PlannedArtefact:
    """The plan entry of the answer set ``target_answers`` looks up."""
    return TargetAnswers(target, prompts, max_new_tokens, cache_dir=cache_dir, purpose=purpose, command=command).plan()


def target_answers(target, prompts: str | list[str] | None = None, max_new_tokens: int = 256, batch_size: int = 8,
                   cache_dir: str | None = None, purpose: str = "",
                   command: str | None = None) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, answer ids) of ``TargetAnswers``, generated first if need be. One job generates while another
    waits and then reads what it published (see storage.locks.build_lock for the ranks of a torchrun job, which
    generate together)."""
    return TargetAnswers(target, prompts, max_new_tokens, batch_size, cache_dir, purpose, command).get()


# ---- answers shipped with the package --------------------------------------------------------------------------


def prompt_texts_digest(prompts: list[str]) -> str:
    """The SHA-256 of a list of prompt texts (a shipped answer set's manifest names its prompts by it)."""
    return hashlib.sha256(json.dumps(prompts).encode("utf-8")).hexdigest()


def shipped_stem(model_name: str, set_name: str | None = None) -> str:
    """The file name, without its suffixes, of an answer set shipped for ``model_name``: ``answers-<model>`` for
    the built-in prompts HD answers, ``answers-<model>--<set>`` for another set."""
    return f"answers-{model_name}" + (f"--{set_name}" if set_name else "")


def shipped_sets(model_name: str, shipped_dir: Path | None = None) -> list[str | None]:
    """The answer sets shipped for ``model_name``: None (the built-in prompts' set) first, then the named ones in
    name order."""
    folder = shipped_dir or SHIPPED_ANSWERS_DIR
    prefix = f"{shipped_stem(model_name)}--"
    named = sorted(file.name[len(prefix):-len(".json")] for file in folder.glob(f"{prefix}*.json"))
    return [None, *named]


@dataclass(frozen=True)
class ShippedSet:
    """What the package ships for one lookup, checked whole: the ``manifest`` and the decompressed rows (``data``)
    of the set whose key is the lookup's; otherwise (``data`` None) why none is installed: ``damage`` (that set's
    file, or a manifest that could have been its, is damaged) or ``mismatch`` (the sets shipped are for other
    settings), both None when nothing is shipped for the model."""

    manifest: dict | None = None
    data: bytes | None = None
    damage: str | None = None
    mismatch: str | None = None


def shipped_answer_set(model_name: str, settings: dict, shipped_dir: Path | None = None) -> ShippedSet:
    """The one check of the answers shipped for ``model_name`` against a lookup of ``settings``
    (``answers_settings``): a plan reports it (``TargetAnswers.shipped_copy``) and the install acts on it
    (``install_shipped_answers``), so what a plan promises is what a run does. Every shipped set's manifest is read
    (a damaged one is damage: it may have been this lookup's), the set whose key is the lookup's is taken, and its
    file decompressed and checked against the SHA-256 and row count its manifest records."""
    damage = mismatch = None
    for set_name in shipped_sets(model_name, shipped_dir):
        manifest, problem = _shipped_manifest(model_name, shipped_dir, set_name)
        if manifest is None:
            damage = damage or problem
            continue
        differs = shipped_mismatch(manifest, settings)
        if differs is not None:
            mismatch = mismatch or differs
            continue
        try:
            return ShippedSet(manifest, shipped_rows(manifest, shipped_dir))
        except SpecbenchError as error:
            return ShippedSet(manifest, damage=str(error))
    return ShippedSet(damage=damage, mismatch=mismatch)


def shipped_manifest(model_name: str, shipped_dir: Path | None = None, set_name: str | None = None) -> dict | None:
    """The manifest of the answers shipped for ``model_name`` (``answers-<model>[--<set>].json`` in the package's
    data), or None when none are shipped or the manifest is unreadable (then nothing is installed)."""
    manifest, problem = _shipped_manifest(model_name, shipped_dir, set_name)
    if problem:
        log.warning("the shipped answers' manifest is damaged (%s); not using it", problem)
    return manifest


def _shipped_manifest(model_name: str, shipped_dir: Path | None = None,
                      set_name: str | None = None) -> tuple[dict | None, str | None]:
    """(the manifest of the answers shipped for ``model_name``, None) when there is a readable one; (None, what is
    wrong with it) when it is damaged, whatever the reading raised; (None, None) when none is shipped."""
    file = (shipped_dir or SHIPPED_ANSWERS_DIR) / f"{shipped_stem(model_name, set_name)}.json"
    try:
        manifest = json.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None, None
    except Exception as error:  # OSError, UnicodeDecodeError, JSONDecodeError, RecursionError (deep nesting), ...
        return None, f"{file}: {damage_reason(error)}"
    if not isinstance(manifest, dict) or manifest.get("kind") != SHIPPED_KIND:
        return None, f"{file}: not a manifest of shipped answers"
    for key in ("model", "prompts"):
        if not isinstance(manifest.get(key), dict):
            return None, f"{file}: its {key!r} is not a table"
    # What an install copies into the cached copy's manifest and its line (the machine it was generated on).
    if not isinstance(manifest.get("generated") or {}, dict):
        return None, f"{file}: its 'generated' is not a table"
    return manifest, None


def shipped_mismatch(manifest: dict, settings: dict) -> str | None:
    """Why the shipped answers of ``manifest`` are not the answer set of ``settings`` (``answers_settings``), or
    None when their key is the one a lookup computes."""
    differences = []
    if manifest.get("model", {}).get("source") != settings["source"]:
        differences.append(f"model source {manifest.get('model', {}).get('source')!r}, not {settings['source']!r}")
    if manifest.get("prompts", {}).get("sha256") != prompt_texts_digest(settings["prompts"]):
        differences.append(f"{manifest.get('prompts', {}).get('count')} other prompts, not these "
                           f"{len(settings['prompts'])}")
    if manifest.get("max_new_tokens") != settings["max_new_tokens"]:
        differences.append(f"max_new_tokens {manifest.get('max_new_tokens')}, not {settings['max_new_tokens']}")
    if not differences and manifest.get("key") != settings_key(settings):
        differences.append(f"key {manifest.get('key')}, not {settings_key(settings)}")
    return "; ".join(differences) or None


def shipped_rows(manifest: dict, shipped_dir: Path | None = None) -> bytes:
    """The answers file of shipped ``manifest``, decompressed and checked against its recorded SHA-256 and row
    count; a one-line SpecbenchError says what is wrong."""
    file = (shipped_dir or SHIPPED_ANSWERS_DIR) / str(manifest.get("file"))
    try:
        data = gzip.decompress(file.read_bytes())
    except Exception as error:  # OSError (BadGzipFile among them), EOFError, zlib.error, ...
        raise SpecbenchError(f"{file}: {damage_reason(error)}") from None
    if hashlib.sha256(data).hexdigest() != manifest.get("sha256"):
        raise SpecbenchError(f"{file}: its SHA-256 is not the one its manifest records")
    if any(_pair(line) is None for line in data.splitlines()) or len(data.splitlines()) != manifest.get("answers"):
        raise SpecbenchError(f"{file}: does not hold {manifest.get('answers')} answers of token ids")
    return data


def install_shipped_answers(target, directory: Path, settings: dict, shipped_dir: Path | None = None) -> bool:
    """Publish the answers shipped for ``target`` at ``directory`` (as a generation would, with a checksum) when
    they are the answer set of ``settings``; True if installed. Shipped answers for other settings are not used
    (a note says so: another answer set is simply another artefact), nor are damaged ones (a warning says why);
    the caller then generates."""
    found = shipped_answer_set(target.name, settings, shipped_dir)
    if found.data is None:
        if found.damage is not None:
            log.warning("the answers shipped with specbench for %s are damaged (%s): generating them instead",
                        target.name, found.damage)
        elif found.mismatch is not None:
            log.info("the answers shipped with specbench for %s are for other settings (%s): generating these "
                     "instead", target.name, found.mismatch)
        return False
    manifest, data = found.manifest, found.data
    replace_directory(directory, lambda version: (version / ANSWERS_FILE).write_bytes(data),
                      {"kind": "target answers", "model": {"name": target.name, "source": target.source},
                       "answers": manifest["answers"], "max_new_tokens": settings["max_new_tokens"],
                       "shipped": {"file": manifest["file"], "sha256": manifest["sha256"],
                                   "generated": manifest.get("generated")}})
    generated = manifest.get("generated") or {}
    log.info("using the answers shipped with specbench for %s (%d prompts, up to %d tokens, generated on %s): "
             "installed in %s, nothing to generate", target.name, manifest["answers"], settings["max_new_tokens"],
             generated.get("machine", "an unrecorded machine"), directory)
    return True


def write_shipped_answers(target, prompts: list[str], max_new_tokens: int, out_dir: Path, generated: dict,
                          license: str, cache_dir: str | None = None, set_name: str | None = None) -> dict:
    """Write the cached answers of these settings (generated first if missing) as shipped answers into
    ``out_dir``: ``answers-<model>[--<set_name>].jsonl.gz`` and its manifest ``answers-<model>[--<set_name>].json``;
    return the manifest. ``generated`` records the machine, software and time of the generation; ``license`` why
    they may be shipped."""
    pairs = target_answers(target, prompts, max_new_tokens, cache_dir=cache_dir)
    data = "".join(answer_line(prompt_ids, answer_ids) for prompt_ids, answer_ids in pairs).encode("utf-8")
    stem = shipped_stem(target.name, set_name)
    name = f"{stem}.jsonl.gz"
    # mtime=0: the same answers give the same bytes, whenever they are written
    (out_dir / name).write_bytes(gzip.compress(data, compresslevel=9, mtime=0))
    settings = answers_settings(target, prompts, max_new_tokens)
    manifest = {
        "kind": SHIPPED_KIND,
        "key": settings_key(settings),
        "model": {"name": target.name, "source": target.source},
        "prompts": {"set": next((path.name for path in (MODEL_DB_PROMPTS, HEAD_PROMPTS)
                                 if path.is_file() and prompts == read_prompts(path)), "given"),
                    "count": len(prompts), "sha256": prompt_texts_digest(prompts)},
        "max_new_tokens": max_new_tokens,
        "answers": len(pairs),
        "answer_tokens": sum(len(answer) for _, answer in pairs),
        "file": name,
        "bytes": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
        "generated": generated,
        "license": license,
    }
    (out_dir / f"{stem}.json").write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    return manifest


def _generate_into(directory: Path, target, prompts: list[str], max_new_tokens: int, batch_size: int) -> None:
    """Generate the answers through a staging file that an interrupted build resumes from (the build lock makes
    it this process's alone; under torchrun each rank has its own), then publish them whole with a checksum."""
    staging = directory.with_name(f"{directory.name}{rank_tag()}.partial")
    earlier = directory.with_name(f"{directory.name}.jsonl")
    if earlier.is_file() and not staging.exists():
        log.info("the answers in %s (written without a checksum) are taken over into %s", earlier, directory)
        # Copied, not renamed: every rank of a torchrun job resumes from it, in step.
        append_answers(staging, whole_rows(earlier, len(prompts), cut=False))
    pairs = whole_rows(staging, len(prompts))

    def save(batch):
        append_answers(staging, batch)
        pairs.extend(batch)

    generate_answers(target, prompts, max_new_tokens, batch_size, on_batch=save, done=len(pairs))
    lines = "".join(answer_line(prompt_ids, answer_ids) for prompt_ids, answer_ids in pairs)
    replace_directory(directory, lambda version: (version / ANSWERS_FILE).write_text(lines, encoding="utf-8"),
                      {"kind": "target answers", "model": {"name": target.name, "source": target.source},
                       "answers": len(pairs), "max_new_tokens": max_new_tokens})
    for leftover in (staging, earlier):
        with contextlib.suppress(OSError):  # published: a file left here is never read again
            leftover.unlink(missing_ok=True)


def read_answers(directory: Path, expected: int) -> list[tuple[list[int], list[int]]]:
    """The (prompt ids, answer ids) of published answers, checked whole (``storage.manifest.verify_files``: the size,
    and the SHA-256 when its times changed, that manifest.json recorded) and holding ``expected`` rows of
    non-negative token ids; otherwise a one-line SpecbenchError."""
    fix = f"remove {directory} to have them generated again"
    problem = verify_files(directory, read_manifest(directory, "target answers", fix))
    if problem:
        raise SpecbenchError(f"{directory}: damaged target answers ({problem}); {fix}")
    try:
        lines = (directory / ANSWERS_FILE).read_bytes().splitlines()
    except OSError as error:
        raise SpecbenchError(f"{directory}: damaged target answers ({ANSWERS_FILE}: {error.strerror}); {fix}") from None
    pairs = [_pair(line) for line in lines]
    if None in pairs or len(pairs) != expected:
        raise SpecbenchError(f"{directory}: damaged target answers ({ANSWERS_FILE} does not hold {expected} "
                             f"answers of token ids); {fix}")
    return pairs


def answer_line(prompt_ids, answer_ids) -> str:
    return json.dumps({"prompt_ids": list(prompt_ids), "answer_ids": list(answer_ids)}) + "\n"


def _pair(line: bytes) -> tuple[list[int], list[int]] | None:
    """A row's (prompt ids, answer ids), or None unless it is a JSON object of two lists of non-negative ids."""
    try:
        row = json.loads(line)
        pair = (row["prompt_ids"], row["answer_ids"])
    except Exception:  # not UTF-8, not JSON, too deeply nested (RecursionError), not an object of the two keys
        return None
    valid = all(isinstance(ids, list) and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in ids)
                for ids in pair)
    return pair if valid else None


def whole_rows(file: Path, limit: int, cut: bool = True) -> list[tuple[list[int], list[int]]]:
    """The rows of a staging file (or an earlier answers file) up to the first that is not whole and valid, at
    most ``limit``. What follows them (the half line of an interrupted write, or damage) is not trusted: with
    ``cut`` it is cut off, so that the next batch is appended right after the last whole row."""
    try:
        data = file.read_bytes()
    except FileNotFoundError:
        return []
    except OSError as error:
        raise_refusal(error, file, "read")
    pairs, end = [], 0
    for line in data.splitlines(keepends=True):
        pair = _pair(line) if line.endswith(b"\n") and len(pairs) < limit else None
        if pair is None:
            break
        pairs.append(pair)
        end += len(line)
    if cut and end < len(data):
        try:
            os.truncate(file, end)
        except OSError as error:
            raise_refusal(error, file)
    return pairs


def append_answers(staging: Path, pairs) -> None:
    """Append the rows of one batch to ``staging``, whole or not at all (``storage.atomic.append_whole``)."""
    append_whole(staging, "".join(answer_line(prompt_ids, answer_ids) for prompt_ids, answer_ids in pairs).encode("utf-8"))


# ---- answers sampled from the target (an EAGLE head's training data) -------------------------------------------


class SampledAnswers(Artefact):
    """``per_prompt`` answers to each prompt sampled from the target at ``temperature``: more of the target's own
    text than its greedy answers give, near the paths it drafts on. Generated once and cached like
    ``TargetAnswers`` (checksummed; one process generates while others wait), batch by batch through a staging
    file that an interrupted generation resumes from. Each batch draws from a generator seeded by (seed, batch),
    so a resumed generation samples what an uninterrupted one would."""

    def __init__(self, target, prompts: list[str], per_prompt: int, temperature: float, seed: int,
                 max_new_tokens: int = 256, batch_size: int = 16, cache_dir: str | None = None):
        self.target, self.per_prompt, self.temperature, self.seed = target, per_prompt, temperature, seed
        self.max_new_tokens, self.batch_size = max_new_tokens, batch_size
        self.jobs = [prompt for _ in range(per_prompt) for prompt in prompts]
        self.directory = cached_path(cache_dir, "answers", f"{target.name}-sampled",
                                     {"source": target.source, "prompts": prompts, "per_prompt": per_prompt,
                                      "temperature": temperature, "seed": seed, "max_new_tokens": max_new_tokens,
                                      "batch_size": batch_size})
        self.command = prepare_command(target.name)

    @property
    def what(self) -> str:
        return (f"{self.per_prompt} answers of {self.target.name} sampled at temperature {self.temperature:g} to each "
                f"of {len(self.jobs) // max(1, self.per_prompt)} prompts")

    @property
    def label(self) -> str:
        return f"sampled answer set of {self.target.name}"

    def estimate(self) -> tuple[float | None, str]:
        return None, "generated within the build of the head that trains on them"

    def rebuild_command(self) -> str:
        return self.command

    def build(self) -> None:
        _sample_into(self.directory, self.target, self.jobs, self.temperature, self.seed, self.max_new_tokens,
                     self.batch_size)

    def load(self) -> list[tuple[list[int], list[int]]]:
        return read_answers(self.directory, len(self.jobs))


def sampled_answers(target, prompts: list[str], per_prompt: int, temperature: float, seed: int,
                    max_new_tokens: int = 256, batch_size: int = 16, cache_dir: str | None = None
                    ) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, answer ids) of ``SampledAnswers``, generated first if need be."""
    return SampledAnswers(target, prompts, per_prompt, temperature, seed, max_new_tokens, batch_size, cache_dir).get()


def _sample_into(directory: Path, target, jobs: list[str], temperature: float, seed: int, max_new_tokens: int,
                 batch_size: int) -> None:
    staging = directory.with_name(f"{directory.name}.partial")
    pairs = whole_rows(staging, len(jobs))
    done = len(pairs) if len(pairs) == len(jobs) else len(pairs) // batch_size * batch_size
    if done < len(pairs):  # the rows of a batch whose writing was killed: sampled again, with its own seed
        pairs = pairs[:done]
        staging.unlink()
        append_answers(staging, pairs)
    for begin in tqdm(range(done, len(jobs), batch_size), desc=f"{target.name} sampling answers", unit="batch"):
        batch = _sample_batch(target, jobs[begin:begin + batch_size], temperature, max_new_tokens,
                              seed * 1_000_003 + begin // batch_size)
        append_answers(staging, batch)
        pairs += batch
    lines = "".join(answer_line(prompt_ids, answer_ids) for prompt_ids, answer_ids in pairs)
    replace_directory(directory, lambda version: (version / ANSWERS_FILE).write_text(lines, encoding="utf-8"),
                      {"kind": "sampled target answers", "model": {"name": target.name, "source": target.source},
                       "answers": len(pairs), "temperature": temperature, "seed": seed,
                       "max_new_tokens": max_new_tokens})
    with contextlib.suppress(OSError):
        staging.unlink(missing_ok=True)


@torch.inference_mode()
def _sample_batch(target, prompts: list[str], temperature: float, max_new_tokens: int, seed: int):
    """Sampled answers (up to the target's EOS) to ``prompts``, left-padded into one batch."""
    pad = min(target.eos_token_ids)
    encoded = [target.encode_conversation([prompt], []) for prompt in prompts]
    width = max(len(ids) for ids in encoded)
    input_ids = torch.full((len(encoded), width), pad, dtype=torch.long)
    attention = torch.zeros((len(encoded), width), dtype=torch.long)
    for row, ids in enumerate(encoded):
        input_ids[row, width - len(ids):] = torch.tensor(ids)
        attention[row, width - len(ids):] = 1
    state = torch.random.get_rng_state()
    torch.manual_seed(seed)  # generate() samples from the global generator
    try:
        continuations = target.weights.generate(input_ids, attention, max_new_tokens, target.eos_token_ids, pad,
                                                temperature=temperature)
    finally:
        torch.random.set_rng_state(state)
    answers = []
    for ids, row in zip(encoded, continuations.tolist()):
        cut = next((i for i, token in enumerate(row) if token in target.eos_token_ids), len(row))
        answers.append((ids, row[:cut]))
    return answers


