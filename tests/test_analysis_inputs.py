"""``python -m analysis`` on bad or mixed inputs: half-written and damaged files, foreign schema versions, files
given to --spec-bench that are not model_answer files, runs that are not repeats of one another, and runs timed
on a busy machine. Every problem is one line naming the file, never a traceback, and never a silent average."""

import importlib.util
import json
import sys
from pathlib import Path
from types import SimpleNamespace

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


def test_a_run_with_a_damaged_summary_run_json_or_answer_line_is_left_out_with_a_warning(tmp_path, capsys):
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
    assert next(line for line in out.splitlines() if line.startswith("| m | pld |")).endswith("| 1 |")  # "good" alone
    warnings = [line for line in err.splitlines() if line.startswith("analysis: warning:")]
    assert len(warnings) == 3
    assert any(f"{tmp_path / 'empty-summary' / 'summary.json'} is empty or damaged" in line for line in warnings)
    assert any(f"{cut} is empty or damaged" in line for line in warnings)
    assert any(f"{middle}, line 2" in line for line in warnings)


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
    ("csv", "line 1: not a valid JSON"),
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
        analysis_main(["tables", str(tmp_path / "no-runs"), "--spec-bench", str(method), str(baseline), "vicuna",
                       "eagle"])
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
    with pytest.raises(SystemExit) as exit_info:
        compare.main([str(run), "--spec-bench", str(tmp_path), "--tokenizer", "tokenizer"])
    message = str(exit_info.value.code)
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
