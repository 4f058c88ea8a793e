"""``python -m analysis`` on bad or mixed inputs: half-written and damaged files, foreign schema versions, files
given to --spec-bench that are not model_answer files, runs that are not repeats of one another, and runs timed
on a busy machine. Every problem is one line naming the file, never a traceback, and never a silent average."""

import errno
import importlib.util
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest

from analysis.__main__ import main as analysis_main
from analysis.runs import flat_settings, load_questions, load_steps, load_summaries
from analysis.tables import leaderboard, render, timing_cell
from analysis.throughput import model_table
from specbench.errors import SpecbenchError
from test_analysis import synthetic_run

ROOT = Path(__file__).resolve().parents[1]


def pld_run(path, **options):
    return synthetic_run(path, "pld", accepted=2, verify_tokens=(3,), noise=0, **options)


def labels_by_run(paths) -> dict[str, str]:
    summaries = load_summaries(paths).drop_duplicates("run_dir")
    return dict(zip(summaries.run_dir.map(lambda d: Path(d).name), summaries.label))


def cut_line(record: dict) -> bytes:
    """``record`` as a .jsonl line cut short inside a two-byte UTF-8 character, as a killed write leaves it."""
    data = json.dumps(record, ensure_ascii=False).encode("utf-8")
    return data[:data.index("é".encode("utf-8")) + 1]


def error_line(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.startswith("analysis: error:")]
    assert len(lines) == 1, err
    return lines[0]


# 1. half-written and damaged files


def test_every_command_reads_answer_files_whose_last_line_was_cut_inside_a_character(tmp_path, capsys):
    run = pld_run(tmp_path / "runs" / "cut")
    for name in ("answers.jsonl", "baseline_answers.jsonl"):
        first = json.loads((run / name).read_text(encoding="utf-8").splitlines()[0])
        first["choices"][0]["turns"] = ["déjà vu"]
        with (run / name).open("ab") as handle:
            handle.write(cut_line({**first, "question_id": 999}))
    runs = str(tmp_path / "runs")
    analysis_main(["tables", runs])
    out, err = capsys.readouterr()
    row = next(line for line in out.splitlines() if line.startswith("| m | pld |"))
    assert row.endswith("| 4/4 (0 near-tie, 0 violation) | 1 |")  # the four whole questions, the cut one left out
    assert f"{run / 'answers.jsonl'}: the last line is incomplete" in err
    assert f"{run / 'baseline_answers.jsonl'}: the last line is incomplete" in err
    analysis_main(["throughput", runs])
    assert "largest deviation" in capsys.readouterr().out
    analysis_main(["figures", runs, "--out", str(tmp_path / "figures")])
    assert (tmp_path / "figures" / "speedup_per_task.png").is_file()
    analysis_main(["report", runs, "--out", str(tmp_path / "report.html")])
    assert "2.00x" in (tmp_path / "report.html").read_text()
    assert "Traceback" not in capsys.readouterr().err


def test_a_run_with_a_damaged_summary_or_run_json_is_left_out_and_a_damaged_line_with_a_warning(tmp_path, capsys):
    pld_run(tmp_path / "good")
    (pld_run(tmp_path / "empty-summary") / "summary.json").write_text("")
    cut = pld_run(tmp_path / "cut-settings") / "run.json"
    cut.write_text(cut.read_text()[:40])
    middle = pld_run(tmp_path / "damaged-middle") / "answers.jsonl"
    lines = middle.read_text().splitlines(keepends=True)
    middle.write_text(lines[0] + '{"question_id": 1\n' + "".join(lines[1:]))
    analysis_main(["tables", str(tmp_path)])
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    # "good" and "damaged-middle", whose four whole answers count and whose damaged line does not
    row = next(line for line in out.splitlines() if line.startswith("| m | pld |"))
    assert row.endswith("| 8/8 (0 near-tie, 0 violation) | 2 |")
    warnings = [line for line in err.splitlines() if line.startswith("analysis: warning:")]
    assert len(warnings) == 3
    assert any(f"{tmp_path / 'empty-summary' / 'summary.json'} is empty or damaged" in line for line in warnings)
    assert any(f"{cut} is empty or damaged" in line for line in warnings)
    assert any(f"{middle}: line 2 is not valid JSON (1 line(s) left out, not counted)" in line for line in warnings)


def test_a_run_without_a_readable_steps_parquet_is_a_warning_not_a_traceback(tmp_path, capsys):
    pld_run(tmp_path / "good")
    missing = pld_run(tmp_path / "no-steps", seed=1) / "steps.parquet"
    missing.unlink()
    damaged = pld_run(tmp_path / "cut-steps", seed=2) / "steps.parquet"
    damaged.write_bytes(damaged.read_bytes()[:200])
    analysis_main(["throughput", str(tmp_path)])
    out, err = capsys.readouterr()
    assert "Traceback" not in err and "largest deviation" in out
    assert f"analysis: warning: {missing} not found" in err
    assert f"analysis: warning: {damaged} is damaged" in err
    assert set(load_steps([tmp_path]).run_dir) == {str(tmp_path / "good")}
    assert load_questions([tmp_path]).run_dir.nunique() == 3  # their answers still count in the tables


def odd_run(path: Path, drafter: str, answered: bool) -> Path:
    """A run directory made as the runner makes one: its only question skipped (``answered`` False), or
    answered with a record but no decoding steps, so its steps.parquet holds no rows either way."""
    from specbench.questions import Prompt
    from specbench.results.run_directory import RunDirectory
    from specbench.results.schema import Answer

    run = RunDirectory(path, with_baseline=True)
    run.open({"schema_version": 2, "model": "m", "drafter": {"name": drafter}, "device": "cpu", "dtype": "float32",
              "threads": 2})
    prompt = Prompt(7, "qa", "qa", ("q",))
    if answered:
        method, base = Answer(), Answer()
        for answer in (method, base):
            answer.texts, answer.token_ids, answer.wall_times, answer.steps = ["x"], [[1, 2, 3]], [0.1], [[]]
        run.add(method.to_record(prompt, drafter, True), base.to_record(prompt, "ar", None), method.step_rows(7))
    else:
        run.skip(prompt, "the prompt does not fit the context")
    run.write_summary({"model": "m", "drafter": drafter, "environment": {}})
    return path


def test_runs_without_steps_do_not_break_the_report_or_figures_of_the_others(tmp_path, capsys):
    pld_run(tmp_path / "good")
    for odd in (odd_run(tmp_path / "skipped", "hd", answered=False), odd_run(tmp_path / "no-steps", "sps", True)):
        assert pd.read_parquet(odd / "steps.parquet").empty
    steps = load_steps([tmp_path])
    assert set(steps.run_dir) == {str(tmp_path / "good")} and steps.verify_s.dtype.kind == "f"
    analysis_main(["figures", str(tmp_path), "--out", str(tmp_path / "figures")])
    analysis_main(["report", str(tmp_path), "--out", str(tmp_path / "report.html")])
    err = capsys.readouterr().err
    assert "Traceback" not in err
    for figure in ("speedup_per_task", "latency_breakdown", "cost_per_token", "predicted_vs_measured"):
        assert (tmp_path / "figures" / f"{figure}.png").stat().st_size > 1000
    assert "<h3>latency breakdown</h3>" in (tmp_path / "report.html").read_text()


# 2. schema versions and missing keys


@pytest.mark.parametrize("name, change, expected", [
    ("summary.json", {"schema_version": 99}, ["schema_version 99", "reads schema versions 2, 3", "newer specbench"]),
    ("run.json", {"schema_version": 99}, ["schema_version 99", "reads schema versions 2, 3"]),
    ("summary.json", {"model": None}, ["(schema_version 3) lacks 'model'", "supported schema versions: 2, 3"]),
    ("run.json", {"schema_version": None}, ["has no schema_version", "2, 3"]),
])
def test_a_result_file_of_another_schema_is_a_one_line_error(tmp_path, capsys, name, change, expected):
    run = pld_run(tmp_path / "run")
    document = json.loads((run / name).read_text())
    document.update({key: value for key, value in change.items() if value is not None})
    for key in [key for key, value in change.items() if value is None]:
        del document[key]
    (run / name).write_text(json.dumps(document))
    with pytest.raises(SystemExit) as exit_info:
        analysis_main(["tables", str(tmp_path)])
    assert exit_info.value.code == 2
    line = error_line(capsys)
    assert str(run / name) in line and all(text in line for text in expected), line


# 3. --spec-bench files


def answer_line(question_id=81, **choice) -> str:
    fields = {"turns": ["a"], "new_tokens": [100], "wall_time": [2.0], "accept_lengths": [1] * 10, **choice}
    return json.dumps({"question_id": question_id, "category": "writing",
                       "choices": [{key: value for key, value in fields.items() if value is not None}]}) + "\n"


@pytest.mark.parametrize("case, expected", [
    ("missing", "not found"),
    ("csv", "line 1 is not valid JSON"),
    ("questions", "question.jsonl"),
    ("no accept_lengths", "has no choices[0].accept_lengths"),
    ("no new_tokens", "has no choices[0].new_tokens"),
    ("no wall_time", "has no choices[0].wall_time"),
    ("empty", "holds no answer records"),
])
def test_spec_bench_files_that_are_not_model_answers_are_one_line_errors(tmp_path, capsys, case, expected):
    method, baseline = tmp_path / "method.jsonl", tmp_path / "baseline.jsonl"
    baseline.write_text(answer_line(wall_time=[4.0]))
    contents = {
        "csv": "question_id,new_tokens,wall_time\n81,100,2.0\n",
        "questions": json.dumps({"question_id": 81, "category": "writing", "turns": ["Write a poem."]}) + "\n",
        "no accept_lengths": answer_line(accept_lengths=None),
        "no new_tokens": answer_line(new_tokens=None),
        "no wall_time": answer_line(wall_time=None),
        "empty": "",
    }
    if case in contents:
        method.write_text(contents[case])
    with pytest.raises(SystemExit) as exit_info:
        analysis_main(["tables", "--spec-bench", str(method), str(baseline), "vicuna", "eagle"])
    assert exit_info.value.code == 2
    line = error_line(capsys)
    assert str(method) in line and expected in line, line


def test_a_spec_bench_baseline_without_wall_times_is_named(tmp_path, capsys):
    method, baseline = tmp_path / "method.jsonl", tmp_path / "baseline.jsonl"
    method.write_text(answer_line())
    baseline.write_text(answer_line(wall_time=None, accept_lengths=None))
    with pytest.raises(SystemExit):
        analysis_main(["tables", str(tmp_path), "--spec-bench", str(method), str(baseline), "vicuna", "eagle"])
    line = error_line(capsys)
    assert str(baseline) in line and "wall_time" in line


def load_compare_script():
    spec = importlib.util.spec_from_file_location("compare_spec_bench", ROOT / "scripts" / "compare_spec_bench.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_compare_spec_bench_reads_cut_answer_files_and_names_a_foreign_summary(tmp_path, monkeypatch, capsys):
    compare = load_compare_script()
    run = pld_run(tmp_path / "run")
    first = json.loads((run / "answers.jsonl").read_text().splitlines()[0])
    with (run / "answers.jsonl").open("ab") as handle:
        handle.write(cut_line({**first, "question_id": 999, "category": "é"}))
    read = []

    def speed(file_path, base_path, tokenizer_path, task, report):  # parses every line, as speed.py does
        for path in (file_path, base_path):
            read.append([json.loads(line) for line in open(path, encoding="utf-8")])
        return 30.0, 15.0, 2.0, [1, 2, 2]

    tokenizer = SimpleNamespace(from_pretrained=lambda name: lambda text: SimpleNamespace(input_ids=[0] * 22))
    monkeypatch.setitem(sys.modules, "transformers", SimpleNamespace(AutoTokenizer=tokenizer))
    statistics, tokens = compare.compare(run, SimpleNamespace(speed=speed), "tokenizer")
    assert list(statistics.task) == ["qa", "rag", "overall"] and len(read[-2]) == 4  # the cut line left out
    assert tokens.set_index("task").loc["overall", "AR tokens recorded"] == 4 * 41

    summary = json.loads((run / "summary.json").read_text())
    (run / "summary.json").write_text(json.dumps({**summary, "schema_version": 99}))
    with pytest.raises(SpecbenchError, match="schema_version 99"):
        compare.compare(run, SimpleNamespace(speed=speed), "tokenizer")
    (run / "summary.json").write_text("{")
    monkeypatch.setattr(compare, "load_speed_module", lambda checkout: SimpleNamespace(speed=speed))
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:  # main as the script runs it: one line, exit 2
        compare.reporting_user_errors("compare_spec_bench", compare.main)(
            [str(run), "--spec-bench", str(tmp_path), "--tokenizer", "tokenizer"])
    message = capsys.readouterr().err.strip()
    assert exit_info.value.code == 2
    assert message.startswith(f"compare_spec_bench: error: {run / 'summary.json'} is empty or damaged")


# 4. repeats only when every result-affecting setting and the questions match


def test_runs_that_differ_in_a_result_setting_are_shown_apart_with_a_note(tmp_path, capsys):
    pld_run(tmp_path / "f32")
    pld_run(tmp_path / "f32-again", seed=1)
    pld_run(tmp_path / "bf16", settings={"dtype": "bfloat16"})
    assert labels_by_run([tmp_path]) == {"f32": "pld dtype=float32", "f32-again": "pld dtype=float32",
                                         "bf16": "pld dtype=bfloat16"}
    table = leaderboard(load_questions([tmp_path]))
    assert table.loc[("m", "pld dtype=float32"), ("runs", "", "")] == 2
    assert table.loc[("m", "pld dtype=bfloat16"), ("runs", "", "")] == 1
    analysis_main(["tables", str(tmp_path)])
    notes = [line for line in capsys.readouterr().err.splitlines() if line.startswith("analysis: note:")]
    assert len(notes) == 1 and "m pld:" in notes[0] and "differ in dtype" in notes[0]


def test_partial_runs_are_not_repeats_of_a_full_one(tmp_path):
    pld_run(tmp_path / "full")
    pld_run(tmp_path / "first-half", tasks=("qa", "qa"))
    pld_run(tmp_path / "second-half", tasks=("rag", "rag"), first_question=102)
    labels = labels_by_run([tmp_path])
    assert labels["full"] == "pld questions=4"
    # two runs of two questions each, but not the same two: told apart by a digest of their ids
    assert labels["first-half"].startswith("pld questions=2#") and labels["second-half"].startswith("pld questions=2#")
    assert labels["first-half"] != labels["second-half"]


def schema3_settings(**changes) -> dict:
    settings = {
        "schema_version": 3, "model": "m", "drafter": {"name": "pld", "max_ngram_size": 3},
        "model_config": {"name": "m", "num_layers": 2},
        "run": {"max_new_tokens": 128, "temperature": 0.0, "top_p": 1.0, "seed": 0, "baseline": True,
                "draft_budget": "off", "verify_padding": "off", "linear_backend": "auto", "threads": None},
        "task": {"path": "/home/someone/question.jsonl", "content_sha256": "ab12"},
        "model_source": "src", "weights_fingerprint": "w1", "dtype": "float32", "device": "cpu", "threads": 2,
        "environment": {"python": "3.11.9", "torch": "2.5.0", "transformers": "4.46.0", "specbench": "0.1.0",
                        "device": "cpu: EPYC", "git_sha": "new"},
    }
    for key, value in changes.items():
        section, _, name = key.rpartition(".")
        (settings[section] if section else settings)[name] = value
    return settings


SCHEMA2_SETTINGS = {"max_new_tokens": 128, "temperature": 0.0, "top_p": 1.0, "seed": 0, "baseline": True,
                    "question_file": None, "verify_padding": "off", "draft_budget": "off", "linear_backend": "auto",
                    "model_source": "src", "drafter": {"name": "pld", "max_ngram_size": 3}}
SCHEMA2_ENVIRONMENT = {"python": "3.11.7", "torch": "2.5.0", "transformers": "4.46.0", "specbench": "0.1.0",
                       "device": "cpu: EPYC", "dtype": "float32", "threads": 2, "git_sha": "old"}


def test_schema_2_and_3_settings_flatten_to_the_same_names():
    old = flat_settings({"schema_version": 2, "model": "m", "dtype": "float32", "device": "cpu", "threads": 2,
                         **SCHEMA2_SETTINGS}, SCHEMA2_ENVIRONMENT)
    new = flat_settings(schema3_settings())
    # every setting both record is equal (the python version and the commit are no settings); schema 2 records
    # the question file's path, schema 3 its content digest instead
    assert set(old) - set(new) == {"task.path"}
    assert all(new[key] == old[key] for key in set(old) & set(new))
    assert old["run.temperature"] == "0" and old["environment.device_name"] == "cpu: EPYC"
    assert new["model_config.num_layers"] == "2" and new["run.threads"] == "null" and new["threads"] == "2"
    assert "task.path" not in new  # the content digest names the questions wherever the file lies
    assert not {"environment.git_sha", "environment.python", "schema_version"} & (set(old) | set(new))


def test_a_schema_2_and_a_schema_3_run_of_equal_settings_are_repeats(tmp_path, capsys):
    pld_run(tmp_path / "old", settings=SCHEMA2_SETTINGS, header={"environment": SCHEMA2_ENVIRONMENT})
    (pld_run(tmp_path / "new", seed=1) / "run.json").write_text(json.dumps(schema3_settings()))
    assert labels_by_run([tmp_path]) == {"old": "pld", "new": "pld"}
    (pld_run(tmp_path / "newer-torch", seed=2) / "run.json").write_text(
        json.dumps(schema3_settings(**{"environment.torch": "2.6.0"})))
    assert labels_by_run([tmp_path]) == {"old": "pld environment.torch=2.5.0", "new": "pld environment.torch=2.5.0",
                                         "newer-torch": "pld environment.torch=2.6.0"}
    # run.* settings are read from schema 3's "run" section: this run samples
    sampled = schema3_settings(**{"run.temperature": 0.7})
    (pld_run(tmp_path / "sampled", seed=3) / "run.json").write_text(json.dumps(sampled))
    assert labels_by_run([tmp_path])["sampled"] == "pld T=0.7"


def test_leave_one_out_pools_only_runs_of_the_same_hardware_and_software(tmp_path):
    epyc = {"environment": {"device": "cpu: EPYC"}}
    pld_run(tmp_path / "a", header=epyc)
    pld_run(tmp_path / "a-again", header=epyc, slowdown=1.2)
    pld_run(tmp_path / "other-cpu", header={"environment": {"device": "cpu: Xeon"}})
    pld_run(tmp_path / "bf16", header=epyc, settings={"dtype": "bfloat16"})
    (pld_run(tmp_path / "unknown", header=epyc) / "run.json").unlink()  # nothing says what it ran on
    table = model_table(load_steps([tmp_path])).assign(run=lambda t: t.run_dir.map(lambda d: Path(d).name))
    loo_runs = dict(zip(table.run, table.loo_runs))
    assert loo_runs == {"a": 1, "a-again": 1, "other-cpu": 0, "bf16": 0, "unknown": 0}
    a = table.set_index("run").loc["a"]
    assert a.loo_target_ms == pytest.approx(72.0)  # a-again's steps alone


# 5. runs timed on a busy machine


BUSY = {"timing": {"trustworthy": False, "warnings": ["question 101: other processes kept 1.8 of 2 cores busy"],
                   "threads": 2, "usable_cores": 2, "other_load": 1.8}}
QUIET = {"timing": {"trustworthy": True, "warnings": [], "threads": 2, "usable_cores": 2, "other_load": 0.1}}


def test_runs_timed_on_a_busy_machine_are_flagged_everywhere_with_their_numbers(tmp_path, capsys):
    busy = pld_run(tmp_path / "busy", header=BUSY)
    synthetic_run(tmp_path / "quiet", "sps", accepted=3, verify_tokens=(4,), speed=45, noise=0, header=QUIET)
    analysis_main(["tables", str(tmp_path)])
    markdown = capsys.readouterr().out
    pld_row = next(line for line in markdown.splitlines() if line.startswith("| m | pld |"))
    assert "| UNTRUSTED |" in pld_row and "2.00x" in pld_row  # flagged, and its numbers still shown
    assert "| ok |" in next(line for line in markdown.splitlines() if line.startswith("| m | sps |"))
    footnote = markdown[markdown.index("UNTRUSTED timing"):]
    assert f"m pld: {busy}: question 101: other processes kept 1.8 of 2 cores busy" in footnote
    analysis_main(["tables", str(tmp_path), "--format", "csv"])
    csv = capsys.readouterr().out.splitlines()
    assert "timing" in csv[0].split(",") and "UNTRUSTED" in next(line for line in csv if line.startswith("m,pld,"))
    analysis_main(["tables", str(tmp_path), "--format", "latex"])
    assert r"\par\noindent UNTRUSTED timing" in capsys.readouterr().out
    analysis_main(["throughput", str(tmp_path)])
    out = capsys.readouterr().out
    assert "UNTRUSTED" in next(line for line in out.splitlines() if " pld " in line)
    assert f"m pld ({busy}): question 101: other processes kept 1.8 of 2 cores busy" in out
    analysis_main(["report", str(tmp_path), "--out", str(tmp_path / "report.html")])
    html = (tmp_path / "report.html").read_text()
    assert "Timing UNTRUSTED for 1 run(s)" in html and "<td>UNTRUSTED</td>" in html
    assert "question 101: other processes kept 1.8 of 2 cores busy" in html


def test_the_timing_of_a_configuration_says_how_many_of_its_runs_were_flagged():
    assert timing_cell([True, True]) == "ok"
    assert timing_cell([True, False, True]) == "UNTRUSTED (1/3 runs)"
    assert timing_cell([None, True]) == "unchecked"  # a schema-2 run did not check
    assert timing_cell([False]) == "UNTRUSTED"


def test_a_table_without_flagged_runs_keeps_its_columns(tmp_path):
    pld_run(tmp_path / "quiet", header=QUIET)
    markdown = render(leaderboard(load_questions([tmp_path])), "md")
    assert "timing" not in markdown.splitlines()[0] and "UNTRUSTED" not in markdown


# 6. result lines: analysis counts what resuming counts


def table_row(out: str, label: str = "pld") -> str:
    return next(line for line in out.splitlines() if line.startswith(f"| m | {label} |"))


def test_a_repeated_or_malformed_answer_line_is_not_counted_by_analysis(tmp_path, capsys):
    run = pld_run(tmp_path / "run")
    answers = run / "answers.jsonl"
    lines = answers.read_text().splitlines()
    answers.write_text("\n".join([lines[0], "{}", *lines[1:], lines[0], "[1]", "7"]) + "\n")
    analysis_main(["tables", str(run)])
    out, err = capsys.readouterr()
    assert table_row(out).endswith("| 4/4 (0 near-tie, 0 violation) | 1 |")  # before: 5/5
    [warning] = [line for line in err.splitlines() if str(answers) in line]
    assert ("line 2 has no question_id; line 6 repeats question 100 of line 1 (the first is kept); line 7 is a JSON "
            "array, not an object; line 8 is a JSON number, not an object (4 line(s) left out, not counted)") in warning


def test_an_answer_of_a_question_without_its_baseline_or_steps_is_named_and_left_out(tmp_path, capsys):
    run = pld_run(tmp_path / "run")
    first = json.loads((run / "answers.jsonl").read_text().splitlines()[0])
    with (run / "answers.jsonl").open("a") as handle:
        handle.write(json.dumps({**first, "question_id": 999}) + "\n")
    analysis_main(["tables", str(run)])
    out, err = capsys.readouterr()
    assert "| 2.00x | 1.95 |" in table_row(out)  # the overall speedup: before, "-" without a word
    assert (f"{run / 'answers.jsonl'}: line 5 is of question 999, which is not finished (no baseline answer, no "
            "steps)") in err


def test_mixed_and_huge_question_ids_are_paired_by_analysis(tmp_path):
    run = pld_run(tmp_path / "run")
    ids = [1, "q2", 2**70, "1"]
    for name in ("answers.jsonl", "baseline_answers.jsonl"):
        records = [json.loads(line) for line in (run / name).read_text().splitlines()]
        (run / name).write_text("".join(json.dumps({**record, "question_id": question}) + "\n"
                                        for record, question in zip(records, ids)))
    from specbench.results.steps_file import read_steps_file, write_steps_file
    steps = read_steps_file(run / "steps.parquet")
    steps["question_id"] = pd.Series(steps.question_id.map(dict(zip([100, 101, 102, 103], ids))), dtype=object)
    write_steps_file(steps, run / "steps.parquet")
    questions = load_questions([run])
    assert len(questions) == 4 and questions.baseline_tokens.notna().all()
    assert set(load_steps([run]).question_id.map(json.dumps)) == set(map(json.dumps, ids))


# 7. one run reached by two paths, or copied, is one run


@pytest.mark.parametrize("second", ["link", "slash", "dot", "folder", "copy"])
def test_one_run_reached_twice_counts_once_with_one_warning(tmp_path, capsys, monkeypatch, second):
    monkeypatch.chdir(tmp_path)
    pld_run(tmp_path / "runs" / "DIR")
    if second == "link":
        (tmp_path / "LINK").symlink_to(tmp_path / "runs" / "DIR", target_is_directory=True)
    elif second == "copy":
        shutil.copytree(tmp_path / "runs" / "DIR", tmp_path / "COPY")
    given = {"link": "LINK", "slash": "runs/DIR/", "dot": "./runs/DIR", "folder": "runs", "copy": "COPY"}[second]
    analysis_main(["tables", "runs/DIR", given])
    out, err = capsys.readouterr()
    assert table_row(out).endswith("| 4/4 (0 near-tie, 0 violation) | 1 |") and "±" not in table_row(out)
    warnings = [line for line in err.splitlines() if line.startswith("analysis: warning:")]
    assert len(warnings) == 1 and ("counted once" in warnings[0]), err


# 8. every path given to analysis: one line when it cannot be used


def run_error(capsys, argv) -> str:
    with pytest.raises(SystemExit) as exit_info:
        analysis_main(argv)
    assert exit_info.value.code == 2
    return error_line(capsys)


@pytest.mark.parametrize("argv, expected", [
    (["tables", "{t}/nowhere"], "{t}/nowhere: no such run directory or folder"),
    (["tables", "{t}/runs/run/summary.json"], "{t}/runs/run/summary.json is a file, not a run directory"),
    (["throughput", "{t}/runs", "{t}/nowhere"], "{t}/nowhere: no such run directory"),
    (["tables", "{t}/runs", "--out", "{t}"], "--out {t} is a folder; give the name of a file"),
    (["report", "{t}/runs", "--out", "{t}/runs"], "--out {t}/runs is a folder"),
    (["figures", "{t}/runs", "--out", "{t}/runs/run/summary.json"], "--out {t}/runs/run/summary.json is an existing file"),
    (["report", "{t}/runs", "--out", "{t}/runs/run/summary.json/r.html"], "{t}/runs/run/summary.json is a file, not a folder"),
    (["figures", "{t}/runs", "--out", "{t}/runs/run/run.json/figs"], "{t}/runs/run/run.json is a file, not a folder"),
    (["tables", "{t}/runs", "--spec-bench", "{t}/runs", "{t}/b.jsonl", "m", "x"], "file {t}/runs is not a file"),
])
def test_a_path_that_cannot_be_used_is_one_line(tmp_path, capsys, argv, expected):
    pld_run(tmp_path / "runs" / "run")
    line = run_error(capsys, [arg.format(t=tmp_path) for arg in argv])
    assert expected.format(t=tmp_path) in line, line


def refuse_in(folder: Path, monkeypatch, refusal=errno.EROFS):
    """tempfile.mkstemp in ``folder`` refused, as a read-only mount refuses it to every user, root included."""
    real = tempfile.mkstemp

    def mkstemp(*args, dir=None, **kwargs):
        if dir is not None and Path(dir).resolve() == folder.resolve():
            raise OSError(refusal, os.strerror(refusal), str(folder))
        return real(*args, dir=dir, **kwargs)

    monkeypatch.setattr(tempfile, "mkstemp", mkstemp)


@pytest.mark.parametrize("command, out", [("tables", "t.md"), ("report", "sub/r.html"), ("figures", "figs")])
def test_an_out_in_a_read_only_folder_is_one_line_before_anything_is_read(tmp_path, capsys, monkeypatch, command,
                                                                           out):
    pld_run(tmp_path / "runs" / "run")
    refuse_in(tmp_path / "ro", monkeypatch)
    (tmp_path / "ro").mkdir()
    line = run_error(capsys, [command, str(tmp_path / "runs"), "--out", str(tmp_path / "ro" / out)])
    assert f"--out {tmp_path / 'ro' / out}: cannot write in {tmp_path / 'ro'} (Read-only file system)" in line
    assert "choose a writable --out" in line and not (tmp_path / "ro" / out).exists()


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads and writes regardless of permissions")
def test_unreadable_runs_and_unwritable_out_by_permissions(tmp_path, capsys):
    pld_run(tmp_path / "runs" / "run")
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o000)
    try:
        assert f"{locked}: cannot be read (Permission denied)" in run_error(capsys, ["tables", str(locked)])
        line = run_error(capsys, ["tables", str(tmp_path / "runs"), "--out", str(locked / "t.md")])
        assert "Permission denied" in line
    finally:
        locked.chmod(0o755)


def test_an_unreadable_run_folder_is_one_line(tmp_path, capsys, monkeypatch):
    pld_run(tmp_path / "runs" / "run")
    real = os.scandir

    def scandir(path="."):
        if Path(path).resolve() == (tmp_path / "runs").resolve():
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real(path)

    monkeypatch.setattr(os, "scandir", scandir)
    line = run_error(capsys, ["tables", str(tmp_path / "runs")])
    assert f"{tmp_path / 'runs'}: cannot be read (Permission denied)" in line


def test_a_disk_that_fills_while_the_report_is_written_is_one_line(tmp_path, capsys, monkeypatch):
    pld_run(tmp_path / "runs" / "run")
    real = Path.write_text

    def write_text(self, *args, **kwargs):
        if self.name == "report.html":
            raise OSError(errno.ENOSPC, "No space left on device", str(self))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", write_text)
    line = run_error(capsys, ["report", str(tmp_path / "runs"), "--out", str(tmp_path / "report.html")])
    assert f"cannot write {tmp_path / 'report.html'} (No space left on device)" in line


# 9. a run of a schema this analysis does not read is left out, not a stop


def test_a_schema_1_run_beside_newer_ones_is_left_out_with_one_warning(tmp_path, capsys):
    pld_run(tmp_path / "new")
    old = pld_run(tmp_path / "old", seed=1)
    summary = json.loads((old / "summary.json").read_text())
    (old / "summary.json").write_text(json.dumps({**summary, "schema_version": 1}))
    analysis_main(["tables", str(tmp_path)])
    out, err = capsys.readouterr()
    assert table_row(out).endswith("| 1 |")
    [warning] = [line for line in err.splitlines() if line.startswith("analysis: warning:")]
    assert f"{old / 'summary.json'} has schema_version 1" in warning and f"run {old} left out" in warning
    (tmp_path / "new" / "summary.json").write_text(json.dumps({**summary, "schema_version": 1}))
    line = run_error(capsys, ["tables", str(tmp_path)])  # nothing usable left: one line naming why
    assert "no usable runs with answers" in line and "schema_version 1" in line
