"""What ``engine=vllm`` runs, checked before anything loads and without vLLM (``specbench.engines.vllm_methods``,
reached through the engine group's ``_target_`` by ``config.choose_engine`` and ``check_config``, and the run's
identity): which drafter configs map onto vLLM's speculative_config and to what (derived from conf/drafter/, so a
new config needs no edit here), the one-line refusals of the others and of bad engine settings, how an engine is
chosen, the run directory's name, and what a vLLM run directory records so that it resumes only as the same run."""

from __future__ import annotations

import pytest
from hydra import compose as hydra_compose
from hydra import initialize_config_dir
from omegaconf import OmegaConf

import specbench.config as config
from specbench.config import CONF_DIR, check_config, choose_engine, compose, group_options, option_target
from specbench.engines.specbench_loop import LoopSettings, SpecbenchLoop
from specbench.engines.vllm import VllmEngine
from specbench.engines.vllm_methods import (VLLM_METHODS, VllmSettings, check_vllm_config, speculative_config,
                                            vllm_drafters, vllm_method)
from specbench.run.identity import check_resumable, config_settings

from conftest import refusal

# The drafter configs vLLM runs, and those it refuses, derived from the configs' own classes (their _target_):
# a new config in conf/drafter/ is sorted into one or the other without an edit here (or anywhere: see
# test_a_new_drafter_config_is_sorted_without_an_edit).
RUNS_ON_VLLM = [name for name in group_options("drafter") if option_target("drafter", name) in VLLM_METHODS]
REFUSED = sorted(set(group_options("drafter")) - set(RUNS_ON_VLLM))


def drafter_of(name: str, *overrides: str) -> dict:
    return OmegaConf.to_container(compose([f"drafter={name}", "engine=vllm", *overrides]).drafter, resolve=True)


def groups(*overrides: str) -> tuple[dict, dict, dict]:
    """(engine, drafter, run) of a composed configuration, as an engine's check_config is given them (the
    engine group without its _target_)."""
    cfg = compose(list(overrides))
    engine, drafter, run = (OmegaConf.to_container(cfg[group], resolve=True) for group in ("engine", "drafter", "run"))
    engine.pop("_target_")
    return engine, drafter, run


# --- which drafters vLLM runs ----------------------------------------------------------------------------------

@pytest.mark.parametrize("name", group_options("drafter"))
def test_every_drafter_config_maps_onto_vllm_or_is_refused_in_one_line_naming_those_that_do(name):
    drafter = drafter_of(name)
    assert option_target("drafter", name) == drafter["_target_"]  # read from the files as Hydra composes them
    engine, _, run = groups("engine=vllm", f"drafter={name}")
    if name in RUNS_ON_VLLM:
        assert isinstance(check_vllm_config(engine, drafter, run), VllmSettings)
        return
    line = refusal(check_vllm_config, engine, drafter, run)
    assert line.startswith(f"drafter={name} runs on engine=specbench only")
    assert f"engine=vllm runs drafter={', '.join(RUNS_ON_VLLM)}" in line
    assert refusal(check_config, compose([f"drafter={name}", "engine=vllm"])) == line  # before anything loads


def test_the_drafters_vllm_runs_are_the_configs_whose_class_maps_and_no_other():
    assert vllm_drafters() == RUNS_ON_VLLM == sorted(RUNS_ON_VLLM)  # the refusal lists them in order
    # the classes that are specbench's own (vLLM 0.32 has no such method), hydra among them
    assert {"hd", "hd-chains", "rest", "lookahead", "recycling", "samd", "hybrid", "hydra"} <= set(REFUSED)
    assert {"ar", "pld", "suffix", "eagle", "eagle3", "medusa", "sps"} <= set(RUNS_ON_VLLM)


def test_a_new_drafter_config_is_sorted_without_an_edit(tmp_path, monkeypatch):
    """docs/development.md: adding a drafter touches its module, its yaml and the docs that describe it, nothing
    else. A new config of a class vLLM maps runs on engine=vllm and is named in the refusal of the others; one of
    another class is refused; neither needs an edit of vllm_methods.py or of a list in a test."""
    import shutil

    conf = tmp_path / "conf"
    shutil.copytree(CONF_DIR, conf)
    (conf / "drafter" / "brand-new.yaml").write_text("defaults:\n  - pld\n  - _self_\nname: brand-new\n")
    (conf / "drafter" / "brand-own.yaml").write_text("_target_: specbench.drafters.lookahead.Lookahead\n"
                                                     "name: brand-own\n")
    monkeypatch.setattr(config, "CONF_DIR", conf)
    option_target.cache_clear()
    try:
        assert "brand-new" in vllm_drafters() and "brand-own" not in vllm_drafters()
        assert vllm_method(OmegaConf.to_container(compose(["drafter=brand-new", "engine=vllm"]).drafter,
                                                  resolve=True)) == "ngram"
        line = refusal(check_config, compose(["drafter=brand-own", "engine=vllm"]))
        assert line.startswith("drafter=brand-own runs on engine=specbench only") and "brand-new" in line
    finally:
        option_target.cache_clear()


def test_option_target_follows_the_defaults_list_as_hydra_applies_it(tmp_path, monkeypatch):
    (tmp_path / "g").mkdir()
    (tmp_path / "g" / "base.yaml").write_text("_target_: a.Base\n")
    (tmp_path / "g" / "child.yaml").write_text("defaults:\n  - base\nname: child\n")  # _self_ last: base's
    (tmp_path / "g" / "own.yaml").write_text("defaults:\n  - base\n_target_: a.Own\n")  # its own wins
    (tmp_path / "g" / "first.yaml").write_text("defaults:\n  - _self_\n  - base\n_target_: a.Own\n")  # base wins
    (tmp_path / "g" / "none.yaml").write_text("name: none\n")
    monkeypatch.setattr(config, "CONF_DIR", tmp_path)
    option_target.cache_clear()
    try:
        assert [option_target("g", name) for name in ("base", "child", "own", "first", "none")] == [
            "a.Base", "a.Base", "a.Own", "a.Base", None]
    finally:
        option_target.cache_clear()


@pytest.mark.parametrize("name, method", [("ar", None), ("pld", "ngram"), ("pld-hd", "ngram"), ("suffix", "suffix"),
                                          ("eagle", "eagle"), ("eagle2", "eagle"), ("eagle3", "eagle3"),
                                          ("medusa", "medusa"),
                                          ("sps", "draft_model"), ("draft_model", "draft_model"),
                                          ("opt-small", "draft_model"), ("wide-pruned", "draft_model"),
                                          ("qwen-0.5b", "draft_model")])
def test_each_mapped_drafter_gets_its_vllm_method(name, method):
    assert vllm_method(drafter_of(name)) == method


def test_the_specbench_engine_runs_every_drafter():
    for name in REFUSED:
        engine, settings = choose_engine(compose([f"drafter={name}"]))
        assert engine is SpecbenchLoop and settings == LoopSettings("specbench") and settings.identity() is None


# --- how an engine is chosen: the group's _target_ ---------------------------------------------------------------

def test_each_engine_config_names_its_engine_class_and_that_class_checks_it():
    assert choose_engine(compose([]))[0] is SpecbenchLoop
    engine, settings = choose_engine(compose(["engine=vllm", "engine.concurrency=[1,4]"]))
    assert engine is VllmEngine and isinstance(settings, VllmSettings) and settings.load_levels == [1, 4]
    for option in group_options("engine"):
        engine, settings = choose_engine(compose([f"engine={option}"]))
        assert engine.name == settings.name == option


def test_a_config_without_an_engine_group_gets_the_default_engine():
    cfg = compose([])
    OmegaConf.set_struct(cfg, False)
    del cfg["engine"]
    assert choose_engine(cfg)[0] is SpecbenchLoop


@pytest.mark.parametrize("overrides, says", [
    (["engine._target_=specbench.engines.nope.Nope"], "engine._target_=specbench.engines.nope.Nope cannot be used"),
    (["engine._target_=logging.basicConfig"], "engine._target_=logging.basicConfig is not an engine"),
    (["engine=vllm", "engine._target_=specbench.engines.specbench_loop.SpecbenchLoop"], "engine.name='vllm'"),
    (["engine.name=sglang"], "engine.name='sglang'"),
])
def test_an_engine_that_is_not_one_is_one_line_naming_the_engines(overrides, says):
    line = refusal(check_config, compose(["model=tiny-random", *overrides]))
    assert line.startswith(says) and line.endswith("choose engine=specbench or engine=vllm or engine=vllm-custom")


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


def test_medusa_is_vllm_medusa_with_one_token_per_head_it_reads():
    """vLLM builds num_speculative_tokens heads and drafts one token with each: drafter.heads (4, Spec-Bench's
    first 4 of the published 5), from the copy of the heads vLLM reads (engines.vllm.medusa_for_vllm)."""
    assert speculative_config(drafter_of("medusa"), "/cache/vllm-medusa-1") == {
        "method": "medusa", "model": "/cache/vllm-medusa-1", "num_speculative_tokens": 4}
    assert speculative_config(drafter_of("medusa", "drafter.heads=5"), "/m")["num_speculative_tokens"] == 5


def test_hydra_is_refused_as_vllm_has_no_hydra():
    engine, drafter, run = groups("engine=vllm", "drafter=hydra")
    line = refusal(check_vllm_config, engine, drafter, run)
    assert line.startswith("drafter=hydra runs on engine=specbench only: vLLM has no such method")
    assert "medusa" in line and "hydra, " not in line


def test_an_eagle_head_with_an_fc_bias_is_refused_on_vllm_and_one_without_runs():
    """vLLM 0.32's EAGLE heads have no fc bias and its loader drops one without a word: a head with one would run
    as another head under its name. EAGLE-1's heads have one (EAGLE's default), EAGLE-3's none."""
    from specbench.engines.vllm_methods import FC_WITHOUT_BIAS, fc_bias_refusal

    line = fc_bias_refusal("eagle2", "eagle", "/heads/e1", True)
    assert line.startswith("drafter=eagle2 on engine=vllm: its head (/heads/e1) has an fc layer with a bias")
    assert "engine=specbench" in line and '"bias": false' in line and "\n" not in line
    assert fc_bias_refusal("eagle3", "eagle3", "/heads/e3", True) is not None
    assert fc_bias_refusal("eagle", "eagle", "/heads/e1", False) is None
    assert fc_bias_refusal("sps", "draft_model", "/drafts/d", True) is None  # a draft model's own layers load whole
    assert FC_WITHOUT_BIAS == ("eagle", "eagle3")


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
    engine, _, _ = groups("engine=vllm")
    return {**engine, **changed}


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
    assert "engine.max_model_len" in refusal(SpecbenchLoop.check_config, engine, drafter, run)


def test_an_unknown_engine_is_refused_naming_the_engines():
    from hydra.errors import MissingConfigException

    from specbench.errors import config_error_line

    with pytest.raises(MissingConfigException) as error:
        compose(["engine=sglang"])
    assert config_error_line(error.value) == ("engine=sglang: no such config in conf/engine/; choose one of "
                                              "specbench, vllm, vllm-custom")


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

def recorded(*overrides: str) -> dict:
    """run.json's settings that the configuration fixes, its engine's identity among them, as the runner makes them."""
    cfg = compose(list(overrides))
    return config_settings(cfg, choose_engine(cfg)[1].identity())


def test_a_specbench_run_records_no_engine_so_older_run_directories_stay_resumable():
    assert "engine" not in recorded()
    assert "engine" not in recorded("engine=specbench", "drafter=hd")


def test_a_vllm_run_records_its_engine_settings_but_those_that_select_what_is_measured():
    engine = recorded("engine=vllm")["engine"]
    assert engine == {"name": "vllm", "max_model_len": 4096, "max_num_seqs": 256, "gpu_memory_utilization": 0.85,
                      "cpu_kv_cache_gib": 2, "tensor_parallel_size": 1, "enforce_eager": False}  # no _target_ either
    assert set(VllmSettings.NOT_RESULT_SETTINGS) == {"concurrency", "paired", "request_timeout_s"}


def test_a_vllm_run_directory_resumes_with_other_levels_but_not_another_context(tmp_path):
    placed = {"processes": 1, "placement": "vllm:tp=1", "devices": "cpu", "linear_backend_used": "vllm"}
    earlier = {**recorded("engine=vllm"), **placed}

    def wanted(*overrides):
        return {**recorded("engine=vllm", *overrides), "processes": 1}

    check_resumable(tmp_path, earlier, wanted("engine.concurrency=[1,4]", "engine.request_timeout_s=60",
                                              "engine.paired=false"))
    line = refusal(check_resumable, tmp_path, earlier, wanted("engine.max_model_len=2048"))
    assert "max_model_len" in line
    line = refusal(check_resumable, tmp_path, earlier, wanted("engine=specbench"))
    assert "engine" in line  # the specbench loop's run.json has no "engine": not the same run
    loop_run = {**recorded(), **placed}
    assert "engine.name: None -> 'vllm'" in refusal(check_resumable, tmp_path, loop_run, wanted())
