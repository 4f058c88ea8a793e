"""Facts the docs state in two places, or that the code also states, held together: every results table in
docs/results.md names a batch of its Batches table; the README's results table holds the rows of the one batch
named under it; the time HD's model database takes for the embedded model is the code's; and what the docs say
the default suite runs of the GPU check is what the test marks make it run. Each check fails naming the table,
row or sentence that drifted."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
HEX_COMMIT = re.compile(r"\b[0-9a-f]{7,40}\b")


def page(name: str) -> str:
    return (ROOT / name).read_text(encoding="utf-8")


# ---- markdown tables --------------------------------------------------------------------------------------------

def cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def tables(text: str) -> list[dict]:
    """Every table in ``text``: its header line's index, its column names, its rows (lists of cells), the paragraph
    just above it (its caption) and the text below it up to the next heading."""
    lines = text.splitlines()
    found = []
    index = 0
    while index < len(lines) - 1:
        if lines[index].startswith("|") and re.fullmatch(r"\|(\s*:?-+:?\s*\|)+", lines[index + 1].strip()):
            end = index + 2
            while end < len(lines) and lines[end].startswith("|"):
                end += 1
            above = index - 1
            while above >= 0 and not lines[above].strip():
                above -= 1
            start = above
            while start > 0 and lines[start - 1].strip() and not lines[start - 1].startswith(("|", "#")):
                start -= 1
            below = end
            while below < len(lines) and not lines[below].startswith("#"):
                below += 1
            found.append({"line": index + 1, "columns": cells(lines[index]),
                          "rows": [cells(line) for line in lines[index + 2:end]],
                          "caption": " ".join(lines[start:above + 1]), "after": "\n".join(lines[end:below])})
            index = end
        else:
            index += 1
    return found


def method(cell: str) -> str:
    """The drafter name of a method cell: `pld+budget` (the first code span), without any note beside it."""
    named = re.search(r"`([^`]+)`", cell)
    return named.group(1) if named else cell


def section(text: str, heading: str) -> str:
    assert heading in text, f"no section {heading!r}"
    start = text.index(heading)
    following = text.find("\n## ", start + len(heading))
    return text[start:following if following >= 0 else len(text)]


# ---- the batches of docs/results.md -----------------------------------------------------------------------------

def batches(results: str) -> dict[str, dict[str, str]]:
    """docs/results.md's Batches table: batch id -> {column: cell}."""
    table = tables(section(results, "## Batches"))[0]
    return {method(row[0]): dict(zip(table["columns"], row)) for row in table["rows"]}


def results_tables(results: str) -> list[dict]:
    """The tables of measured numbers: every table of docs/results.md but the Batches table itself."""
    return tables(results)[1:]


def batches_named(caption: str, known: dict) -> list[str]:
    return [name for name in re.findall(r"`([^`]+)`", caption) if name in known]


def test_every_batch_names_its_date_code_machine_and_command():
    known = batches(page("docs/results.md"))
    assert len(known) >= 5, known
    for name, row in known.items():
        assert re.search(r"\d{4}-\d{2}-\d{2}", row["numbers committed"]), f"batch {name}: no date"
        assert HEX_COMMIT.search(row["code"]) or "not recorded" in row["code"], f"batch {name}: no code commit"
        assert row["machine"] and row["AR ms / token"], f"batch {name}: no machine or AR cost"
        assert "python " in row["command"] or row["command"].startswith("as `"), f"batch {name}: no command"


def test_every_results_table_names_the_batch_it_comes_from():
    results = page("docs/results.md")
    known = batches(results)
    unnamed = [f"docs/results.md:{table['line']} ({table['caption'][:80]}...)" for table in results_tables(results)
               if not batches_named(table["caption"], known)]
    assert len(results_tables(results)) >= 9
    assert not unnamed, f"these results tables name no batch of the Batches table: {unnamed}"


def readme_rows_outside_batch(readme: str, results: str) -> list[str]:
    """The methods of the README's results table that are not, with the same figures, rows of a docs/results.md
    table of the one batch named under it ("Batch `NAME`: ...", which must also name the batch's code commit)."""
    table = tables(section(readme, "## Measured here"))[0]
    named = re.findall(r"Batch `([^`]+)`", table["after"])
    assert len(named) == 1, f"the README names {len(named)} batches under its results table: {named}"
    known = batches(results)
    assert named[0] in known, f"the README's batch {named[0]} is not in docs/results.md's Batches table"
    commit = HEX_COMMIT.search(known[named[0]]["code"])
    assert commit and commit.group(0) in table["after"], "the README does not name its batch's code commit"
    measured = {}
    for other in results_tables(results):
        if batches_named(other["caption"], known) == named:
            for row in other["rows"]:
                measured.setdefault(method(row[0]), dict(zip(other["columns"], row)))
    outside = []
    for row in table["rows"]:
        shown = dict(zip(table["columns"], row))
        there = measured.get(method(row[0]))
        if there is None or any(there.get(column, "").replace("*", "") != value.replace("*", "")
                                for column, value in shown.items() if column != "method"):
            outside.append(method(row[0]))
    return outside


def test_the_readme_results_table_holds_the_rows_of_the_one_batch_named_under_it():
    outside = readme_rows_outside_batch(page("README.md"), page("docs/results.md"))
    assert not outside, f"README rows not found with these figures in their batch's tables: {outside}"


def test_the_readme_check_fails_for_a_row_of_another_batch():
    # The check itself: a row measured in another batch (suffix's, AR at 32.7 ms) is reported by name.
    readme = page("README.md")
    header = "|---|---|---|---|\n"
    mixed = readme.replace(header, header + "| `suffix` | 1.70x | 2.11 | 3.2 |\n", 1)
    assert readme_rows_outside_batch(mixed, page("docs/results.md")) == ["suffix"]


# ---- HD's model database for the embedded model -----------------------------------------------------------------

def test_the_docs_give_hds_model_database_the_time_the_shipped_answers_make_it_take():
    """The package ships the embedded model's answers at HD's settings, so its model database takes seconds; the
    docs that time it say so, and the 17 min 37 s they quote for generating the answers is the code's estimate."""
    hd = yaml.safe_load(page("conf/drafter/hd.yaml"))["model_db_build"]
    manifest = json.loads(page("specbench/data/answers-smollm2-135m.json"))
    prompts = [line for line in page("specbench/data/model_db_prompts.jsonl").splitlines() if line.strip()]
    assert (manifest["max_new_tokens"], manifest["prompts"]["count"]) == (hd["max_new_tokens"], len(prompts))

    usage = page("docs/usage.md")
    builder = [line for line in usage.splitlines() if "build_model_db.py --model smollm2-135m" in line]
    assert builder and all("min" not in line.split("#", 1)[-1] for line in builder), builder
    hd_row = next(line for line in page("docs/first_use.md").splitlines() if line.startswith("| `hd`"))
    assert "shipped" in hd_row

    from specbench.artefacts.target_answers import SECONDS_PER_ANSWER_SLOT
    seconds = round(SECONDS_PER_ANSWER_SLOT * len(prompts) * hd["max_new_tokens"])
    assert f"{seconds // 60} min {seconds % 60} s" in " ".join(usage.split())
    assert f"({round(seconds / 60)} min if generated)" in hd_row


def test_the_pruned_drafts_times_agree_between_first_use_usage_and_the_code():
    """first_use.md's table and usage.md quote the same times for a pruned draft's first build (the 256-token
    answers it distils on, the 100k-token distillation), and the code's estimates are built from those times."""
    from specbench.artefacts.target_answers import SECONDS_PER_ANSWER_SLOT
    from specbench.artefacts.pruned_draft import SECONDS_PER_DISTILL_TOKEN

    first_use = " ".join(page("docs/first_use.md").split())
    usage = " ".join(page("docs/usage.md").split())
    distill_low, distill_high = (float(x) for x in re.search(
        r"distilling 100k tokens takes ([\d.]+) to ([\d.]+) minutes", usage).groups())
    assert f"distilled on 100k tokens | {distill_low:g}-{distill_high:g} min |" in first_use
    assert SECONDS_PER_DISTILL_TOKEN * 100_000 / 60 == pytest.approx((distill_low + distill_high) / 2)

    prompts = len([line for line in page("specbench/data/model_db_prompts.jsonl").splitlines() if line.strip()])
    answers_min = round(SECONDS_PER_ANSWER_SLOT * prompts * 256 / 60 * 2) / 2  # to the half minute the docs quote
    assert f"answers up to 256 tokens (distillation corpus) | {answers_min:g} min |" in first_use
    assert f"about {answers_min:g} min on 2 cores" in usage


# ---- the GPU check and the default suite ------------------------------------------------------------------------

def is_marked_slow(test_file: Path, test_name: str) -> bool:
    tree = ast.parse(test_file.read_text(encoding="utf-8"))
    function = next(node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == test_name)
    return any(ast.unparse(decorator) == "pytest.mark.slow" for decorator in function.decorator_list)


def sentences(text: str) -> list[str]:
    return re.split(r"(?<=[.;])\s+(?=[A-Z`(])", " ".join(text.split()))


def claims_the_default_suite_runs_it(sentence: str) -> bool:
    return bool(re.search(r"default (suite|tests?|test run) (also )?runs?\b|is a default test|in the default suite",
                          sentence)) and not re.search(r"\bnot\b|n't", sentence)


def test_the_docs_say_what_the_slow_mark_does_with_the_gpu_check():
    addopts = re.search(r'addopts = "([^"]*)"', page("pyproject.toml")).group(1)
    slow = is_marked_slow(ROOT / "tests" / "test_gpu_check.py", "test_gpu_check_passes_on_the_cpu")
    assert slow and "not slow" in addopts, "the GPU check's CPU mode is in the default suite again: update the docs"
    wrong = [f"{name}: {sentence}" for name in ["README.md", *sorted(f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md"))]
             for sentence in sentences(page(name))
             if ("GPU check" in sentence or "gpu_check" in sentence) and claims_the_default_suite_runs_it(sentence)]
    assert not wrong, f"these say the default suite runs the GPU check, a slow test: {wrong}"
    development = [sentence for sentence in sentences(page("docs/development.md"))
                   if "test_gpu_check_passes_on_the_cpu" in sentence]
    assert development and all("-m slow" in sentence for sentence in development), development


def test_the_gpu_check_sentence_check_catches_the_old_wording():
    # The check itself: development.md's wording before issue 31 is caught.
    old = ("the default suite runs the GPU check in its CPU mode (`scripts/gpu_check.py --device cpu --quick`, "
           "in `-m slow`; on a GPU machine, [docs/gpu.md](gpu.md)).")
    assert claims_the_default_suite_runs_it(old)
    assert not claims_the_default_suite_runs_it("`-m slow` and CI run it, the default suite does not.")
