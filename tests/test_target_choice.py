"""The Target a loader builds is the one the model config names (``model.target``, specbench.targets.choice): every
loader path (tiny-random, a GGUF file, a hub-style checkpoint directory; composed with Hydra, read with PyYAML, or
called from Python) builds the class it names with its settings; a class that is not there or not a Target is one
line before anything loads; and run.json records the node only when it is not the transformers target, so run
directories written before the node existed still resume."""

from __future__ import annotations

import pytest
from conftest import one_line

from specbench.config import check_group_keys, check_group_values, compose
from specbench.errors import SpecbenchError
from specbench.run.instantiate import build
from specbench.targets.choice import DEFAULT_NODE, build_target, recorded_target, target_builder
from specbench.targets.transformers import TransformersTarget
from specbench.testing import save_tiny_checkpoint

LABELLED = f"{__name__}.LabelledTarget"


class LabelledTarget(TransformersTarget):
    """The transformers target under another name, with a setting of its own: what a new backend looks like to
    the loaders."""

    def __init__(self, model, label: str = "unset"):
        super().__init__(model)
        self.label = label


class NotATarget:
    def __init__(self, model):
        self.model = model


def other_target(label: str = "from-config") -> list[str]:
    return [f"model.target._target_={LABELLED}", f"+model.target.label={label}"]


def loaded(overrides: list[str]):
    cfg = compose(overrides)
    check_group_keys(cfg)
    check_group_values(cfg)
    return build(cfg.model, device="cpu", linear_backend="aten")


def test_tiny_random_builds_the_target_its_config_names():
    model = loaded(["model=tiny-random", "model.num_layers=1", *other_target()])
    assert type(model.target) is LabelledTarget and model.target.label == "from-config"
    assert type(loaded(["model=tiny-random", "model.num_layers=1"]).target) is TransformersTarget


def test_the_test_kit_reading_the_config_with_pyyaml_builds_it_too():
    from specbench.testing import tiny_random

    model = tiny_random(num_layers=1, target={"_target_": LABELLED, "_partial_": True, "label": "yaml"})
    assert type(model.target) is LabelledTarget and model.target.label == "yaml"
    assert type(tiny_random(num_layers=1).target) is TransformersTarget  # the config's own node


def test_a_checkpoint_directory_builds_the_target_its_config_names(tmp_path):
    save_tiny_checkpoint(tmp_path)
    model = loaded(["model=vicuna-7b", f"model.path={tmp_path}", "model.prompt_format=plain", "model.dtype=float32",
                    *other_target("hub")])
    assert type(model.target) is LabelledTarget and model.target.label == "hub"
    from specbench.models.hub import load_pretrained

    direct = load_pretrained("direct", path=str(tmp_path), device="cpu", prompt_format="plain", target=LabelledTarget)
    assert type(direct.target) is LabelledTarget and direct.target.label == "unset"  # a class given from Python


def test_a_gguf_file_builds_the_target_its_config_names(tmp_path, monkeypatch):
    from specbench.artefacts import gguf_conversion
    from specbench.storage.publish import replace_directory

    def convert(file, converted, torch_dtype):  # no real GGUF: the conversion publishes a tiny checkpoint
        replace_directory(converted, save_tiny_checkpoint, {"gguf": str(file), "dtype": str(torch_dtype)})

    monkeypatch.setattr(gguf_conversion, "convert_gguf", convert)
    source = tmp_path / "tiny.gguf"
    source.write_bytes(b"GGUF")
    model = loaded(["model=qwen2.5-coder-1.5b", f"model.gguf_path={source}", f"model.cache_dir={tmp_path}",
                    "model.prompt_format=plain", *other_target("gguf")])
    assert type(model.target) is LabelledTarget and model.target.label == "gguf"


@pytest.mark.parametrize("model", ["tiny-random", "smollm2-135m", "vicuna-7b", "qwen2.5-coder-1.5b"])
@pytest.mark.parametrize("target,expected", [
    ("specbench.targets.nope.Nope", "model.target._target_=specbench.targets.nope.Nope cannot be imported "
                                    "(AttributeError: module 'specbench.targets' has no attribute 'nope'); choose a "
                                    "Target class such as specbench.targets.transformers.TransformersTarget or "
                                    "specbench.targets.reference.ReferenceTarget (docs/targets.md)"),
    (f"{__name__}.NotATarget", f"model.target._target_={__name__}.NotATarget is not a Target (a subclass of "
                               "specbench.decoding.target.Target); choose a Target class such as "
                               "specbench.targets.transformers.TransformersTarget or "
                               "specbench.targets.reference.ReferenceTarget (docs/targets.md)"),
], ids=["missing", "not-a-target"])
def test_an_unknown_or_unsuitable_target_is_one_line_before_anything_loads(model, target, expected):
    with pytest.raises(SpecbenchError) as error:
        check_group_values(compose([f"model={model}", f"model.target._target_={target}"]))
    assert one_line(error) == expected


def test_a_setting_the_class_does_not_take_and_a_target_built_without_the_model_are_refused():
    with pytest.raises(SpecbenchError) as error:
        check_group_values(compose(["model=tiny-random", "+model.target.mode=max-autotune"]))
    assert one_line(error) == "unknown setting(s) model.target.mode; TransformersTarget takes none"
    with pytest.raises(SpecbenchError) as error:
        check_group_values(compose(["model=tiny-random", "model.target._partial_=false"]))
    assert one_line(error) == ("model.target._partial_ must be true (the loader builds TransformersTarget with the "
                               "loaded model), got False")


def test_the_loaders_refuse_a_wrong_target_before_reading_weights(tmp_path):
    """Called from Python, past the config's checks: refused by the loader before any file is read (the directory
    does not even exist), and a built object that is not a Target by the last step."""
    from specbench.models.hub import load_pretrained

    for given in (NotATarget, {"_target_": f"{__name__}.NotATarget", "_partial_": True}):
        with pytest.raises(SpecbenchError, match=r"NotATarget.* is not a Target \(a subclass of specbench\.decoding"):
            load_pretrained("x", path=str(tmp_path / "missing"), device="cpu", target=given)
    with pytest.raises(SpecbenchError, match=r"^model\.target built a NotATarget, not a Target"):
        build_target(lambda model: NotATarget(model), object())
    with pytest.raises(SpecbenchError, match=r"^model\.target must name a Target class"):
        target_builder(42)


def test_run_json_records_the_target_only_when_it_is_not_the_transformers_one():
    """The default node is left out, so a run directory written before model.target existed (its model_config
    without it) resumes with today's configuration; another Target is recorded, and refused on resume."""
    from specbench.results.resumable import settings_differences
    from specbench.run.identity import config_settings

    default = config_settings(compose(["model=tiny-random"]), None)
    other = config_settings(compose(["model=tiny-random", *other_target()]), None)
    assert "target" not in default["model_config"]
    assert other["model_config"]["target"] == {"_target_": LABELLED, "_partial_": True, "label": "from-config"}
    assert settings_differences(default, config_settings(compose(["model=tiny-random"]), None)) == []
    assert settings_differences(default, other) == [
        "model_config.target._partial_: None -> True", f"model_config.target._target_: None -> '{LABELLED}'",
        "model_config.target.label: None -> 'from-config'"]
    assert recorded_target(DEFAULT_NODE) is None and recorded_target(None) is None
