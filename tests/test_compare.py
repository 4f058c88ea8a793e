"""Published numbers as data (specbench/data/published_results.csv) and measured-vs-published comparison."""

from pathlib import Path

import pytest

from analysis.__main__ import main as analysis_main
from analysis.compare import WIDTH, compare_table, mat_figure, same_hardware
from analysis.published import COLUMNS, SOURCES, load_published, packaged_file, parse_settings, select_published
from analysis.runs import load_questions
from specbench.questions import Prompt
from specbench.decoding.loop import StepRecord
from specbench.errors import SpecbenchError
from specbench.results.run_directory import RunDirectory
from specbench.results.schema import Answer

A100 = "cuda: NVIDIA A100-SXM4-80GB"
ROOT = Path(__file__).resolve().parents[1]


def test_the_packaged_file_loads_and_every_row_says_where_it_was_read():
    table = load_published()
    assert packaged_file().name == "published_results.csv" and list(table.columns) == list(COLUMNS)
    assert (table.source != "").all() and (table.reference != "").all()
    assert set(table.source) <= set(SOURCES)
    assert table.value.gt(0).all()
    # Spec-Bench's leaderboard: 4 tables (41 method rows), 6 task speedups + overall speedup + MAT each.
    assert len(table[table.source == "spec-bench"]) == 41 * 8
    assert not table.duplicated(["reference", "method", "task", "metric"]).any()


@pytest.mark.parametrize("table, method, task, metric, value", [
    # Cells read by hand from Leaderboard.md @fd2c1cd, SAM-Decoding's README and Token Recycling's results.png.
    ("Leaderboard on 3090", "SAMD[EAGLE2]", "mt_bench", "speedup", 2.85),
    ("Leaderboard on 3090", "Lookahead", "overall", "mat", 1.64),
    ("Leaderboard on A100, Vicuna-7B", "PLD", "summarization", "speedup", 2.66),
    ("Leaderboard on A100, Vicuna-7B", "Recycling", "translation", "speedup", 2.02),
    ("Leaderboard on A100, Vicuna-13B", "EAGLE3", "overall", "mat", 5.71),
    ("Leaderboard on A100, Vicuna-13B", "EAGLE3", "overall", "speedup", 3.02),
    ("Leaderboard on A100, Vicuna-33B", "REST", "math_reasoning", "speedup", 1.30),
    ("Leaderboard on A100, Vicuna-33B", "SpS", "overall", "mat", 2.01),
    ("Expeiment result on Spec-Bench", "SAM-Decoding[Token Recycle]", "overall", "mat", 3.03),
    ("Expeiment result on Spec-Bench", "PLD", "translation", "speedup", 0.95),
    ('rows "7B"', "TR", "overall", "mat", 2.70),
    ('rows "33B"', "Lade", "rag", "speedup", 1.14),
])
def test_hand_checked_cells_are_pinned(table, method, task, metric, value):
    rows = load_published()
    cell = rows[rows.reference.str.contains(table, regex=False) & (rows.method == method) & (rows.task == task)
                & (rows.metric == metric)]
    assert list(cell.value) == [value]


# Every published method, restated by hand from its source (not from the CSV): (source, method as published) ->
# (the specbench drafter that implements it, "" for none; the drafter settings the published row ran).
#   spec-bench: hemingkx/Spec-Bench Leaderboard.md @fd2c1cd, its 11 method rows; SAMD[EAGLE2] ran eval.sh:28
#     (--tree_method eagle2 and no --static_sam_path: EAGLE-2 auxiliary, no corpus automaton), REST eval.sh:8, 24
#     (datastore_chat_large.idx: UltraChat, specbench's corpus=hf:stingning/ultrachat); Medusa eval.sh:18 (medusa);
#     Hydra: no drafter.
#   samd: hyx1999/SAM-Decoding README @18c41f0, table "Expeiment result on Spec-Bench": one row per auxiliary
#     (the brackets), the automata alone unbracketed; which corpus its static automaton had, the table does not say.
#   recycling: Luowaterbi/TokenRecycling README @1b4c05c: results.png's rows (AR, Lade = Lookahead decoding, PLD,
#     REST, Medusa, TR = Token Recycling) and the small table's Eagle1, Eagle2, TR.
PUBLISHED_METHODS = {
    ("spec-bench", "SAMD[EAGLE2]"): ("samd", "auxiliary=eagle2; corpus=null"),
    ("spec-bench", "EAGLE3"): ("eagle3", ""), ("spec-bench", "EAGLE2"): ("eagle2", ""),
    ("spec-bench", "EAGLE"): ("eagle", ""), ("spec-bench", "Hydra"): ("hydra", ""), ("spec-bench", "SpS"): ("sps", ""),
    ("spec-bench", "PLD"): ("pld", ""), ("spec-bench", "Medusa"): ("medusa", ""),
    ("spec-bench", "Recycling"): ("recycling", ""), ("spec-bench", "REST"): ("rest", "corpus=hf:stingning/ultrachat"),
    ("spec-bench", "Lookahead"): ("lookahead", ""),
    ("samd", "SAM-Decoding"): ("samd", "auxiliary=none; corpus="),
    ("samd", "SAM-Decoding[EAGLE2]"): ("samd", "auxiliary=eagle2; corpus="),
    ("samd", "SAM-Decoding[Token Recycle]"): ("samd", "auxiliary=recycling; corpus="),
    ("samd", "EAGLE2"): ("eagle2", ""), ("samd", "PLD"): ("pld", ""), ("samd", "Tokey Recycle"): ("recycling", ""),
    ("recycling", "AR"): ("ar", ""), ("recycling", "Lade"): ("lookahead", ""), ("recycling", "PLD"): ("pld", ""),
    ("recycling", "REST"): ("rest", "corpus="), ("recycling", "Medusa"): ("medusa", ""),
    ("recycling", "TR"): ("recycling", ""), ("recycling", "Eagle1"): ("eagle", ""), ("recycling", "Eagle2"): ("eagle2", ""),
    ("self-spec", "Self-speculative decoding"): ("self-spec", ""), ("swift", "SWIFT"): ("swift", ""),
    ("gsd", "GSD"): ("gsd", ""), ("hsddw", "HSDDW"): ("hsddw", ""), ("longspec", "LongSpec"): ("longspec", ""),
}


def test_every_published_method_maps_to_the_drafter_and_configuration_its_source_names():
    rows = load_published()[["source", "method", "drafter", "drafter_settings"]].drop_duplicates()
    assert not rows.duplicated(["source", "method"]).any()  # every row of a method: one drafter and configuration
    assert {(source, method): (drafter, settings)
            for source, method, drafter, settings in rows.itertuples(index=False)} == PUBLISHED_METHODS
    from specbench.config import compose, group_options
    from specbench.drafters.samd import AUXILIARIES

    assert {drafter for drafter, _ in PUBLISHED_METHODS.values()} - {""} <= set(group_options("drafter"))
    for drafter, settings in {pair for pair in PUBLISHED_METHODS.values() if pair[1]}:
        keys = set(compose([f"drafter={drafter}"]).drafter)  # settings the drafter really has
        assert set(parse_settings(settings)) <= keys, (drafter, settings)
    assert set(AUXILIARIES) == {"recycling", "none"}  # so an EAGLE-2 auxiliary is always another configuration


HEADER = ",".join(COLUMNS)
GOOD = "x,ref,A100 80GB,A100,vicuna-7b,float16,0,spec-bench question.jsonl,PLD,pld,qa,speedup,1.5,,"


@pytest.mark.parametrize("row, message", [
    (GOOD.replace(",speedup,", ",tokens_per_s,"), "line 3: metric 'tokens_per_s' is not one of speedup, mat"),
    (GOOD.replace(",qa,", ",coding,"), "line 3: task 'coding' is not one of mt_bench, translation,"),
    (GOOD.replace("x,ref,", ",ref,"), "line 3: no source; every row needs source, reference"),
    (GOOD.replace(",1.5,", ",fast,"), "line 3: value 'fast' is not a positive number"),
    (GOOD + "auxiliary", "line 3: drafter_settings entry 'auxiliary' is not key=value"),
    (GOOD + "corpus=a; corpus=b", "line 3: drafter_settings names 'corpus' twice"),
])
def test_a_bad_row_is_one_line_naming_the_file_line_and_value(tmp_path, row, message):
    path = tmp_path / "mine.csv"
    path.write_text(f"# a comment keeps the line numbers the file's own\n{HEADER}\n{row}\n")
    with pytest.raises(SpecbenchError, match=message) as error:
        select_published(str(path))
    assert str(path) in str(error.value) and "\n" not in str(error.value)


def test_a_user_csv_is_read_whole_and_a_wrong_id_lists_the_choices(tmp_path):
    path = tmp_path / "mine.csv"
    path.write_text(f"{HEADER}\n{GOOD}\n")
    assert list(select_published(str(path)).value) == [1.5]
    with pytest.raises(SpecbenchError, match="--published specbench: not a source id nor a CSV file; choose "
                                             "spec-bench, hd, recycling, samd, dsd, self-spec, swift, gsd, hsddw, longspec, all, or the path"):
        select_published("specbench")
    with pytest.raises(SpecbenchError, match="--published hd: no numbers of that source were found"):
        select_published("hd")


def _run(path, drafter, questions, device=A100, dtype="float16", model="vicuna-7b", settings=None, gpus=None):
    """A run directory answering ``questions``: (task, accept lengths per step, method seconds, baseline
    seconds), each question's tokens the sum of its accept lengths; ``settings``: the drafter settings its run.json
    records besides the name; ``gpus``: its environment's GPU list."""
    run = RunDirectory(path, with_baseline=True)
    run.open({"schema_version": 2, "model": model, "drafter": {"name": drafter, **(settings or {})}, "device": "cuda",
              "dtype": dtype, "temperature": 0.0, "threads": 1})
    for question_id, (task, lengths, seconds, baseline_seconds) in enumerate(questions, start=1):
        tokens = sum(lengths)
        method, base = Answer(), Answer()
        method.steps = [[StepRecord(step=index, draft_tokens=3, candidate_tokens=3, verify_tokens=4,
                                    accepted_tokens=length, draft_s=0.0, verify_s=0.01, overhead_s=0.0,
                                    context_len=10 + index, draft_depth=3 if index else 0)
                        for index, length in enumerate(lengths)]]
        base.steps = [[StepRecord(step=index, draft_tokens=0, verify_tokens=1, accepted_tokens=1, draft_s=0.0,
                                  verify_s=0.01, overhead_s=0.0, context_len=10 + index) for index in range(tokens)]]
        for answer, wall in ((method, seconds), (base, baseline_seconds)):
            answer.texts, answer.token_ids, answer.wall_times = ["x"], [list(range(tokens))], [wall]
        prompt = Prompt(question_id, task, task, ("q",))
        run.add(method.to_record(prompt, drafter, True), base.to_record(prompt, "ar", None),
                method.step_rows(question_id))
    run.write_summary({"model": model, "drafter": drafter, "environment": {"device": device, "gpus": gpus}})
    return path


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("compare")
    # mt_bench: 7 tokens at 20 tok/s vs 10 (2.0x), MAT 7/4; summarization: 7 tokens at 40 vs 10 (4.0x), MAT 7/3.
    # Overall: mean 30 tok/s over mean 10 = 3.0x; MAT 14 tokens over 7 steps = 2.0.
    _run(root / "pld", "pld", [("mt_bench", [1, 2, 2, 2], 0.35, 0.7), ("summarization", [1, 3, 3], 0.175, 0.7)])
    _run(root / "suffix", "suffix", [("qa", [1, 2], 0.1, 0.3)])
    return root


def test_compare_sets_measured_beside_published_with_hand_computed_ratios(runs):
    table = compare_table(load_questions([runs]), select_published("spec-bench"))
    pld = table[table.drafter == "pld"]
    # Only the tables of the run's own model (vicuna-7b): the 3090 one and the A100 one, not 13B or 33B.
    assert set(pld.reference.str.extract(r'"(.*)"')[0]) == {"Leaderboard on 3090 (Vicuna-7B-v1.3, FP16)",
                                                            "Leaderboard on A100, Vicuna-7B-v1.3 (FP16)"}
    a100 = pld[pld.reference.str.contains("A100")].set_index("task")
    assert a100.loc["mt_bench", "speedup"] == pytest.approx(2.0)
    assert a100.loc["mt_bench", "speedup_ratio"] == pytest.approx(2.0 / 1.60)
    assert a100.loc["summarization", "speedup_ratio"] == pytest.approx(4.0 / 2.66)
    assert a100.loc["overall", "speedup_ratio"] == pytest.approx(3.0 / 1.66)
    assert a100.loc["overall", "mat"] == pytest.approx(2.0)
    assert a100.loc["overall", "mat_ratio"] == pytest.approx(2.0 / 1.75)
    assert a100.loc["mt_bench", "mat_published"] != a100.loc["mt_bench", "mat_published"]  # none per task: NaN
    assert set(a100.index) == {"mt_bench", "summarization", "overall"}  # tasks the run did not answer: no row
    assert a100.same_hardware.all() and not pld[pld.reference.str.contains("3090")].same_hardware.any()
    differs = a100.loc["overall", "differs"]
    assert "questions: measured the built-in sample set, 2 questions" in differs
    assert "hardware" not in differs and "dtype" not in differs and "model" not in differs
    assert "hardware: measured cuda: NVIDIA A100-SXM4-80GB vs published NVIDIA GeForce RTX 3090" in (
        pld[pld.reference.str.contains("3090")].differs.iloc[0])
    assert "suffix" not in set(table.drafter)


def test_the_command_line_prints_the_comparison_and_draws_the_figure(runs, tmp_path, capsys):
    figure = tmp_path / "mat.png"
    analysis_main(["compare", str(runs), "--published", "spec-bench", "--figure", str(figure)])
    out = capsys.readouterr().out
    flat = " ".join(out.split())  # the sentences are wrapped at 120 characters
    assert "MAT (mean accepted tokens" in flat and "expected to be close across hardware, not equal" in flat
    assert "Speedups compare only on like hardware" in flat
    # The table and its notes fit 120 columns; the figure's path, printed last, is a path, as long as TMPDIR makes it.
    *lines, path = out.splitlines()
    assert path == str(figure) and max(len(line) for line in lines) <= WIDTH == 120
    assert "measured, not published in this selection: suffix" in flat
    assert "published, not measured: " in flat and "eagle3" in flat and "no specbench drafter" not in flat
    assert "hydra, lookahead, medusa, recycling" in flat  # every leaderboard method has a drafter now
    assert " DIFF " in out and " same " in out and "1.81" in out  # 3.0x / 1.66x, the A100 table's overall
    assert figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and figure.stat().st_size > 1000
    with pytest.raises(SystemExit) as exit_status:
        analysis_main(["compare", str(runs), "--published", "nonsense"])
    assert exit_status.value.code == 2
    assert "--published nonsense: not a source id nor a CSV file" in capsys.readouterr().err


def test_mat_figure_needs_a_published_mat(runs, tmp_path):
    table = compare_table(load_questions([runs]), select_published("spec-bench"))
    assert mat_figure(table, tmp_path / "f.png").is_file()
    with pytest.raises(SpecbenchError, match="no measured method has a published MAT"):
        mat_figure(table[table.task != "overall"], tmp_path / "g.png")


# Item 9: the same hardware is the same chip by normalised name (and memory size where both say), for every device.
GIB = 2**30


@pytest.mark.parametrize("devices, hardware, same", [
    (["NVIDIA A100-SXM4-80GB"], "NVIDIA A100 80GB", True),
    (["NVIDIA A100 80GB PCIe"], "NVIDIA A100 80GB", True),  # the form factor is not compared (docs/compare.md)
    ([("NVIDIA A100", 79.2 * GIB)], "NVIDIA A100 80GB", True),  # the size from torch's total memory
    (["NVIDIA A100-SXM4-40GB"], "NVIDIA A100 80GB", False),  # 1.6 against 2.0 TB/s
    (["NVIDIA A100-PCIE-40GB"], "NVIDIA A100 80GB", False),
    ([("NVIDIA A100", 39.4 * GIB)], "NVIDIA A100 80GB", False),
    (["NVIDIA A100-SXM4-80GB MIG 1g.10gb"], "NVIDIA A100 80GB", False),  # a slice of the chip
    (["NVIDIA RTX A1000"], "NVIDIA A100 80GB", False),
    (["NVIDIA GeForce RTX 3090"], "NVIDIA GeForce RTX 3090 24GB", True),
    ([("NVIDIA GeForce RTX 3090", 23.7 * GIB)], "NVIDIA GeForce RTX 3090 24GB", True),
    (["NVIDIA GeForce RTX 3090 Ti"], "NVIDIA GeForce RTX 3090 24GB", False),
    (["NVIDIA RTX A6000"], "NVIDIA RTX A6000 48GB", True),
    (["NVIDIA A100-SXM4-80GB", "NVIDIA A100-SXM4-80GB"], "NVIDIA A100 80GB", True),
    (["NVIDIA A100-SXM4-80GB", "NVIDIA A100-SXM4-40GB"], "NVIDIA A100 80GB", False),  # every device is read
    (["NVIDIA A100-SXM4-40GB", "NVIDIA A100-SXM4-80GB"], "NVIDIA A100 80GB", False),
    (["cpu: AMD EPYC"], "NVIDIA A100 80GB", False),
    ([], "NVIDIA A100 80GB", None),
    (["NVIDIA A100-SXM4-80GB"], "", None),
])
def test_same_hardware_is_the_same_chip_by_normalised_name_on_every_device(devices, hardware, same):
    listed = [{"name": entry, "memory_bytes": None} if isinstance(entry, str)
              else {"name": entry[0], "memory_bytes": int(entry[1])} for entry in devices]
    assert same_hardware(listed, hardware) is same


def test_a_row_that_names_only_the_chip_matches_every_memory_size_of_it():
    assert same_hardware([{"name": "NVIDIA A100-SXM4-40GB", "memory_bytes": None}], "", "A100") is True
    assert same_hardware([{"name": "NVIDIA RTX A1000", "memory_bytes": None}], "", "A100") is False
    assert same_hardware([{"name": "NVIDIA GeForce RTX 3090", "memory_bytes": None}], "", "3090") is True
    assert same_hardware([{"name": "NVIDIA GeForce RTX 3090 Ti", "memory_bytes": None}], "", "3090") is False
    assert same_hardware([{"name": "NVIDIA RTX A6000", "memory_bytes": None}], "", "A6000") is True


def test_every_gpu_a_run_used_is_compared_and_named(tmp_path):
    gpus = [{"device": "cuda:0", "name": "NVIDIA A100-SXM4-80GB", "total_memory_bytes": int(79.2 * GIB)},
            {"device": "cuda:1", "name": "NVIDIA A100-SXM4-40GB", "total_memory_bytes": int(39.4 * GIB)}]
    _run(tmp_path / "pld", "pld", [("qa", [1, 2], 0.1, 0.3)], gpus=gpus)
    table = compare_table(load_questions([tmp_path]), select_published("spec-bench"))
    a100 = table[table.reference.str.contains("A100, Vicuna-7B")]
    assert not a100.same_hardware.any()
    assert ("hardware: measured cuda: NVIDIA A100-SXM4-80GB + NVIDIA A100-SXM4-40GB vs published NVIDIA A100 80GB"
            in a100.differs.iloc[0])


# Item 9 and the held-out class: a user's own published-numbers file loses no number silently.
def _user_csv(tmp_path, *rows, prefix=""):
    path = tmp_path / "mine.csv"
    path.write_text(prefix + "\n".join([HEADER, *rows]) + "\n", encoding="utf-8")
    return path


def test_a_user_csv_with_a_byte_order_mark_loads_every_row(tmp_path):
    path = _user_csv(tmp_path, GOOD, GOOD.replace(",qa,", ",rag,"), prefix="\ufeff")
    assert list(select_published(str(path)).value) == [1.5, 1.5]
    # A file of the columns before drafter_settings existed still loads: a missing optional column is empty.
    path.write_text("\n".join([HEADER.removesuffix(",drafter_settings"), GOOD[:-1]]) + "\n", encoding="utf-8-sig")
    assert list(select_published(str(path)).drafter_settings) == [""]


@pytest.mark.parametrize("temperature", ["greedy", "nan", "-1", "0.7x"])
def test_a_temperature_that_is_not_a_number_is_one_line_naming_the_row_and_value(tmp_path, temperature):
    path = _user_csv(tmp_path, GOOD, GOOD.replace(",float16,0,", f",float16,{temperature},"))
    with pytest.raises(SpecbenchError) as error:
        select_published(str(path))
    text = str(error.value)
    assert f"{path} line 3: temperature {temperature!r} is not a number >= 0 (0 for greedy" in text and "\n" not in text


def test_two_values_for_one_cell_are_one_line_naming_the_cell(tmp_path):
    path = _user_csv(tmp_path, GOOD, GOOD.replace(",qa,", ",rag,"), GOOD.replace(",0,", ",0.0,").replace(",1.5,", ",1.7,"))
    with pytest.raises(SpecbenchError) as error:
        select_published(str(path))
    assert str(error.value) == (f"{path} line 4: a second value (1.7) for the cell of line 2: PLD qa speedup of ref "
                                "(model vicuna-7b, hardware A100 80GB); keep one")
    with pytest.raises(SystemExit) as exit_status:  # and from the command line: one line, exit 2
        analysis_main(["compare", str(path.parent), "--published", str(path)])
    assert exit_status.value.code == 2


def test_rows_of_one_reference_stay_apart_by_model_and_hardware(tmp_path):
    a100 = GOOD.replace(",qa,", ",overall,")
    rows = [a100, a100.replace("A100 80GB,A100,", "NVIDIA GeForce RTX 3090 24GB,3090,").replace(",1.5,", ",1.2,"),
            a100.replace(",vicuna-7b,", ",vicuna-13b,").replace(",1.5,", ",1.9,")]
    published = select_published(str(_user_csv(tmp_path / "..", *rows)))
    _run(tmp_path / "pld", "pld", [("qa", [1, 2], 0.1, 0.3)], device="cuda: NVIDIA A100-SXM4-80GB")
    table = compare_table(load_questions([tmp_path]), published)
    overall = table[table.task == "overall"]
    # Both machines' numbers for the run's own model, each with its own hardware verdict; the 13B one left out.
    assert sorted(zip(overall.speedup_published, overall.same_hardware)) == [(1.2, False), (1.5, True)]


# Item 8: a run is paired with the published rows of its configuration, and every difference is footnoted.
SAMD = {"n_predicts": 40, "len_threshold": 5, "len_bias": 5, "alpha": 4.0, "automaton": None}
MT = [("mt_bench", [1, 2, 2, 2], 0.35, 0.7)]


@pytest.fixture(scope="module")
def configured(tmp_path_factory):
    root = tmp_path_factory.mktemp("configured")
    _run(root / "samd", "samd", MT, settings={**SAMD, "auxiliary": "recycling", "corpus": "python-docs"})
    _run(root / "samd-none", "samd", MT, settings={**SAMD, "auxiliary": "none", "corpus": "python-docs"})
    _run(root / "rest", "rest", MT, settings={"datastore": "auto", "corpus": "python-docs", "num_draft": 64})
    _run(root / "pld", "pld", MT, settings={"max_ngram_size": 2, "num_draft_tokens": 10})
    return root


def _rows(table, label, reference):
    return table[(table.label == label) & table.reference.str.contains(reference, regex=False)]


def test_a_run_is_set_beside_the_rows_of_its_configuration_and_footnotes_every_difference(configured):
    table = compare_table(load_questions([configured]), select_published("all"))
    recycling, none = "samd auxiliary=recycling", "samd auxiliary=none"
    # SAM-Decoding's README has a row per auxiliary: each run is set beside its own only.
    assert set(_rows(table, recycling, "SAM-Decoding README").method) == {"SAM-Decoding[Token Recycle]"}
    assert set(_rows(table, none, "SAM-Decoding README").method) == {"SAM-Decoding"}
    readme = _rows(table, recycling, "SAM-Decoding README").differs.iloc[0]
    assert "drafter corpus: measured python-docs, not stated by the published table" in readme
    assert "drafter auxiliary" not in readme  # the same auxiliary: no difference
    # Spec-Bench's only samd row is SAM-Decoding with EAGLE-2 and no corpus: shown, with both differences.
    for label in (recycling, none):
        leaderboard_rows = _rows(table, label, "Leaderboard on A100, Vicuna-7B")
        assert set(leaderboard_rows.method) == {"SAMD[EAGLE2]"}
        for differs in leaderboard_rows.differs:
            assert f"drafter auxiliary: measured {label.split('=')[1]} vs published eagle2" in differs
            assert "drafter corpus: measured python-docs vs published null" in differs
    assert ("drafter auxiliary: measured none, changed from conf/drafter/samd.yaml's default recycling (as the "
            "published row ran)") in _rows(table, none, "SAM-Decoding README").differs.iloc[0]
    # REST on specbench's default corpus against Spec-Bench's UltraChat datastore; Token Recycling's states none.
    for differs in _rows(table, "rest", "Spec-Bench Leaderboard").differs:
        assert "drafter corpus: measured python-docs vs published hf:stingning/ultrachat" in differs
    for differs in _rows(table, "rest", "TokenRecycling").differs:
        assert "drafter corpus: measured python-docs, not stated by the published table" in differs
    # A drafter setting changed from its config's default is named wherever the run is shown.
    pld = table[table.label == "pld"]
    assert len(pld) and pld.differs.str.contains(
        "drafter max_ngram_size: measured 2, changed from conf/drafter/pld.yaml's default 3", regex=False).all()
    assert not pld.differs.str.contains("num_draft_tokens").any()  # the default value: not a difference


def test_compare_prints_no_row_of_another_configuration_without_its_footnote(configured, capsys):
    analysis_main(["compare", str(configured), "--published", "all"])
    out = capsys.readouterr().out
    notes = {line.split("]")[0] + "]": line for line in " ".join(out.split("\n    ")).splitlines()
             if line.startswith("[")}
    rows = [line.split() for line in out.splitlines() if line.startswith(("samd", "rest", "pld"))]
    assert rows
    for row in rows:
        note = notes[row[-1]]
        if row[0] == "rest":
            assert "drafter corpus: measured python-docs" in note
        elif "SAMD[EAGLE2]" in row or "SAM-Decoding[EAGLE2]" in row:
            assert "vs published eagle2" in note
        elif row[0] == "pld":
            assert "drafter max_ngram_size: measured 2" in note
    assert not [row for row in rows if "SAM-Decoding[EAGLE2]" in row]  # the README's own row of its configuration wins


def test_every_footnote_and_column_puts_the_measured_value_first_and_the_published_one_second(tmp_path, capsys):
    """Each setting that differs, on a run that differs from its published row in every one: the measured value
    is said as measured, the published one as published; and the printed table's columns hold what their
    headers say (MAT and speedup measured, pub MAT and pub speedup published, ratios measured / published)."""
    import html
    import re

    from analysis.report import compare_section

    row = "x,ref,NVIDIA A100 80GB,A100,vicuna-13b,float16,0.7,spec-bench question.jsonl,PLD,pld,{},{},{},,"
    path = _user_csv(tmp_path, *(row.format(task, metric, value) for task in ("qa", "overall")
                                 for metric, value in (("speedup", 1.5), ("mat", 1.25))))
    # 3 tokens in 2 steps (MAT 1.5) in 0.1 s against AR's 0.3 s (3.0x); the one question is also the overall
    _run(tmp_path / "runs" / "pld", "pld", [("qa", [1, 2], 0.1, 0.3)], device="cuda: NVIDIA GeForce RTX 3090",
         dtype="bfloat16", model="vicuna-7b")
    questions, published = load_questions([tmp_path / "runs"]), select_published(str(path))
    table = compare_table(questions, published)
    assert list(table.task) == ["qa", "overall"] and table.differs.nunique() == 1
    assert table.differs.iloc[0].split("; ") == [
        "model: measured vicuna-7b vs published vicuna-13b",
        "hardware: measured cuda: NVIDIA GeForce RTX 3090 vs published NVIDIA A100 80GB",
        "dtype: measured bfloat16 vs published float16",
        "temperature: measured 0 vs published 0.7",
        "questions: measured the built-in sample set, 1 question vs published spec-bench question.jsonl"]
    analysis_main(["compare", str(tmp_path / "runs"), "--published", str(path)])
    out = capsys.readouterr().out
    lines = out.splitlines()
    header = next(line for line in lines if line.startswith("method"))
    assert header.split() == ["method", "task", "published", "MAT", "pub", "MAT", "ratio", "speedup", "pub", "speedup",
                              "ratio", "hw", "notes"]
    for offset, task in enumerate(("qa", "overall"), 1):
        assert lines[lines.index(header) + offset].split() == ["pld", task, "T1", "PLD", "1.50", "1.25", "1.20", "3.00x",
                                                               "1.50x", "2.00", "DIFF", "[1]"]
    assert ("[1] model: measured vicuna-7b vs published vicuna-13b; hardware: measured cuda: NVIDIA GeForce RTX 3090 "
            "vs published NVIDIA A100 80GB; dtype: measured bfloat16 vs published float16") in " ".join(out.split())
    # The report's table: each header over its own value (the overall row), and the same footnote.
    page = html.unescape(compare_section(questions, published, tmp_path))
    cells = dict(zip(re.findall(r"<th[^>]*>([^<]*)</th>", page), re.findall(r"<td[^>]*>([^<]*)</td>", page)))
    assert cells == {"method": "pld", "published table": "T1", "published as": "PLD", "MAT": "1.50",
                     "published MAT": "1.25", "MAT ratio": "1.20", "speedup": "3.00x", "published speedup": "1.50x",
                     "speedup ratio": "2.00", "same hardware": "no"}
    assert "Differs: model: measured vicuna-7b vs published vicuna-13b; hardware: measured cuda: NVIDIA" in page


def test_the_report_says_what_differs_for_every_method_not_only_the_first(tmp_path):
    import html

    from analysis.report import compare_section

    _run(tmp_path / "runs" / "pld", "pld", MT, device=A100)
    _run(tmp_path / "runs" / "samd", "samd", MT, device="cuda: NVIDIA GeForce RTX 3090")
    questions = load_questions([tmp_path / "runs"])
    table = compare_table(questions, select_published("spec-bench"))
    rows = table[(table.task == "overall") & table.reference.str.contains("A100, Vicuna-7B")]
    assert list(rows.label) == ["pld", "samd"]  # the first row ran on the A100: the samd run's hardware is its own
    text = html.unescape(compare_section(questions, select_published("spec-bench"), tmp_path))
    line = next(line for line in text.split("<p class='note'>") if line.startswith("T2 = spec-bench: "))
    assert "Differs: questions: measured the built-in sample set" in line
    assert ("Differs for samd also: hardware: measured cuda: NVIDIA GeForce RTX 3090 vs published NVIDIA A100 80GB"
            in line)
    assert "drafter auxiliary: measured not recorded vs published eagle2" in line  # samd's own configuration, too
    assert "Differs for pld also" not in line


def test_mat_is_said_to_be_close_across_hardware_not_equal_with_the_published_example():
    from analysis import compare

    rows = load_published()
    rest = rows[(rows.source == "spec-bench") & (rows.method == "REST") & (rows.model == "vicuna-7b")
                & (rows.metric == "mat")].set_index("hardware_match").value
    assert (rest["3090"], rest["A100"]) == (1.63, 1.82)  # the example the sentence cites
    docs = (ROOT / "docs" / "compare.md").read_text()
    for text in (compare.AGREEMENT, compare.__doc__, " ".join(docs.split())):
        flat = " ".join(text.split())
        assert "should agree across hardware" not in flat
        assert "1.63" in flat and "1.82" in flat and "not equal" in flat
