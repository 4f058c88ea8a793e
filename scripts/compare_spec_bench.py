"""Spec-Bench's own ``evaluation/speed.py`` beside specbench's summary, on one run directory.

    python scripts/compare_spec_bench.py RUN_DIR --spec-bench ~/Spec-Bench \\
        --tokenizer ~/.cache/specbench/models/smollm2-135m-float32-<hash>

For every task of the run and overall, ``speed()`` from CHECKOUT/evaluation/speed.py (a Spec-Bench checkout;
only its evaluation folder is needed, and speed.py needs transformers and numpy) is run on RUN_DIR's
answers.jsonl and baseline_answers.jsonl, and its mean accepted tokens (MAT), tokens/s, baseline tokens/s and
speedup are printed beside specbench's (from summary.json), with the differences.

MAT and the method's tokens/s agree. The baseline's tokens/s, and so the speedup, differ because speed.py
counts the baseline's tokens by re-tokenising its answer text (tokens minus one, per turn) while it takes the
method's recorded new_tokens; specbench counts the generated token ids (new_tokens) on both sides. The second
table shows the baseline's token counts both ways, and the speedup that ``specbench.measure.metrics`` gives when fed
the re-tokenised counts, which is speed.py's.

A half-written last answer line (a run killed mid-write) is left out, for speed.py too (it is given copies
without it); a damaged or foreign result file stops the script with one line naming it.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import tempfile
from pathlib import Path

from specbench.reporting import reporting_user_errors  # standard library only
from specbench.interrupts import Interrupts

# Ctrl-C is one line and exit status 130 from here on, during the imports below (seconds) too.
_interrupts = Interrupts("compare_spec_bench: interrupted before it started",
                         "compare_spec_bench: interrupted")
if __name__ == "__main__":
    _interrupts.arm()

import pandas as pd  # noqa: E402  (after the interrupt handler, on purpose)

from analysis.runs import (BASELINE_NEEDS, METHOD_NEEDS, check_answer_records, read_jsonl,  # noqa: E402
                           read_summary, record_task)
from specbench.measure import metrics  # noqa: E402
from specbench.errors import SpecbenchError  # noqa: E402
from specbench.storage.refusal import refusing_writes  # noqa: E402


def retokenised_turn_tokens(tokenizer, record: dict) -> list[int]:
    """Per turn, the token count speed.py gives a baseline answer: its text re-tokenised, minus one (which
    assumes the tokenizer adds one BOS token; not every tokenizer does)."""
    return [len(tokenizer(text).input_ids) - 1 for text in record["choices"][0]["turns"]]


def load_speed_module(checkout: Path):
    evaluation = checkout / "evaluation"
    if not (evaluation / "speed.py").is_file():
        raise SpecbenchError(f"{evaluation / 'speed.py'} not found; pass a Spec-Bench checkout")
    sys.path.insert(0, str(evaluation))
    return importlib.import_module("speed")


def read_run(run_dir: Path) -> tuple[dict, list[dict], list[dict]]:
    """The summary, answers and baseline answers of ``run_dir``, checked: a SpecbenchError naming the file when
    one is missing, damaged or of a schema this code does not read, or when an answer has no paired baseline."""
    answers_file, baseline_file = run_dir / "answers.jsonl", run_dir / "baseline_answers.jsonl"
    for path in (answers_file, baseline_file, run_dir / "summary.json"):
        if not path.is_file():
            raise SpecbenchError(f"{path} not found (a run with run.baseline=true is needed)")
    summary = read_summary(run_dir)
    answers, baseline = read_jsonl(answers_file), read_jsonl(baseline_file)
    check_answer_records(answers, answers_file, METHOD_NEEDS)
    check_answer_records(baseline, baseline_file, BASELINE_NEEDS)
    unpaired = {record["question_id"] for record in answers} - {record["question_id"] for record in baseline}
    if unpaired:
        missing = ", ".join(sorted(map(str, unpaired)))
        raise SpecbenchError(f"{baseline_file} lacks the baseline of question(s) {missing}")
    return summary, answers, baseline


def write_jsonl(path: Path, records: list[dict]) -> Path:
    with refusing_writes(path):  # a full temporary folder: one line naming the file
        path.write_text("".join(json.dumps(record, ensure_ascii=False) + "\n" for record in records),
                        encoding="utf-8")
    return path


def compare(run_dir: Path, speed_module, tokenizer_dir: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Per task and overall: speed.py's statistics beside specbench's summary, and the baseline's token counts."""
    summary, answers, baseline = read_run(run_dir)
    # speed.py parses every line itself and would stop at a half-written last one: it reads copies holding the
    # complete records, the same ones specbench's side counts.
    with tempfile.TemporaryDirectory() as scratch:
        answers_file = write_jsonl(Path(scratch) / "answers.jsonl", answers)
        baseline_file = write_jsonl(Path(scratch) / "baseline_answers.jsonl", baseline)
        return _compare(summary, answers, baseline, answers_file, baseline_file, speed_module, tokenizer_dir)


def _compare(summary: dict, answers: list[dict], baseline: list[dict], answers_file: Path, baseline_file: Path,
             speed_module, tokenizer_dir: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    from transformers import AutoTokenizer

    baseline_by_id = {record["question_id"]: record for record in baseline}
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)

    statistics, tokens = [], []
    for task, ours in summary["tasks"].items():
        speed_tps, speed_base_tps, speed_speedup, speed_lengths = speed_module.speed(
            str(answers_file), str(baseline_file), tokenizer_dir, task=task, report=False)
        speed_mat = float(sum(speed_lengths) / len(speed_lengths))
        statistics.append({
            "task": task, "questions": ours["questions"],
            "MAT speed.py": speed_mat, "MAT specbench": ours["mean_accepted_tokens"],
            "MAT diff": speed_mat - ours["mean_accepted_tokens"],
            "tok/s speed.py": float(speed_tps), "tok/s specbench": ours["tokens_per_s"],
            "tok/s diff": float(speed_tps) - ours["tokens_per_s"],
            "AR tok/s speed.py": float(speed_base_tps), "AR tok/s specbench": ours["baseline_tokens_per_s"],
            "AR tok/s diff": float(speed_base_tps) - ours["baseline_tokens_per_s"],
        })
        records = [record for record in answers if task == "overall" or record_task(record) == task]
        paired = [baseline_by_id[record["question_id"]] for record in records]
        retokenised = [retokenised_turn_tokens(tokenizer, record) for record in paired]
        rates = [metrics.answer_rate(record) for record in records]
        retokenised_rates = [metrics.tokens_per_second(counts, record["choices"][0]["wall_time"])
                             for counts, record in zip(retokenised, paired)]
        tokens.append({
            "task": task,
            "speedup speed.py": float(speed_speedup), "speedup specbench": ours["speedup"],
            "speedup diff": float(speed_speedup) - ours["speedup"],
            "AR tokens re-tokenised": sum(map(sum, retokenised)),
            "AR tokens recorded": sum(sum(record["choices"][0]["new_tokens"]) for record in paired),
            "speedup from re-tokenised": metrics.speedup(rates, retokenised_rates),
        })
    return pd.DataFrame(statistics), pd.DataFrame(tokens)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", type=Path, help="a specbench run directory with a paired baseline")
    parser.add_argument("--spec-bench", type=Path, required=True, metavar="CHECKOUT",
                        help="a Spec-Bench checkout (its evaluation/speed.py is imported)")
    parser.add_argument("--tokenizer", required=True, metavar="DIR",
                        help="the target model's tokenizer (a directory or hub id), as speed.py's --tokenizer-path")
    args = parser.parse_args(argv)

    speed_module = load_speed_module(args.spec_bench)
    statistics, tokens = compare(args.run_dir, speed_module, args.tokenizer)  # its errors: reporting_user_errors
    pd.set_option("display.width", 250)
    print(statistics.to_string(index=False, float_format=lambda value: f"{value:.4f}"))
    print()
    print(tokens.to_string(index=False, float_format=lambda value: f"{value:.4f}"))


if __name__ == "__main__":
    _interrupts.run(reporting_user_errors("compare_spec_bench", main))
