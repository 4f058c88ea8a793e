"""Every number and flag a drafter config or a head's config.json sets is checked for its type and finiteness, not
only its sign: inf, nan, a bool, a string, or a fraction where a count is meant is refused in one line naming the
key. The drafter cases are generated from the configs themselves (every numeric and true/false key of every
config in conf/drafter), so a key added later is covered without a new test."""

import functools
import inspect
import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from hydra.utils import get_class
from omegaconf import OmegaConf

from conftest import refusal

from specbench.config import compose, group_options
from specbench.run.instantiate import build

# lookups keyed by model or family: their entries are the loaders' (pruned drafts, trained heads), not settings
LOOKUPS = ("_by_family", "_by_model")
# Besides wrong types and non-finite numbers, finite values at the edge of the range: a count past int64 (2**63)
# and a real past float32 (1e39), which once passed the sign checks and overflowed what they fed in a traceback
# (a SuffixDecoding max_spec_factor of 1e39: int() of float32 inf).
BAD = {"count": [math.inf, -math.inf, math.nan, 2.5, "4", True, 2**63],
       "real": [math.inf, -math.inf, math.nan, "0.5", True, 1e39], "flag": ["no", 1]}
CONF = Path(__file__).resolve().parents[1] / "conf" / "drafter"


@functools.lru_cache(maxsize=None)
def drafter_yaml(name: str):
    """conf/drafter/<name>.yaml with its defaults merged as Hydra merges a group's defaults list (read directly:
    composing every config costs seconds, and test_config.py composes each already; one is compared below)."""
    own = OmegaConf.load(CONF / f"{name}.yaml")
    defaults = list(own.pop("defaults", []) or [])
    if "_self_" not in defaults:
        defaults.append("_self_")
    merged = OmegaConf.create()
    for entry in defaults:
        merged = OmegaConf.merge(merged, own if entry == "_self_" else drafter_yaml(entry))
    return merged


def config_with(name: str, key: str | None = None, value=None):
    """The drafter node of ``name`` under a root that resolves its interpolations, ``key`` set to ``value``."""
    root = OmegaConf.create({"drafter": OmegaConf.to_container(drafter_yaml(name), resolve=False),
                             "task": {"path": None}})
    if key is not None:
        OmegaConf.update(root, f"drafter.{key}", value, force_add=True)
    return root.drafter


def annotation_of(target: str, key: str) -> str:
    """The constructor's annotation of a top-level setting, for a null in the config: is it a count or a real."""
    parameter = inspect.signature(get_class(target).__init__).parameters.get(key)
    return str(parameter.annotation) if parameter is not None else ""


def typed_keys(name: str) -> list[tuple[str, str]]:
    """(dotted key, "count" | "real" | "flag") for every setting of drafter config ``name`` that holds a number or
    a true/false, read from the config (a null counts when the constructor's annotation names a number)."""
    container = OmegaConf.to_container(drafter_yaml(name), resolve=False)
    keys = []

    def visit(node: dict, prefix: str) -> None:
        for key, value in node.items():
            dotted = f"{prefix}{key}"
            if key.startswith("_") or key.endswith(LOOKUPS):
                continue
            if isinstance(value, dict):
                visit(value, f"{dotted}.")
            elif isinstance(value, bool):
                keys.append((dotted, "flag"))
            elif isinstance(value, int):
                keys.append((dotted, "count"))
            elif isinstance(value, float):
                keys.append((dotted, "real"))
            elif value is None and not prefix:
                annotation = annotation_of(container["_target_"], key)
                if "int" in annotation:
                    keys.append((dotted, "count"))
                elif "float" in annotation:
                    keys.append((dotted, "real"))

    visit(container, "")
    return keys


DRAFTERS = sorted(path.stem for path in CONF.glob("*.yaml"))


def with_value(name: str, key: str, value):
    return config_with(name, key, value)


@pytest.mark.parametrize("name, key, kind", [(name, key, kind) for name in DRAFTERS for key, kind in typed_keys(name)])
def test_a_bad_drafter_value_is_refused_naming_the_key(name, key, kind):
    for value in BAD[kind]:
        message = refusal(build, with_value(name, key, value))
        assert f"drafter.{key}" in message and repr(value) in message and "must be" in message, message


def test_the_configs_read_here_are_the_composed_ones():
    for name in ("sps", "hd-chains"):  # each with a defaults list
        composed = OmegaConf.to_container(compose([f"drafter={name}"]).drafter, resolve=False)
        assert OmegaConf.to_container(drafter_yaml(name), resolve=False) == composed


def test_the_generated_cases_cover_the_numeric_and_flag_settings():
    # a check that the generator reads the configs: known keys of each kind are among its cases
    assert DRAFTERS == sorted(group_options("drafter"))
    found = {(name, key): kind for name in DRAFTERS for key, kind in typed_keys(name)}
    assert found[("sps", "max_gamma")] == "count"  # null in sps.yaml: known by the annotation
    assert found[("suffix", "max_spec_tokens")] == "count"
    assert found[("samd", "alpha")] == "real"
    assert found[("suffix", "min_token_prob")] == "real"
    assert found[("hd", "model_db_build.max_new_tokens")] == "count"
    assert found[("hd", "seed")] == "count"
    assert found[("lookahead", "pool_from_prompt")] == "flag"
    assert found[("pld", "no_match_token")] == "count"
    assert not any(key.startswith("drafts_by_family") or key.startswith("heads_by_model") for _, key in found)


@pytest.mark.parametrize("name", DRAFTERS)
def test_each_drafter_builds_with_its_own_values(name):
    # the refusals above are of the bad values, not of every value: the configs' own build
    assert build(config_with(name)) is not None


@pytest.mark.parametrize("value", [[2.7], ["3"], [math.inf], [True], [-1], [], 3, "2,5"])
@pytest.mark.parametrize("name", ["eagle", "eagle3"])
def test_bad_eagle_feature_layers_are_refused(name, value):
    message = refusal(build, with_value(name, "feature_layers", value))
    assert "drafter.feature_layers" in message, message


def test_the_largest_count_and_the_largest_scaling_numbers_are_taken_and_one_more_is_refused():
    # The top of each range builds and works; just past it, one line naming the key, the value and the range.
    from specbench.drafters.base import MAX_COUNT
    from specbench.training import pruning

    assert MAX_COUNT == pruning._MOST == 2**31 - 1  # a drafter's pruned entry has the same bound
    assert build(with_value("suffix", "max_cached_requests", MAX_COUNT)).max_cached_requests == MAX_COUNT
    assert refusal(build, with_value("suffix", "max_cached_requests", MAX_COUNT + 1)) == (
        "drafter.max_cached_requests must be a non-negative integer <= 2147483647, got 2147483648")
    assert refusal(build, with_value("pld", "num_draft_tokens", 2**63)) == (
        "drafter.num_draft_tokens must be a positive integer <= 2147483647, got 9223372036854775808")
    assert refusal(build, with_value("lookahead", "ngram_size", 2**31)) == (
        "drafter.ngram_size must be an integer in [3, 2147483647] (a window of at least 2 levels), got 2147483648")
    assert refusal(build, with_value("pld", "no_match_token", 2**63)) == (
        "drafter.no_match_token must be a token id (an integer in [0, 2147483647]) or null, got 9223372036854775808")
    # SuffixDecoding's factor and offset, at most max_spec_tokens (null: max_tree_depth, 24): a 1-token match then
    # already drafts max_spec_tokens tokens; 1e39, inf in the reference's float32, was a traceback in int().
    assert refusal(build, with_value("suffix", "max_spec_factor", 1e39)) == (
        "drafter.max_spec_factor must be a number in [0, 24], not inf or nan, got 1e+39 (at max_spec_tokens=24 every "
        "match already drafts max_spec_tokens tokens)")
    assert "drafter.max_spec_offset must be a number in [0, 24]" in refusal(
        build, with_value("suffix", "max_spec_offset", 24.5))
    suffix = build(with_value("suffix", "max_spec_factor", 24))
    context = np.array(list(range(30, 60)) + [30])  # "30" occurs once before the end: 29 tokens follow it
    assert len(suffix_draft(suffix, context)) == 23  # a 1-token match of a depth-24 tree: 24 - 1, the most
    assert build(with_value("suffix", "max_spec_offset", 24)).max_spec_offset == 24.0
    # SAM-Decoding's alpha, at most n_predicts (40): min(40, 1 + int(match x alpha)) is 40 for every match.
    assert refusal(build, with_value("samd", "alpha", 1e308)) == (
        "drafter.alpha must be a number in (0, 40], not inf or nan, got 1e+308 (at n_predicts=40 every match "
        "already drafts n_predicts tokens)")
    assert build(with_value("samd", "alpha", 40)).alpha == 40.0


def suffix_draft(drafter, context) -> list[int]:
    drafter.begin(context)
    return drafter.propose(context).token_ids.tolist()


@pytest.mark.parametrize("value, expected", [(4, 4.0), (0.5, 0.5)])
def test_a_real_setting_takes_an_integer_or_a_fraction(value, expected):
    assert build(with_value("samd", "alpha", value)).alpha == expected


# ---- the numbers of a head's config.json ---------------------------------------------------------------------

HEAD_COUNTS = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim",
               "vocab_size", "num_hidden_layers")
HEAD_REALS = ("rms_norm_eps", "rope_theta")
BAD_HEAD_COUNTS = [math.inf, math.nan, 64.5, "64", True, None]
BAD_HEAD_REALS = [math.inf, math.nan, "1e-5", True, 0, None]


@pytest.fixture(scope="module")
def head_directory(tiny, tmp_path_factory):
    """A tiny EAGLE head (random weights) for the tiny random target, saved in EAGLE's format."""
    from specbench.heads.eagle_head_files import save_eagle_head
    from specbench.heads.eagle_heads import build_head, head_config_for

    torch.manual_seed(0)
    head = build_head(head_config_for(tiny, "eagle"), tiny.weights.module.get_output_embeddings(),
                      tiny.weights.module.get_input_embeddings().weight)
    directory = tmp_path_factory.mktemp("head")
    save_eagle_head(head, directory, "eagle")
    return tiny, directory


def damaged_head(head_directory, tmp_path, key, value):
    import shutil

    target, directory = head_directory
    copy_dir = tmp_path / "head"
    shutil.copytree(directory, copy_dir)
    config = json.loads((copy_dir / "config.json").read_text())
    assert key in config or key in ("num_hidden_layers", "rms_norm_eps", "rope_theta", "num_key_value_heads",
                                    "head_dim"), sorted(config)
    config[key] = value
    (copy_dir / "config.json").write_text(json.dumps(config))
    return target, copy_dir


@pytest.mark.parametrize("value", BAD_HEAD_COUNTS, ids=repr)
@pytest.mark.parametrize("key", HEAD_COUNTS)
def test_a_bad_head_count_is_refused_naming_the_key(head_directory, tmp_path, key, value):
    from specbench.heads.eagle_head_files import load_eagle_head

    if value is None and key in ("num_key_value_heads", "head_dim"):
        pytest.skip("null: the head's own default (all heads; hidden_size / heads)")
    target, directory = damaged_head(head_directory, tmp_path, key, value)
    message = refusal(load_eagle_head, target, str(directory), "eagle")
    assert key in message and repr(value) in message, message


@pytest.mark.parametrize("value", BAD_HEAD_REALS, ids=repr)
@pytest.mark.parametrize("key", HEAD_REALS)
def test_a_bad_head_real_is_refused_naming_the_key(head_directory, tmp_path, key, value):
    from specbench.heads.eagle_head_files import load_eagle_head

    if value is None and key == "rope_theta":
        pytest.skip("null: EAGLE's default rotary base")
    target, directory = damaged_head(head_directory, tmp_path, key, value)
    message = refusal(load_eagle_head, target, str(directory), "eagle")
    assert key in message and repr(value) in message, message


@pytest.mark.parametrize("factor", [math.inf, math.nan, "2", True, 0, -1])
def test_a_bad_rope_scaling_factor_is_refused(head_directory, tmp_path, factor):
    from specbench.heads.eagle_head_files import load_eagle_head

    target, directory = damaged_head(head_directory, tmp_path, "rope_scaling", {"type": "linear", "factor": factor})
    message = refusal(load_eagle_head, target, str(directory), "eagle")
    assert "rope_scaling" in message, message


def test_the_head_loads_with_its_own_values(head_directory):
    from specbench.heads.eagle_head_files import load_eagle_head

    target, directory = head_directory
    assert load_eagle_head(target, str(directory), "eagle") is not None


@pytest.fixture(scope="module")
def eagle3_head_directory(tiny, tmp_path_factory):
    """A tiny EAGLE-3 head (random weights, its own full vocabulary) reading layers 0, 1, 1 of the 2-layer target."""
    from specbench.heads.eagle_head_files import save_eagle_head
    from specbench.heads.eagle_heads import build_head, head_config_for

    torch.manual_seed(0)
    head = build_head(head_config_for(tiny, "eagle3", feature_layers=(0, 1, 1)),
                      tiny.weights.module.get_output_embeddings(),
                      tiny.weights.module.get_input_embeddings().weight)
    directory = tmp_path_factory.mktemp("eagle3-head")
    save_eagle_head(head, directory, "eagle3")
    return tiny, directory


@pytest.mark.parametrize("value", [math.inf, math.nan, 64.5, "64", True, 0], ids=repr)
@pytest.mark.parametrize("key", ["draft_vocab_size", "target_hidden_size"])
def test_a_bad_eagle3_head_count_is_refused_naming_the_key(eagle3_head_directory, tmp_path, key, value):
    from specbench.heads.eagle_head_files import load_eagle_head

    target, directory = eagle3_head_directory
    assert load_eagle_head(target, str(directory), "eagle3") is not None
    copy = tmp_path / "head"
    shutil.copytree(directory, copy)
    config = json.loads((copy / "config.json").read_text())
    config[key] = value  # target_hidden_size is written only when it differs from hidden_size: set here
    (copy / "config.json").write_text(json.dumps(config))
    message = refusal(load_eagle_head, target, str(copy), "eagle3")
    assert key in message and repr(value) in message, message


# ---- the numbers of a drafter's pruned drafts (drafts_by_family.<family>.pruned) ---------------------------------


def pruned_cases():
    """(config, family, key) for every number of every pruned entry in conf/drafter."""
    for name in DRAFTERS:
        families = OmegaConf.to_container(drafter_yaml(name), resolve=False).get("drafts_by_family") or {}
        for family, spec in families.items():
            for key, value in ((spec or {}).get("pruned") or {}).items():
                if isinstance(value, int) and not isinstance(value, bool):
                    yield name, family, key


@pytest.mark.parametrize("name, family, key", sorted(set(pruned_cases())))
def test_a_bad_pruned_draft_number_is_refused_naming_the_key(tiny, tmp_path, monkeypatch, name, family, key):
    from specbench.drafters.draft_model import DraftModel

    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path))
    spec = OmegaConf.to_container(drafter_yaml(name), resolve=False)["drafts_by_family"][family]["pruned"]
    for value in BAD["count"]:
        drafter = DraftModel(drafts_by_family={"tiny-random": {"pruned": {**spec, key: value}}})
        for call in (drafter.artefacts, drafter.prepare):  # the plan and the build
            message = refusal(call, tiny)
            assert f"pruned.{key}" in message and repr(value) in message, message
    assert not any(tmp_path.iterdir())  # refused before anything was built


def test_the_pruned_cases_cover_the_configs():
    keys = {key for _, _, key in pruned_cases()}
    assert keys == {"layers", "distill_tokens"}
