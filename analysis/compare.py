"""Measured against published: specbench's MAT and speedup beside the published tables' numbers, per method
(specbench drafter) and task, with the ratios measured / published and the settings that differ.

    from analysis.compare import compare_table, compare_text, mat_figure
    table = compare_table(questions, select_published("spec-bench"))
    print(compare_text(table, questions, published))

The measured numbers are the leaderboard's (``analysis.tables.leaderboard``: ``specbench.measure.metrics``' speedup and
MAT, averaged over repeats), never recomputed here. A measured configuration is set beside every published
table that has a number for its drafter; when some of those tables are of the run's own model, only those.

A measured run is set beside the published rows of the configuration it ran: a published row names its drafter
settings (``drafter_settings``: SAM-Decoding's auxiliary drafter, REST's datastore corpus); where a published
table has rows of the run's configuration only those are shown, and every row shown footnotes each setting
that differs, as it does each drafter setting the run changed from its config's default (conf/drafter/).

MAT counts tokens per target pass, not seconds, so it moves far less with the machine than a speedup does, but
it is not a constant of the method: it depends on the implementation's details and numerics, and is expected
to be close across hardware, not equal (Spec-Bench's own REST on Vicuna-7B: MAT 1.63 on the RTX 3090, 1.82
on the A100). A speedup is a ratio of two timings on one machine and moves with the machine's balance of
compute and memory bandwidth: it compares only on like hardware, so each row says whether the hardware is the
published table's (``same_hardware``: every device the run used is the published chip, by normalised name).
"""

from __future__ import annotations

import functools
import re
import textwrap
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from analysis.figures import method_style
from analysis.published import parse_settings
from analysis.runs import _flatten, _text, drafter_settings, run_settings
from analysis.tables import leaderboard
from specbench.questions import ALL_TASKS, TASKS
from specbench.errors import SpecbenchError
from specbench.results.readers import read_json_file

AGREEMENT = ("MAT (mean accepted tokens per target pass, bonus token included) counts tokens, not seconds: it "
             "depends on the model, drafter and questions, and also on the method's implementation details and "
             "numerics, so it is expected to be close across hardware, not equal (Spec-Bench's REST on Vicuna-7B: "
             "1.63 on the RTX 3090, 1.82 on the A100). Speedups compare only on like hardware: rows with hw DIFF "
             "(or ?) ran on other (or unknown) hardware than the published table.")
SPEC_BENCH_PER_TASK = 80  # Spec-Bench's question.jsonl: 80 questions in each of its six tasks, 480 in all
WIDTH = 120  # the printed table and its notes fit a terminal this wide
# Parts of a GPU's name that say how the chip is packaged or sold, not which chip it is (its memory size is read
# apart): "NVIDIA A100-SXM4-80GB" and "NVIDIA A100 80GB PCIe" are both the A100 with 80 GB (docs/compare.md).
PACKAGING_WORDS = frozenset({"NVIDIA", "GEFORCE", "TESLA", "QUADRO", "SXM", "SXM2", "SXM3", "SXM4", "SXM5", "PCIE",
                             "NVL", "HBM2", "HBM2E", "HBM3", "HBM3E"})
# A leading product-line word, dropped so a row's "3090" or "A6000" names the chip ("TITAN RTX" keeps its RTX).
PRODUCT_LINES = frozenset({"RTX", "GTX"})
MEMORY_TOLERANCE = 0.1  # torch's total memory of an "80GB" A100 is 79.2 GiB, of a 40 GB one 39.4 GiB
TABLE_COLUMNS = ["label", "drafter", "model", "task", "table", "source", "reference", "method", "published_model",
                 "published_hardware", "measured_hardware", "mat", "mat_published", "mat_ratio", "speedup",
                 "speedup_published", "speedup_ratio", "same_hardware", "differs"]


def run_devices(environment: dict) -> list[dict]:
    """Every device a run's environment lists, as {"name", "memory_bytes"}: each GPU the target used
    (``gpus``), or the one ``device`` ("cpu: AMD EPYC", schema 2's "cuda: NVIDIA A100-SXM4-80GB") when it lists
    none; [] when it records neither."""
    gpus = environment.get("gpus")
    if isinstance(gpus, list) and gpus:
        return [{"name": str(gpu.get("name") or "unknown"), "memory_bytes": gpu.get("total_memory_bytes")}
                for gpu in gpus if isinstance(gpu, dict)]
    device = environment.get("device")
    return [{"name": str(device), "memory_bytes": None}] if device else []


def devices_text(devices: list[dict], device: str | None = None) -> str | None:
    """The devices as the footnotes name them: the recorded ``device`` for one, "cuda: 2 x NAME" or
    "cuda: NAME + NAME" for several; None for none."""
    if len(devices) <= 1:
        return device or (devices[0]["name"] if devices else None)
    names = [entry["name"] for entry in devices]
    return "cuda: " + (f"{len(names)} x {names[0]}" if len(set(names)) == 1 else " + ".join(names))


def normalised_device(name: str | None) -> tuple[str, int | None]:
    """(chip, memory in GB or None) of a device name, as torch or a paper writes it: the "cuda:" prefix, the
    vendor and product-line words and the packaging (SXM4, PCIe, HBM3) dropped, the memory size read apart, the
    rest upper-cased, a leading RTX or GTX dropped. The chip is compared exactly, so an RTX A1000 is never an A100 and a 3090 Ti not a 3090.

    >>> normalised_device("cuda: NVIDIA A100-SXM4-80GB"), normalised_device("NVIDIA GeForce RTX 3090 Ti")
    (('A100', 80), ('3090 TI', None))
    """
    text = re.sub(r"^\s*[a-z]+:\s*", "", str(name or ""))  # "cuda: NVIDIA ..." -> "NVIDIA ..."
    memory = None
    found = re.search(r"(\d+)\s*GB\b", text, flags=re.IGNORECASE)
    if found:
        memory = int(found.group(1))
        text = text[:found.start()] + " " + text[found.end():]
    words = [word for word in re.split(r"[\s\-_/(),]+", text.upper()) if word and word not in PACKAGING_WORDS]
    if len(words) > 1 and words[0] in PRODUCT_LINES:  # "RTX 3090" is the 3090 of a row that says "3090"
        words = words[1:]
    return " ".join(words), memory


def _same_device(device: dict, chip: str, memory: int | None) -> bool:
    mine, my_memory = normalised_device(device["name"])
    if mine != chip:
        return False
    if memory is None:
        return True  # the published row does not say which memory size: the chip is all there is to compare
    if my_memory is not None:
        return my_memory == memory
    size = device.get("memory_bytes")
    if isinstance(size, (int, float)) and size > 0:
        return abs(size / 2**30 - memory) <= MEMORY_TOLERANCE * memory
    return True  # "NVIDIA GeForce RTX 3090" names no size, and the run recorded none: the chip decides


def same_hardware(devices, hardware: str | None, hardware_match: str | None = None) -> bool | None:
    """Whether every device a run used (``run_devices``, or one name) is the published chip: the normalised
    chip names equal (``normalised_device`` of the published ``hardware``, or of ``hardware_match`` where the
    row gives no hardware) and, where both sides say, the same memory size (A100 40 GB and 80 GB differ in
    memory bandwidth, 1.6 against 2.0 TB/s, which moves speedups). None when either side is unknown."""
    if isinstance(devices, str):
        devices = [{"name": devices, "memory_bytes": None}]
    published = hardware or hardware_match
    if not devices or not published:
        return None
    chip, memory = normalised_device(published)
    return all(_same_device(device, chip, memory) for device in devices)


@functools.lru_cache(maxsize=None)
def drafter_defaults(name: str) -> dict[str, str] | None:
    """The drafter settings conf/drafter/<name>.yaml sets, flattened as run.json's are compared
    (``analysis.runs.drafter_settings``); a value interpolated from another group (``${task.path}``) is left
    out, as it follows that group rather than the drafter. None for a drafter without a config of its name."""
    from omegaconf import OmegaConf

    from specbench.config import CONF_DIR, compose
    from specbench.run.identity import NOT_RESULT_SETTINGS

    if not (CONF_DIR / "drafter" / f"{name}.yaml").is_file():
        return None
    flat: dict[str, str] = {}
    _flatten(OmegaConf.to_container(compose([f"drafter={name}"]).drafter, resolve=False), "", flat)
    return {key: value for key, value in flat.items()
            if key != "name" and not value.startswith("${") and f"drafter.{key}" not in NOT_RESULT_SETTINGS}


def overridden_settings(drafter: str, settings: dict[str, str] | None) -> dict[str, str | None]:
    """The drafter settings a run (``settings``: its recorded ones, flattened) changed from its config's
    defaults, as {key: the default (None: a key the config does not have)}; {} when either is unknown."""
    defaults = drafter_defaults(drafter) if settings else None
    if not defaults:
        return {}
    return {key: defaults.get(key) for key, value in settings.items()
            if key != "_target_" and defaults.get(key) != value}


def run_conditions(run_dir, drafter: str | None = None) -> dict:
    """The settings a published table is compared on, as one run recorded them: hardware (its devices' names,
    ``devices_text``) and devices (``run_devices``), dtype, temperature (0 when not recorded: greedy, the
    default, as run labels read it), question_file (None: the built-in sample set), drafter_settings (the
    recorded drafter settings, flattened) and overridden (those changed from the config's defaults,
    ``overridden_settings`` of ``drafter``); all None (devices [], overridden {}) for what records no settings
    (a Spec-Bench model_answer file, a run without run.json)."""
    path = Path(run_dir)
    conditions = {"hardware": None, "devices": [], "dtype": None, "temperature": None, "question_file": None,
                  "drafter_settings": None, "overridden": {}}
    if not path.is_dir() or not (path / "run.json").is_file():
        return conditions
    settings = run_settings(path)
    environment = settings.get("environment")
    if not isinstance(environment, dict):  # schema 2 kept the device's name in summary.json
        environment = read_json_file(path / "summary.json", "run's summary").get("environment") or {}
    devices = run_devices(environment)
    recorded = drafter_settings(settings) if isinstance(settings.get("drafter"), dict) else None
    return {"hardware": devices_text(devices, environment.get("device")), "devices": devices,
            "dtype": settings.get("dtype"), "temperature": settings.get("temperature") or 0.0,
            "question_file": settings.get("question_file"), "drafter_settings": recorded,
            "overridden": overridden_settings(drafter, recorded) if drafter else {}}


def measured_stats(questions: pd.DataFrame) -> pd.DataFrame:
    """One row per measured configuration (model, label) and task (and overall): drafter, questions (all tasks,
    of one run), mat and speedup (the leaderboard's means over repeats), and the first run's conditions."""
    table = leaderboard(questions)
    rows = []
    for (model, label), part in questions.groupby(["model", "label"], sort=False):
        first_run = part[part.run_dir == part.run_dir.iloc[0]]
        conditions = run_conditions(first_run.run_dir.iloc[0], part.drafter.iloc[0])
        counts = first_run.groupby("task").question_id.nunique()
        for task in [task for task in (*ALL_TASKS, "overall") if task in counts.index or task == "overall"]:
            rows.append({"model": model, "label": label, "drafter": part.drafter.iloc[0], "task": task,
                         "questions": int(counts.sum()),
                         "mat": table.loc[(model, label), (task, "mat", "mean")],
                         "speedup": table.loc[(model, label), (task, "speedup", "mean")], **conditions})
    return pd.DataFrame(rows)


def configuration_differences(measured, published) -> list[str]:
    """The drafter settings a published row names (its ``drafter_settings``) that the measured run did not run
    with, in words: "drafter auxiliary: measured recycling vs published eagle2"; a setting the row names without
    a value is "not stated"; the run's value is "unknown" without a run.json, "not recorded" when its run.json
    lacks the key."""
    mine = measured.drafter_settings
    found = []
    for key, theirs in parse_settings(published.drafter_settings or "").items():
        value = mine.get(key, "not recorded") if isinstance(mine, dict) else "unknown"
        if not theirs:
            found.append(f"drafter {key}: measured {value}, not stated by the published table")
        elif value != theirs:
            found.append(f"drafter {key}: measured {value} vs published {theirs}")
    return found


def _configuration_matches(measured, published) -> bool:
    """No setting the published row states differs from the run's (unstated ones cannot tell rows apart)."""
    return not any(" vs published " in text for text in configuration_differences(measured, published))


def _question_set(measured) -> str:
    source = measured.question_file or "the built-in sample set"
    return f"{source}, {measured.questions} question{'' if measured.questions == 1 else 's'}"


def _full_question_set(measured) -> bool:
    """Spec-Bench's whole question file: a question file given (not the sample set) and all its 480 questions."""
    return bool(measured.question_file) and measured.questions == SPEC_BENCH_PER_TASK * len(TASKS)


def differing_settings(measured, published) -> list[str]:
    """What differs between a measured configuration's row (a row of ``measured_stats``) and a published row (of
    ``_published_rows``), both as ``itertuples`` gives them, in words;
    a setting the published table does not state counts as differing ("not stated"), as nothing says it agrees."""
    found = []

    def differs(name, mine, theirs):
        if theirs in ("", None):
            found.append(f"{name}: measured {mine if mine not in ('', None) else 'unknown'}, not stated by the "
                         "published table")
        elif mine != theirs:
            found.append(f"{name}: measured {mine if mine not in ('', None) else 'unknown'} vs published {theirs}")

    differs("model", measured.model, published.model)
    if same_hardware(measured.devices, published.hardware, published.hardware_match) is not True:
        differs("hardware", measured.hardware or "unknown", published.hardware or published.hardware_match or None)
    differs("dtype", measured.dtype, published.dtype)
    found += configuration_differences(measured, published)
    named = parse_settings(published.drafter_settings or "")
    for key, default in measured.overridden.items():
        value = (measured.drafter_settings or {}).get(key)
        shown = f"default {default}" if default is not None else "a key the config does not have"
        found.append(f"drafter {key}: measured {value}, changed from conf/drafter/{measured.drafter}.yaml's {shown}"
                     + (" (as the published row ran)" if named.get(key) == value else ""))
    theirs = float(published.temperature) if published.temperature not in ("", None) else None
    differs("temperature", None if measured.temperature is None else f"{float(measured.temperature):g}",
            None if theirs is None else f"{theirs:g}")
    if not _full_question_set(measured):
        theirs = published.question_set or "unknown"
        found.append(f"questions: measured {_question_set(measured)} vs published {theirs}")
    if measured.label != measured.drafter:
        found.append(f"method: measured as {measured.label!r}, {measured.drafter} with settings of its own")
    if published.note:
        found.append(f"published note: {published.note}")
    return found


def _ratio(measured, published) -> float:
    return measured / published if published and not pd.isna(measured) else np.nan


def _published_rows(published: pd.DataFrame) -> pd.DataFrame:
    """One row per published table, method and task: speedup and mat (NaN where that table has none), with the
    table's settings."""
    # Every setting that tells published rows apart is part of the key: rows of two models, machines or
    # configurations under one reference stay two rows (load_published refuses two values for one cell).
    keys = ["source", "reference", "method", "drafter", "drafter_settings", "task", "hardware", "hardware_match",
            "model", "dtype", "temperature", "question_set"]
    values = published.pivot_table(index=keys, columns="metric", values="value", aggfunc="first")
    values = values.reindex(columns=["speedup", "mat"])
    notes = published.groupby(keys)["note"].agg(lambda texts: "; ".join(dict.fromkeys(text for text in texts if text)))
    return values.join(notes).reset_index()


def compare_table(questions: pd.DataFrame, published: pd.DataFrame) -> pd.DataFrame:
    """Measured beside published: one row per measured configuration, task and published table that has a
    number for its drafter and task (TABLE_COLUMNS). Only the tables of the run's own model are used when there
    are any (otherwise all, the model listed as differing); ratios are measured / published; same_hardware is
    True, False or None (unknown); differs lists, "; "-joined, the settings that differ (``differing_settings``).
    ``table`` numbers the published tables (T1, T2, ...) in the order of ``published``."""
    measured = measured_stats(questions)
    if not (published.drafter != "").any():  # nothing published that specbench can run
        return pd.DataFrame(columns=TABLE_COLUMNS)
    rows = _published_rows(published[published.drafter != ""])
    numbers = {reference: f"T{index}" for index, reference in enumerate(dict.fromkeys(published.reference), 1)}
    out = []
    for mine in measured.itertuples(index=False):
        candidates = rows[(rows.drafter == mine.drafter) & (rows.task == mine.task)]
        if (candidates.model == mine.model).any():
            candidates = candidates[candidates.model == mine.model]
        # Within one published table, the rows of the run's own configuration when it has any (SAM-Decoding's
        # README has one row per auxiliary); otherwise every row, its differing settings footnoted.
        matches = pd.Series([_configuration_matches(mine, theirs) for theirs in candidates.itertuples(index=False)],
                            index=candidates.index, dtype=bool)
        has_match = matches.groupby(candidates.reference).transform("any") if len(candidates) else matches
        candidates = candidates[matches | ~has_match]
        for theirs in candidates.itertuples(index=False):
            out.append({
                "label": mine.label, "drafter": mine.drafter, "model": mine.model, "task": mine.task,
                "table": numbers[theirs.reference], "source": theirs.source, "reference": theirs.reference,
                "method": theirs.method, "published_model": theirs.model, "published_hardware": theirs.hardware,
                "measured_hardware": mine.hardware, "mat": mine.mat, "mat_published": theirs.mat,
                "mat_ratio": _ratio(mine.mat, theirs.mat), "speedup": mine.speedup,
                "speedup_published": theirs.speedup, "speedup_ratio": _ratio(mine.speedup, theirs.speedup),
                "same_hardware": same_hardware(mine.devices, theirs.hardware, theirs.hardware_match),
                "differs": "; ".join(differing_settings(mine, theirs))})
    table = pd.DataFrame(out, columns=TABLE_COLUMNS)
    # Each measured method's rows grouped by published table, its tasks in Spec-Bench's order: one block per table.
    order = {"label": {label: index for index, label in enumerate(dict.fromkeys(measured.label))},
             "table": {number: int(number[1:]) for number in numbers.values()},
             "method": {method: index for index, method in enumerate(dict.fromkeys(published.method))},
             "task": {task: index for index, task in enumerate((*ALL_TASKS, "overall"))}}
    keys = pd.DataFrame({column: table[column].map(ranks) for column, ranks in order.items()})
    return table.loc[keys.sort_values(list(order), kind="stable").index].reset_index(drop=True)


def _aligned(shown: pd.DataFrame, left: tuple[str, ...]) -> list[str]:
    """``shown`` (strings) as fixed-width lines: the ``left`` columns left-aligned, the numbers right-aligned."""
    widths = {column: max(len(column), *(len(value) for value in shown[column])) for column in shown.columns}

    def line(values) -> str:
        return "  ".join(value.ljust(widths[column]) if column in left else value.rjust(widths[column])
                         for column, value in zip(shown.columns, values)).rstrip()

    return [line(shown.columns), *(line(row) for row in shown.itertuples(index=False))]


def unmatched(questions: pd.DataFrame, published: pd.DataFrame) -> tuple[list[str], list[str], list[str]]:
    """(measured drafters no published row names, drafters published but not measured, published methods that
    have no specbench drafter), each sorted."""
    measured = set(questions.drafter)
    named = set(published.drafter) - {""}
    return (sorted(measured - named), sorted(named - measured),
            sorted(set(published[published.drafter == ""].method)))


def _wrap(text: str, width: int, **options) -> list[str]:
    """``text`` in lines of at most ``width``, broken at spaces only (never inside built-in or A100-SXM4)."""
    return textwrap.wrap(text, width, break_on_hyphens=False, **options)


def number_text(value, suffix: str = "") -> str:
    """A number as compare shows it, printed and in the report: two decimals and ``suffix``, "-" for none."""
    return "-" if pd.isna(value) else f"{value:.2f}{suffix}"


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[:width - 1] + "~"


def _hardware_flag(same) -> str:
    return "?" if same is None or (not isinstance(same, bool) and pd.isna(same)) else ("same" if same else "DIFF")


def compare_text(table: pd.DataFrame, questions: pd.DataFrame, published: pd.DataFrame) -> str:
    """The comparison as printed: the sentence on MAT and hardware, the table (no wider than WIDTH), the published
    tables it refers to (T1, ...), the numbered notes of differing settings, and one line each for methods
    measured but not published and published but not measured."""
    notes = {text: f"[{index}]" for index, text in enumerate(dict.fromkeys(table.differs), 1) if text}
    shown = pd.DataFrame({
        "method": [_cut(label, 18) for label in table.label], "task": list(table.task),
        "published": [_cut(f"{number} {method}", 24) for number, method in zip(table.table, table.method)],
        "MAT": table.mat.map(number_text), "pub MAT": table.mat_published.map(number_text),
        "ratio": table.mat_ratio.map(number_text), "speedup": table.speedup.map(lambda v: number_text(v, "x")),
        "pub speedup": table.speedup_published.map(lambda v: number_text(v, "x")),
        "ratio ": table.speedup_ratio.map(number_text), "hw": table.same_hardware.map(_hardware_flag),
        "notes": table.differs.map(lambda text: notes.get(text, ""))}).astype(str)
    lines = [*_wrap(AGREEMENT, WIDTH), ""]
    lines += (_aligned(shown, ("method", "task", "published", "hw", "notes")) if len(shown)
              else ["(no published number for any measured method)"])
    used = sorted(dict.fromkeys(table.table), key=lambda number: int(number[1:]))
    references = published.drop_duplicates("reference").set_index("reference")
    tables = {number: reference for reference, number in zip(table.reference, table.table)}
    if used:
        lines += ["", "published tables:"]
        for number in used:
            row = references.loc[tables[number]]
            where = ", ".join(filter(None, [row["hardware"], row["model"], row["dtype"],
                                            f"T={row['temperature']}" if row["temperature"] else ""]))
            lines += _wrap(f"{number} = {row['source']}: {tables[number]} ({where or 'settings not stated'})", WIDTH,
                                   subsequent_indent="    ")
    if notes:
        lines += ["", "settings that differ (measured vs published):"]
        for text, mark in notes.items():
            lines += _wrap(f"{mark} {text}", WIDTH, subsequent_indent="    ")
    measured_only, published_only, no_drafter = unmatched(questions, published)
    lines += [""]
    lines += _wrap("measured, not published in this selection: " + (", ".join(measured_only) or "none"), WIDTH)
    lines += _wrap("published, not measured: " + (", ".join(published_only) or "none")
                           + ("; published with no specbench drafter: " + ", ".join(no_drafter) if no_drafter else ""),
                           WIDTH)
    return "\n".join(lines)


def mat_pairs(table: pd.DataFrame) -> pd.DataFrame:
    """The rows of a comparison that have both a measured and a published MAT."""
    return table[table.mat.notna() & table.mat_published.notna()]


def mat_figure(table: pd.DataFrame, path) -> Path:
    """A PNG at ``path``: measured MAT against published MAT, one point per method and published table (marked
    with the table's number, T1, ...), one colour per measured method, and the line y = x where they agree. A
    one-line SpecbenchError when no row has both numbers."""
    pairs = mat_pairs(table)
    if pairs.empty:
        raise SpecbenchError("no measured method has a published MAT in this selection: no MAT figure to draw")
    path = Path(path)
    figure, ax = plt.subplots(figsize=(6, 5))
    labels = list(dict.fromkeys(pairs.label))
    for label in labels:
        part = pairs[pairs.label == label]
        color, _ = method_style(label, labels)
        ax.scatter(part.mat_published, part.mat, color=color, label=label, s=30,
                   marker="^" if "+" in label else "o")  # a tuned variant is never mistaken for the original
        for row in part.itertuples(index=False):  # which published table each point is set against
            ax.annotate(row.table, (row.mat_published, row.mat), xytext=(3, 3), textcoords="offset points",
                        fontsize=6)
    low = 0.9 * min(pairs.mat.min(), pairs.mat_published.min(), 1.0)
    high = 1.05 * max(pairs.mat.max(), pairs.mat_published.max())
    ax.plot([low, high], [low, high], color="black", linewidth=0.8, linestyle="--", label="measured = published")
    ax.set_xlim(low, high)
    ax.set_ylim(low, high)
    ax.set_xlabel("published MAT")
    ax.set_ylabel("measured MAT")
    ax.set_title("Mean accepted tokens: measured vs published")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.tight_layout()
    figure.savefig(path, dpi=150, bbox_inches="tight", format="png")
    plt.close(figure)
    return path
