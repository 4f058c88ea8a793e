"""The seam between drafters and the cache: every cached thing is one ``Artefact`` implementing the whole protocol,
a drafter's ``prepare`` loads exactly the artefacts its ``artefacts`` names (so ``python -m specbench.prepare`` and a
run cannot disagree), and the storage ground floor and the datastores import nothing above them."""

from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path

import pytest
from hydra.utils import instantiate

import specbench
from specbench.artefacts import base
from specbench.artefacts.base import Artefact, fetch, plan_entries
from specbench.config import compose
from specbench.errors import SpecbenchError

PACKAGE = Path(specbench.__file__).parent
KINDS = {"TargetAnswers", "SampledAnswers", "StatisticsDatastore", "ModelDatabase", "CorpusAutomaton", "PrunedDraft",
         "TrainedHead", "GgufConversion", "SearchedSkipSet", "FineTunedDraft"}


def imported_modules(path: Path) -> set[str]:
    """Every specbench module ``path`` imports, at the top or inside a function."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return {name for name in names if name == "specbench" or name.startswith("specbench.")}


def upward_imports(folder: str, allowed: tuple[str, ...]) -> list[str]:
    """The imports of ``folder``'s modules outside ``allowed`` (the package root itself, which holds only the
    version and imports nothing, is allowed everywhere)."""
    assert imported_modules(PACKAGE / "__init__.py") == set()
    return [f"{path.relative_to(PACKAGE.parent)} imports {name}"
            for path in sorted((PACKAGE / folder).glob("*.py"))
            for name in sorted(imported_modules(path) - {"specbench"})
            if not any(name == prefix or name.startswith(prefix + ".") for prefix in allowed)]


def test_storage_imports_nothing_above_it():
    assert upward_imports("storage", ("specbench.storage", "specbench.errors")) == []


def test_datastores_import_nothing_above_them():
    assert upward_imports("datastores", ("specbench.datastores", "specbench.storage", "specbench.errors")) == []


def test_the_artefacts_import_no_drafter_runner_or_entry_point():
    """Builders sit below the drafters that name them and the runs that load them."""
    assert upward_imports("artefacts", ("specbench.artefacts", "specbench.storage", "specbench.errors",
                                        "specbench.datastores", "specbench.training", "specbench.heads",
                                        "specbench.questions")) == []


def test_the_training_algorithms_know_nothing_of_the_cache():
    """Pruning, distillation and the EAGLE training loop are given their data; what is cached, and how, is the
    artefacts' business."""
    assert upward_imports("training", ("specbench.training", "specbench.heads", "specbench.storage",
                                       "specbench.errors")) == []


def test_the_import_check_catches_an_upward_import(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("import os\n\ndef f():\n    from specbench.artefacts.base import fetch\n    from specbench import errors\n")
    assert imported_modules(module) == {"specbench.artefacts.base", "specbench"}


def artefact_kinds() -> dict[str, type]:
    for path in sorted((PACKAGE / "artefacts").glob("*.py")):
        importlib.import_module(f"specbench.artefacts.{path.stem}")

    def below(cls):
        for sub in cls.__subclasses__():
            yield sub
            yield from below(sub)

    return {cls.__name__: cls for cls in below(Artefact) if cls.__module__.startswith("specbench.artefacts.")}


def test_every_artefact_kind_implements_the_whole_protocol():
    kinds = artefact_kinds()
    assert set(kinds) == KINDS
    required = Artefact.__abstractmethods__
    assert required == {"what", "label", "estimate", "rebuild_command", "build", "load"}
    for name, cls in kinds.items():
        assert not inspect.isabstract(cls), name
        for method in required:
            assert getattr(cls, method) is not getattr(Artefact, method), f"{name}.{method} is Artefact's"
        assert "directory" in inspect.getsource(cls.__init__) and "command" in inspect.getsource(cls.__init__), name


class Recorded(Artefact):
    """An artefact whose build and load say what they did."""

    def __init__(self, directory: Path, log: list, fails: str | None = None):
        self.directory, self.command, self.log, self.fails = directory, "build-it", log, fails

    what = property(lambda self: f"the thing in {self.directory.name}")
    label = property(lambda self: f"thing {self.directory.name}")

    def estimate(self):
        return 1.0, "measured"

    def rebuild_command(self):
        return "rebuild-it"

    def check(self):
        self.log.append(("check", self.directory.name))
        if self.fails:
            raise SpecbenchError(self.fails)

    def build(self):
        self.log.append(("build", self.directory.name))
        from specbench.storage.publish import replace_directory

        replace_directory(self.directory, lambda staging: (staging / "x.npy").write_bytes(b"1"), {"kind": "thing"})

    def load(self):
        self.log.append(("load", self.directory.name))
        return self.directory.name


def test_fetch_checks_every_missing_artefact_before_building_any(tmp_path):
    log = []
    with pytest.raises(SpecbenchError, match="second has no corpus"):
        fetch({"a": Recorded(tmp_path / "first", log), "b": Recorded(tmp_path / "second", log, "second has no corpus")})
    assert log == [("check", "first"), ("check", "second")]  # nothing built: the second's input was missing
    log.clear()
    assert fetch({"a": Recorded(tmp_path / "first", log), "b": Recorded(tmp_path / "second", log)}) == \
        {"a": "first", "b": "second"}
    assert ("build", "first") in log and ("build", "second") in log
    log.clear()
    assert fetch({"a": Recorded(tmp_path / "first", log)}) == {"a": "first"}
    assert log == [("load", "first")]  # cached: neither checked nor built


def test_a_plan_lists_an_input_only_while_what_it_builds_is_missing(tmp_path):
    log = []
    built_from = Recorded(tmp_path / "input", log)
    thing = Recorded(tmp_path / "thing", log)
    thing.inputs = lambda: [built_from]
    assert [entry.directory for entry in plan_entries([thing])] == [tmp_path / "input", tmp_path / "thing"]
    thing.get()
    assert [entry.directory for entry in plan_entries([thing])] == [tmp_path / "thing"]
    assert plan_entries([thing])[0].state() == "cached"


DRAFTERS = {
    "hd": ["drafter.model_db_build.max_prompts=4", "drafter.model_db_build.max_new_tokens=6"],
    "rest": [],
    "samd": [],
    "hybrid": ["drafter.corpus=python-docs"],
    "wide-pruned": [],
    "eagle3": [],
    "medusa": [],
}


@pytest.mark.parametrize("name", DRAFTERS)
def test_prepare_loads_exactly_the_artefacts_its_drafter_names(name, tiny, tmp_path, monkeypatch):
    """A drafter whose prepare built or loaded a cached thing its artefacts() did not name would let a run build
    what python -m specbench.prepare never built: every load_or_rebuild a prepare makes is of a named artefact
    (or of an input planned beside one), and every artefact named is loaded."""
    cache = tmp_path / "cache"
    corpus = cache / "corpora" / "python-docs"
    corpus.mkdir(parents=True)
    (corpus / "corpus.txt").write_text((Path(__file__).parent / "fixtures" / "corpus.txt").read_text())
    monkeypatch.setenv("SPECBENCH_CACHE", str(cache))
    drafter = instantiate(compose(["model=tiny-random", f"drafter={name}", *DRAFTERS[name]]).drafter)
    artefacts = drafter.artefacts(tiny)
    assert artefacts and all(isinstance(artefact, Artefact) for artefact in artefacts)
    named = {Path(entry.directory) for entry in plan_entries(artefacts)}
    looked_up = []
    real = base.load_or_rebuild

    def recording(directory, what, load, build):
        looked_up.append(Path(directory))
        return real(directory, what, load, build)

    monkeypatch.setattr(base, "load_or_rebuild", recording)
    drafter.prepare(tiny)
    assert set(looked_up) <= named, f"{name} looked up {set(looked_up) - named}, which its artefacts() did not name"
    assert {Path(artefact.directory) for artefact in artefacts} <= set(looked_up)
    assert all(entry.ready() for entry in plan_entries(drafter.artefacts(tiny)))
