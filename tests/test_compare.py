"""Published numbers as data (specbench/data/published_results.csv) and measured-vs-published comparison."""

import pytest

from analysis.__main__ import main as analysis_main
from analysis.compare import compare_table, mat_figure
from analysis.published import COLUMNS, SOURCES, load_published, packaged_file, select_published
from analysis.runs import load_questions
from specbench.data import Prompt
from specbench.decoding.loop import StepRecord
from specbench.errors import SpecbenchError
from specbench.records import Answer, RunDirectory

A100 = "cuda: NVIDIA A100-SXM4-80GB"


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


def test_published_methods_map_to_specbench_drafters():
    rows = load_published()
    drafters = dict(zip(rows.method[rows.source == "spec-bench"], rows.drafter[rows.source == "spec-bench"]))
    assert drafters["SpS"] == "sps" and drafters["Hydra"] == "" and drafters["Medusa"] == ""
    assert drafters["SAMD[EAGLE2]"] == "samd" and drafters["Lookahead"] == "lookahead"


HEADER = ",".join(COLUMNS)
GOOD = "x,ref,A100 80GB,A100,vicuna-7b,float16,0,spec-bench question.jsonl,PLD,pld,qa,speedup,1.5,"


@pytest.mark.parametrize("row, message", [
    (GOOD.replace(",speedup,", ",tokens_per_s,"), "line 3: metric 'tokens_per_s' is not one of speedup, mat"),
    (GOOD.replace(",qa,", ",coding,"), "line 3: task 'coding' is not one of mt_bench, translation,"),
    (GOOD.replace("x,ref,", ",ref,"), "line 3: no source; every row needs source, reference"),
    (GOOD.replace(",1.5,", ",fast,"), "line 3: value 'fast' is not a positive number"),
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
                                             "spec-bench, hd, recycling, samd, dsd, all, or the path"):
        select_published("specbench")
    with pytest.raises(SpecbenchError, match="--published hd: no numbers of that source were found"):
        select_published("hd")


def _run(path, drafter, questions, device=A100, dtype="float16", model="vicuna-7b"):
    """A run directory answering ``questions``: (task, accept lengths per step, method seconds, baseline
    seconds), each question's tokens the sum of its accept lengths."""
    run = RunDirectory(path, with_baseline=True)
    run.open({"schema_version": 2, "model": model, "drafter": {"name": drafter}, "device": "cuda", "dtype": dtype,
              "temperature": 0.0, "threads": 1})
    for question_id, (task, lengths, seconds, baseline_seconds) in enumerate(questions, start=1):
        tokens = sum(lengths)
        method, base = Answer(), Answer()
        method.steps = [[StepRecord(step=index, draft_tokens=3, candidate_tokens=3, verify_tokens=4,
                                    accepted_tokens=length, draft_s=0.0, verify_s=0.01, overhead_s=0.0,
                                    context_len=10 + index) for index, length in enumerate(lengths)]]
        base.steps = [[StepRecord(step=index, draft_tokens=0, verify_tokens=1, accepted_tokens=1, draft_s=0.0,
                                  verify_s=0.01, overhead_s=0.0, context_len=10 + index) for index in range(tokens)]]
        for answer, wall in ((method, seconds), (base, baseline_seconds)):
            answer.texts, answer.token_ids, answer.wall_times = ["x"], [list(range(tokens))], [wall]
        prompt = Prompt(question_id, task, task, ("q",))
        run.add(method.to_record(prompt, drafter, True), base.to_record(prompt, "ar", None),
                method.step_rows(question_id))
    run.write_summary({"model": model, "drafter": drafter, "environment": {"device": device}})
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
    assert "MAT (mean accepted tokens" in flat and "it is the figure that should agree across hardware" in flat
    assert "Speedups compare only on like hardware" in flat
    assert max(len(line) for line in out.splitlines()) <= 120
    assert "measured, not published in this selection: suffix" in flat
    assert "published, not measured: " in flat and "eagle3" in flat and "no specbench drafter: Hydra, Medusa" in flat
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
