"""What ``engine=vllm`` runs, checked before anything loads and without vLLM (``specbench.engines.vllm_methods``,
its place in ``check_config`` and the run's identity): which drafter configs map onto vLLM's speculative_config
and to what, the one-line refusals of the others and of bad engine settings, the run directory's name, and what a
vLLM run directory records so that it resumes only as the same run."""

from __future__ import annotations

import pytest
from hydra import compose as hydra_compose
from hydra import initialize_config_dir
from omegaconf import OmegaConf

from specbench.config import CONF_DIR, check_config, compose, group_options
from specbench.engines.vllm_methods import (VLLM_DRAFTERS, VLLM_METHODS, VllmSettings, check_engine_config,
                                            speculative_config, vllm_method)
from specbench.run.identity import NOT_RESULT_SETTINGS, check_resumable, config_settings

from conftest import refusal

# The drafter configs not mapped onto a vLLM method (issue 32): their classes are specbench's own; medusa (issue 33)
# is not mapped either: vLLM's medusa reads another head format and drafts a chain, not Medusa's tree.
REFUSED = {"hd", "hd-chains", "rest", "lookahead", "recycling", "samd", "hybrid", "medusa", "hydra"}


def drafter_of(name: str, *overrides: str) -> dict:
    return OmegaConf.to_container(compose([f"drafter={name}", "engine=vllm", *overrides]).drafter, resolve=True)


def groups(*overrides: str) -> tuple[dict, dict, dict]:
    """(engine, drafter, run) of a composed configuration, as check_engine_config is given them."""
    cfg = compose(list(overrides))
    return tuple(OmegaConf.to_container(cfg[group], resolve=True) for group in ("engine", "drafter", "run"))


# --- which drafters vLLM runs ----------------------------------------------------------------------------------

@pytest.mark.parametrize("name", group_options("drafter"))
def test_every_drafter_config_maps_onto_vllm_or_is_refused_in_one_line_naming_those_that_do(name):
    drafter = drafter_of(name)
    engine, _, run = groups("engine=vllm", f"drafter={name}")
    if drafter["_target_"] in VLLM_METHODS:
        assert name in VLLM_DRAFTERS
        assert name not in REFUSED
        assert isinstance(check_engine_config(engine, drafter, run), VllmSettings)
        return
    assert name in REFUSED and name not in VLLM_DRAFTERS
    line = refusal(check_engine_config, engine, drafter, run)
    assert line.startswith(f"drafter={name} runs on engine=specbench only")
    assert f"engine=vllm runs drafter={', '.join(VLLM_DRAFTERS)}" in line
    assert refusal(check_config, compose([f"drafter={name}", "engine=vllm"])) == line  # before anything loads


def test_vllm_drafters_lists_exactly_the_configs_whose_class_maps():
    mapped = {name for name in group_options("drafter") if drafter_of(name)["_target_"] in VLLM_METHODS}
    assert set(VLLM_DRAFTERS) == mapped
    assert list(VLLM_DRAFTERS) == sorted(VLLM_DRAFTERS)  # the refusal lists them in order
    assert set(group_options("drafter")) - mapped == REFUSED


@pytest.mark.parametrize("name, method", [("ar", None), ("pld", "ngram"), ("pld-hd", "ngram"), ("suffix", "suffix"),
                                          ("eagle", "eagle"), ("eagle2", "eagle"), ("eagle3", "eagle3"),
                                          ("sps", "draft_model"), ("draft_model", "draft_model"),
                                          ("opt-small", "draft_model"), ("wide-pruned", "draft_model"),
                                          ("qwen-0.5b", "draft_model")])
def test_each_mapped_drafter_gets_its_vllm_method(name, method):
    assert vllm_method(drafter_of(name)) == method


def test_the_specbench_engine_runs_every_drafter():
    for name in sorted(REFUSED):
        engine, drafter, run = groups(f"drafter={name}")
        assert check_engine_config(engine, drafter, run) is None


# --- speculative_config -----------------------------------------------------------------------------------------

def test_pld_is_vllm_ngram_with_spec_bench_pld_settings():
    assert speculative_config(drafter_of("pld"), None) == {
        "method": "ngram", "num_speculative_tokens": 10, "prompt_lookup_max": 3, "prompt_lookup_min": 1}


def test_pld_follows_its_overrides():
    drafter = drafter_of("pld", "drafter.num_draft_tokens=4", "drafter.max_ngram_size=5", "drafter.min_ngram_size=2")
    assert speculative_config(drafter, None) == {
        "method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 5, "prompt_lookup_min": 2}
    assert speculative_config(drafter_of("pld-hd"), None)["prompt_lookup_max"] == 2  # pld-hd's own settings


def test_ar_has_no_speculative_config():
    assert speculative_config(drafter_of("ar"), None) is None


def test_eagle3_is_vllm_eagle3_with_its_depth_and_head():
    assert speculative_config(drafter_of("eagle3"), "/heads/e3") == {
        "method": "eagle3", "model": "/heads/e3", "num_speculative_tokens": 5}
    assert speculative_config(drafter_of("eagle3", "drafter.depth=7"), "/heads/e3")["num_speculative_tokens"] == 7
    assert speculative_config(drafter_of("eagle"), "/heads/e1")["method"] == "eagle"


def test_sps_is_vllm_draft_model_with_gamma():
    assert speculative_config(drafter_of("sps"), "/drafts/d") == {
        "method": "draft_model", "model": "/drafts/d", "num_speculative_tokens": 5}
    assert speculative_config(drafter_of("sps", "drafter.gamma=3"), "/drafts/d")["num_speculative_tokens"] == 3


def test_a_method_that_loads_a_checkpoint_needs_its_directory():
    line = refusal(speculative_config, drafter_of("eagle3"), None)
    assert "drafter=eagle3" in line and "eagle3 checkpoint" in line


def test_suffix_maps_onto_vllm_suffix_keys():
    assert speculative_config(drafter_of("suffix"), None) == {
        "method": "suffix", "num_speculative_tokens": 24, "suffix_decoding_max_tree_depth": 24,
        "suffix_decoding_max_cached_requests": 10000, "suffix_decoding_max_spec_factor": 1.0,
        "suffix_decoding_min_token_prob": 0.1}
    overridden = drafter_of("suffix", "drafter.max_spec_tokens=8", "drafter.max_tree_depth=16",
                            "drafter.min_token_prob=0.2")
    config = speculative_config(overridden, None)
    assert config["num_speculative_tokens"] == 8 and config["suffix_decoding_max_tree_depth"] == 16
    assert config["suffix_decoding_min_token_prob"] == 0.2


# --- engine settings --------------------------------------------------------------------------------------------

def vllm_settings(**changed) -> dict:
    node = OmegaConf.to_container(compose(["engine=vllm"]).engine, resolve=True)
    return {**node, **changed}


def test_the_vllm_config_is_valid_as_shipped():
    settings = VllmSettings.from_config(vllm_settings())
    assert settings.concurrency == [] and settings.paired is True and settings.max_num_seqs == 256


@pytest.mark.parametrize("changed, key", [
    ({"concurency": [1]}, "engine.concurency"),
    ({"concurrency": [1, 0]}, "engine.concurrency"),
    ({"concurrency": [-4]}, "engine.concurrency"),
    ({"concurrency": [1.5]}, "engine.concurrency"),
    ({"concurrency": [True]}, "engine.concurrency"),
    ({"concurrency": "many"}, "engine.concurrency"),
    ({"concurrency": [1, 4, 1]}, "engine.concurrency"),
    ({"concurrency": [1, 512]}, "engine.concurrency=512"),
    ({"paired": False}, "engine.paired=false"),
    ({"paired": "yes"}, "engine.paired"),
    ({"enforce_eager": 1}, "engine.enforce_eager"),
    ({"request_timeout_s": 0}, "engine.request_timeout_s"),
    ({"request_timeout_s": "long"}, "engine.request_timeout_s"),
    ({"max_model_len": 0}, "engine.max_model_len"),
    ({"max_model_len": 4096.0}, "engine.max_model_len"),
    ({"max_num_seqs": -1}, "engine.max_num_seqs"),
    ({"tensor_parallel_size": 0}, "engine.tensor_parallel_size"),
    ({"cpu_kv_cache_gib": 0}, "engine.cpu_kv_cache_gib"),
    ({"cpu_kv_cache_gib": 0.5}, "engine.cpu_kv_cache_gib"),  # vLLM reads whole GiB only
    ({"gpu_memory_utilization": 1.5}, "engine.gpu_memory_utilization"),
    ({"gpu_memory_utilization": 0}, "engine.gpu_memory_utilization"),
])
def test_a_bad_engine_setting_is_one_line_naming_its_key(changed, key):
    line = refusal(VllmSettings.from_config, vllm_settings(**changed))
    assert key in line


def test_the_known_settings_are_listed_when_a_key_is_unknown():
    line = refusal(VllmSettings.from_config, vllm_settings(concurency=[1]))
    assert "max_model_len" in line and "concurrency" in line


def test_levels_are_kept_as_a_list_of_ints():
    assert VllmSettings.from_config(vllm_settings(concurrency=4)).concurrency == [4]
    assert VllmSettings.from_config(vllm_settings(concurrency=[16, 1])).concurrency == [16, 1]
    assert VllmSettings.from_config(vllm_settings(paired=False, concurrency=[2])).paired is False


@pytest.mark.parametrize("overrides, key", [
    (["engine.concurrency=[0]"], "engine.concurrency"),
    (["engine.concurrency=[300]"], "engine.max_num_seqs"),
    (["+engine.batch=8"], "engine.batch"),
    (["engine.paired=false"], "engine.paired=false"),
    (["run.draft_budget=auto"], "run.draft_budget=auto"),
    (["run.verify_padding=auto"], "run.verify_padding=auto"),
])
def test_check_config_refuses_bad_engine_settings_before_anything_loads(overrides, key):
    line = refusal(check_config, compose(["engine=vllm", "model=tiny-random", *overrides]))
    assert key in line


def test_loop_only_run_settings_name_the_engine():
    line = refusal(check_config, compose(["engine=vllm", "run.draft_budget=auto"]))
    assert "engine=vllm" in line and "run.draft_budget=off" in line


def test_the_specbench_engine_has_no_settings_besides_its_name():
    line = refusal(check_config, compose(["+engine.concurrency=[1]"]))
    assert "engine.concurrency" in line and "engine=specbench" in line
    engine, drafter, run = groups("+engine.max_model_len=2048")
    assert "engine.max_model_len" in refusal(check_engine_config, engine, drafter, run)


def test_an_unknown_engine_name_is_refused():
    engine, drafter, run = groups("engine.name=sglang")
    line = refusal(check_engine_config, engine, drafter, run)
    assert "engine.name='sglang'" in line and "engine=vllm" in line


def test_the_default_configuration_passes():
    assert check_config(compose(["model=tiny-random"])) is not None
    assert check_config(compose(["model=tiny-random", "engine=vllm"])) is not None


# --- where a run goes -------------------------------------------------------------------------------------------

def run_dir_of(*overrides: str) -> str:
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        cfg = hydra_compose(config_name="config", overrides=list(overrides), return_hydra_config=True)
        return str(cfg.hydra.run.dir)


def test_a_vllm_run_directory_is_named_method_at_vllm():
    assert run_dir_of("engine=vllm").startswith("runs/smollm2-135m/pld@vllm/")
    assert run_dir_of("engine=vllm", "drafter=sps", "model=tiny-random").startswith("runs/tiny-random/sps@vllm/")


def test_the_default_engine_keeps_the_run_directory_names():
    assert run_dir_of().startswith("runs/smollm2-135m/pld/")
    assert run_dir_of("engine=specbench", "drafter=hd", "run.draft_budget=auto").startswith(
        "runs/smollm2-135m/hd+budget/")


# --- what a run.json records ------------------------------------------------------------------------------------

def test_a_specbench_run_records_no_engine_so_older_run_directories_stay_resumable():
    assert "engine" not in config_settings(compose([]))
    assert "engine" not in config_settings(compose(["engine=specbench", "drafter=hd"]))


def test_a_vllm_run_records_its_engine_settings_but_those_that_select_what_is_measured():
    engine = config_settings(compose(["engine=vllm"]))["engine"]
    assert engine["name"] == "vllm" and engine["max_model_len"] == 4096 and engine["max_num_seqs"] == 256
    for key in ("concurrency", "paired", "request_timeout_s"):
        assert key not in engine and f"engine.{key}" in NOT_RESULT_SETTINGS


def test_a_vllm_run_directory_resumes_with_other_levels_but_not_another_context(tmp_path):
    placed = {"processes": 1, "placement": "vllm:tp=1", "devices": "cpu", "linear_backend_used": "vllm"}
    earlier = {**config_settings(compose(["engine=vllm"])), **placed}

    def wanted(*overrides):
        return {**config_settings(compose(["engine=vllm", *overrides])), "processes": 1}

    check_resumable(tmp_path, earlier, wanted("engine.concurrency=[1,4]", "engine.request_timeout_s=60"))
    line = refusal(check_resumable, tmp_path, earlier, wanted("engine.max_model_len=2048"))
    assert "max_model_len" in line
    line = refusal(check_resumable, tmp_path, earlier, wanted("engine=specbench"))
    assert "engine" in line  # the specbench loop's run.json has no "engine": not the same run
    loop_run = {**config_settings(compose([])), **placed}
    assert "engine.name: None -> 'vllm'" in refusal(check_resumable, tmp_path, loop_run, wanted())
