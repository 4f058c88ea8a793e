"""The compiled regime (run.regime=compiled, specbench/targets/compiled.py) in the default suite: one target over
tiny-random, compiled once for the module in torch.compile's default mode, decodes exactly as plain greedy
decoding with a chain and a tree that must be compacted; nothing compiles after ``prepare``, and what cannot be
compiled or was not is one line. Every lossless contract test also runs over the compiled target with -m slow
(conftest.TARGET_KINDS). The settings and names of the regime are checked here too."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
from conftest import aten_twin, refusal, warnings_of
from test_contract import TreeOracle

from specbench.decoding.loop import Decoder
from specbench.decoding.target import VerifyInputs
from specbench.drafters.ar import NoDraft
from specbench.errors import SpecbenchError
from specbench.settings import RunSettings, method_name
from specbench.targets.choice import COMPILED_TARGET, DEFAULT_NODE, regime_target
from specbench.targets.compiled import (FIRST_COMPILABLE, CompileFailed, CompiledTarget, bucket_for,
                                        compilable_transformers, padded_inputs)
from specbench.targets.static_cache import StaticTreeCache
from specbench.testing import configured_drafter, greedy_reference

BUCKETS = (1, 2, 4, 8)
# Under an older transformers (scripts/floor_env.sh) the compiled target is refused: only that is checked there.
needs_compilable = pytest.mark.skipif(not compilable_transformers(), reason="the compiled target needs transformers "
                                      f"{'.'.join(map(str, FIRST_COMPILABLE))} or later")


@pytest.fixture(scope="module")
def compiled(tiny):
    target = CompiledTarget(aten_twin(tiny).weights.module, buckets=BUCKETS, mode="default")
    with torch.inference_mode():
        target.prepare(longest_sequence=200, largest_pass=8, hidden_layers=[()])
    return target


@needs_compilable
def decodes_as_greedy_decoding(target, tiny, prompt_ids) -> None:
    """AR, PLD's chain and a tree whose accepted path must be moved in the cache, over ``target``: each decode is
    plain greedy decoding's."""
    decoder = Decoder(target, tiny.eos_token_ids, max_draft_tokens=7)
    pld = configured_drafter("pld", tiny)
    for ids in prompt_ids:
        expected = greedy_reference(tiny.weights.module, ids, 33)
        assert decoder.generate(ids, NoDraft(), 33).token_ids[:len(expected)] == expected
        assert decoder.generate(ids, pld, 33).token_ids[:len(expected)] == expected
        tree = Decoder(target, frozenset(), 7).generate(ids, TreeOracle(expected, 3), 33)  # keep() moves entries
        assert tree.token_ids == expected
        assert [s.accepted_tokens for s in tree.steps[1:]] == [4] * 8


def test_a_prepared_target_decodes_exactly_as_greedy_decoding_with_a_chain_and_a_tree(compiled, tiny, prompt_ids):
    decodes_as_greedy_decoding(compiled, tiny, prompt_ids)
    assert set(compiled.compile_seconds) == {"1", "2", "4", "8"}
    assert compiled.length == 0  # released after each decode


@needs_compilable
def test_after_prepare_a_pass_that_would_compile_is_one_line_never_an_eager_fallback(compiled, prompt_ids):
    ids = np.asarray(prompt_ids[0], dtype=np.int64)
    inputs = VerifyInputs(tokens=ids[:3], positions=np.arange(ids.size, ids.size + 3),
                          visible=np.tril(np.ones((3, 3), dtype=bool)), start=ids.size)
    with torch.inference_mode():
        compiled.start(ids.size + 8)
        compiled.prefill(ids, False, 2)
        compiled.request_hidden_states((1,))  # a shape the warm-up did not compile
        message = refusal(compiled.verify, inputs, 3, 2)
        compiled.request_hidden_states(())
    assert "was not compiled in the warm-up" in message
    # Outside inference mode dynamo's guards fail: the pass would compile again, which a compiled run refuses.
    compiled.start(ids.size + 8)
    with torch.no_grad():
        compiled.prefill(ids, False, 2)
        message = refusal(compiled.verify, inputs, 3, 2)
    compiled.release()
    assert "needed a new compile after the warm-up" in message and "never times a compile" in message


@needs_compilable
@pytest.mark.slow  # compiles two shapes twice
def test_a_sequence_longer_than_the_cache_grows_it_before_its_clock_starts(tiny, prompt_ids, caplog):
    target = CompiledTarget(aten_twin(tiny).weights.module, buckets=(1, 2), mode="default")
    ids = prompt_ids[1]
    expected = greedy_reference(tiny.weights.module, ids, 12)
    with torch.inference_mode():
        target.prepare(longest_sequence=20, largest_pass=2, hidden_layers=[()])
    small = target.capacity
    assert small == 256
    with caplog.at_level(logging.WARNING):
        tokens = Decoder(target, frozenset(), 1).generate(ids, NoDraft(), 300).token_ids  # ids + 300 > 256
    assert target.capacity == 512
    assert tokens[:12] == expected
    assert any("too small for a sequence" in line and "compile again (untimed)" in line
               for line in warnings_of(caplog))


@needs_compilable
def test_a_model_torch_compile_cannot_compile_is_one_line_naming_the_cause(monkeypatch):
    from specbench.testing import tiny_random

    model = tiny_random(linear_backend="aten")
    module = model.weights.module
    norm = module.model.norm
    original = norm.forward

    def with_a_graph_break(hidden):
        print(end="")  # a side effect dynamo cannot put in a graph
        return original(hidden)

    monkeypatch.setattr(norm, "forward", with_a_graph_break)
    target = CompiledTarget(module, buckets=(1,), mode="default")
    with torch.inference_mode(), pytest.raises(CompileFailed) as failure:
        target.prepare(longest_sequence=8, largest_pass=1, hidden_layers=[()])
    message = str(failure.value)
    assert "\n" not in message and "torch.compile cannot compile" in message
    assert "run.regime=eager runs it" in message and "Unsupported" in message


def test_the_compiled_target_refuses_what_it_cannot_run(tiny, monkeypatch):
    import transformers

    module = aten_twin(tiny).weights.module
    with monkeypatch.context() as patch:
        patch.setattr(transformers, "__version__", "5.23.0")
        assert "needs transformers 5.24 or later, not 5.23.0" in refusal(CompiledTarget, module)
    if not compilable_transformers():
        return  # the refusals below come after that one
    assert "oneDNN" in refusal(CompiledTarget, tiny.weights.module)  # tiny's default linear layers are oneDNN's
    assert "run.compile_buckets must be ascending" in refusal(CompiledTarget, module, buckets=(2, 4))
    assert "run.compile_mode='fast' is not known" in refusal(CompiledTarget, module, mode="fast")
    assert "larger than the largest compiled shape (8)" in refusal(bucket_for, 9, BUCKETS)


def test_the_static_cache_keeps_a_trees_path_in_place_and_attends_over_the_filled_prefix():
    cache = StaticTreeCache(num_layers=2, capacity=16, device=torch.device("cpu"))
    cache.allocate(kv_heads=1, head_dim=2, dtype=torch.float32, device=torch.device("cpu"))
    for layer in cache.layers:  # entry i holds i, keys and values alike
        layer.keys[0, 0, :, :] = torch.arange(16.0)[:, None]
        layer.values[0, 0, :, :] = torch.arange(16.0)[:, None]
    cache.set_length(10)  # a pass of 5 nodes was written at 5..9
    assert cache.length == 10 and cache.write_at.item() == 10
    cache.keep_nodes(5, [0, 2, 4])  # nodes 0, 2 and 4 (entries 5, 7, 9) move to 5, 6, 7
    assert cache.length == 8 and cache.write_at.item() == 8
    for layer in cache.layers:
        assert layer.keys[0, 0, :8, 0].tolist() == [0, 1, 2, 3, 4, 5, 7, 9]
        assert layer.values[0, 0, 5:8, 1].tolist() == [5, 7, 9]
    cache.keep_nodes(8, [0])  # a chain's accepted prefix is in place: nothing moves
    assert cache.length == 9
    cache.truncate(6)
    assert cache.length == 6 and cache.write_at.item() == 6
    columns = cache.attend(7)
    assert columns.tolist() == list(range(7)) and cache.layers[0].get_mask_sizes(1) == (7, 0)
    keys, _ = cache.layers[0].update(torch.full((1, 1, 1, 2), 99.0), torch.full((1, 1, 1, 2), 99.0))
    assert keys.shape[2] == 7 and keys[0, 0, 6, 0] == 99  # written at write_at, the attended prefix returned


def test_padding_to_a_bucket_leaves_the_real_nodes_as_they_were():
    visible = np.array([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=bool)  # a root with two children
    inputs = VerifyInputs(tokens=np.array([7, 8, 9]), positions=np.array([10, 11, 11]), visible=visible, start=10)
    tokens, positions, padded = padded_inputs(inputs, 4)
    assert tokens.tolist() == [7, 8, 9, 0] and positions.tolist() == [10, 11, 11, 11]
    assert (padded[:3, :3] == visible).all() and not padded[:3, 3].any()  # no real node sees the pad
    assert padded[3].tolist() == [False, False, False, True]  # the pad sees itself only
    assert [bucket_for(size, BUCKETS) for size in (1, 2, 3, 5, 8)] == [1, 2, 4, 8, 8]


# ---- the regime's settings, names and identity ---------------------------------------------------------------


def test_the_regime_settings_are_checked_in_one_line():
    def settings_refusal(**values):
        with pytest.raises(SpecbenchError) as error:
            RunSettings(**values).check()
        return str(error.value)

    assert settings_refusal(regime="jit") == "run.regime must be eager or compiled, got 'jit'"
    assert "run.compile_mode" in settings_refusal(compile_mode="fastest")
    assert "run.compile_buckets must be" in settings_refusal(compile_buckets=[4, 2])
    assert "add a bucket of at least 81" in settings_refusal(regime="compiled", compile_buckets=[1, 2, 4])
    assert "run.linear_backend=onednn cannot run under run.regime=compiled" in settings_refusal(
        regime="compiled", linear_backend="onednn")
    RunSettings(regime="compiled", compile_buckets=[1, 2, 4], max_draft_tokens=3).check()  # a short draft fits
    assert "which a CPU has not" in settings_refusal(regime="compiled", compile_mode="none", device="cpu")
    RunSettings(regime="compiled", compile_mode="none", device="cuda").check()  # CUDA graphs of the eager kernels
    # The buckets are checked in the eager regime too, so a sweep that switches regimes fails before its first job.
    assert "run.compile_buckets" in settings_refusal(compile_buckets=[])


def test_the_method_of_a_compiled_run_is_named_apart_and_auto_kernels_are_the_models_own():
    assert method_name("pld", regime="compiled") == "pld@compiled"
    assert method_name("hybrid", draft_budget="auto", regime="compiled") == "hybrid+budget@compiled"
    assert method_name("pld") == "pld"
    assert RunSettings(regime="compiled", max_draft_tokens=3).method_name("pld") == "pld@compiled"
    assert RunSettings(regime="compiled").resolved_linear_backend() == "aten"
    assert RunSettings().resolved_linear_backend() == "auto"


def test_the_loader_is_given_the_compiled_target_only_in_the_compiled_regime():
    node = {"name": "tiny-random", "target": dict(DEFAULT_NODE)}
    assert regime_target(node, "eager", [1, 2], "default") == {}
    assert regime_target(node, "compiled", [1, 2], "default") == {"target": {
        "_target_": COMPILED_TARGET, "_partial_": True, "buckets": [1, 2], "mode": "default"}}
    reference = {"name": "x", "target": {"_target_": "specbench.targets.reference.ReferenceTarget", "_partial_": True}}
    assert "choose one of the two" in refusal(regime_target, reference, "compiled", [1], "default")
    named = {"name": "x", "target": {"_target_": COMPILED_TARGET, "_partial_": True}}
    assert "chosen by run.regime=compiled" in refusal(regime_target, named, "eager", [1], "default")


def test_engine_vllm_refuses_the_compiled_regime():
    from test_vllm_methods import groups

    from specbench.engines.vllm_methods import check_vllm_config

    message = refusal(check_vllm_config, *groups("engine=vllm", "drafter=pld", "run.regime=compiled"))
    assert "run.regime=compiled" in message and "use run.regime=eager with engine=vllm" in message


def test_run_json_records_the_regime_only_off_eager_and_a_resume_in_another_regime_is_refused(tmp_path):
    from hydra import compose, initialize_config_dir

    from specbench.config import CONF_DIR
    from specbench.results.resumable import resume_refusal
    from specbench.run.identity import config_settings

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        eager = config_settings(compose("config", ["model=tiny-random"]), None)
        compiled = config_settings(compose("config", ["model=tiny-random", "run.regime=compiled"]), None)
    assert not {"regime", "compile_buckets", "compile_mode"} & set(eager["run"])  # as every earlier run.json
    assert compiled["run"]["regime"] == "compiled" and compiled["run"]["compile_buckets"][-1] == 128
    message = str(resume_refusal(tmp_path, compiled, eager))
    assert "run.regime: 'compiled' -> None" in message and "\n" not in message


COMPILED_RUN = ["model=tiny-random", "drafter=pld", "task.tasks=[qa]", "task.limit_per_task=2", "run.max_new_tokens=24",
                "run.regime=compiled", "run.max_draft_tokens=3", "run.compile_buckets=[1,2,4]",
                "run.compile_mode=default"]


@needs_compilable
@pytest.mark.slow  # compiles three shapes from a cold cache (about 30 s on 2 cores)
def test_a_compiled_run_is_paired_lossless_named_apart_and_not_resumed_eagerly(tmp_path):
    import json
    import subprocess
    import sys

    def cli(*overrides):
        return subprocess.run([sys.executable, "-m", "specbench", f"hydra.run.dir={tmp_path}", *overrides],
                              capture_output=True, text=True, timeout=600)

    result = cli(*COMPILED_RUN)
    assert result.returncode == 0, result.stderr
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["method"] == "pld@compiled" and "tiny-random / pld@compiled" in result.stdout
    assert summary["regime"]["name"] == "compiled" and summary["regime"]["buckets"] == [1, 2, 4]
    assert set(summary["regime"]["compile_s"]) == {"1", "2", "4"}
    assert summary["regime"]["eager_parts"] == ["prefill (its length differs per question)"]
    overall = summary["tasks"]["overall"]
    assert overall["identical_to_baseline"] == overall["questions"] == 2  # its AR decoded compiled too
    run = json.loads((tmp_path / "run.json").read_text())
    assert run["run"]["regime"] == "compiled"
    eager = cli(*[item for item in COMPILED_RUN if not item.startswith("run.regime")], "task.limit_per_task=3")
    assert eager.returncode == 2 and "run.regime: 'compiled' -> None" in eager.stderr
    assert len(eager.stderr.strip().splitlines()) == 1, eager.stderr


@needs_compilable
@pytest.mark.slow  # 2,000 sampled decodes per drafter, and the buckets a tree reaches compiled first
@pytest.mark.parametrize("name", ["pld", "recycling"])
def test_sampling_through_the_compiled_target_keeps_the_target_distribution(name):
    """The sampling check of tests/test_sampling.py (a chain and a static tree) over the compiled target."""
    from test_sampling import (JOINT_BOUND, MARGINAL_BOUND, PROMPT, SAMPLING, distributions, exact_distribution, make,
                               sample_sequences, total_variation, LENGTH)

    from specbench.config import compose
    from specbench.run.instantiate import build

    small = build(compose(["model=tiny-random", "model.alphabet=abcd", "model.initializer_range=0.1"]).model,
                  device="cpu", linear_backend="aten")
    target = CompiledTarget(small.weights.module, mode="default")
    target.start(512)
    prompt_ids = small.encode_conversation([PROMPT], [])
    exact_marginal, exact_joint = distributions(exact_distribution(small.weights.module, prompt_ids,
                                                                   small.tokenizer.eos_token_id, LENGTH))
    decoder = Decoder(target, small.eos_token_ids, 64, sampling=SAMPLING)
    empirical, drafted = sample_sequences(decoder, make(name, small), prompt_ids)
    marginal, joint = distributions(empirical)
    assert max(total_variation(m, e) for m, e in zip(marginal, exact_marginal)) < MARGINAL_BOUND
    assert total_variation(joint, exact_joint) < JOINT_BOUND
    assert drafted > 0


@needs_compilable
@pytest.mark.slow  # compiles three shapes from an empty cache twice, and runs once (about 90 s on 2 cores)
def test_prepare_compiles_ahead_what_the_run_reads_and_a_damaged_cache_is_set_aside_and_rebuilt(tmp_path):
    import json
    import os
    import subprocess
    import sys

    env = {name: value for name, value in os.environ.items() if name != "TORCHINDUCTOR_CACHE_DIR"}
    env["SPECBENCH_CACHE"] = str(tmp_path / "cache")
    overrides = [item for item in COMPILED_RUN if not item.startswith(("model=", "drafter="))]

    def prepare():
        return subprocess.run([sys.executable, "-m", "specbench.prepare", "--model", "tiny-random", "--drafters",
                               "pld,ar", *overrides], capture_output=True, text=True, timeout=600, env=env)

    built = prepare()
    assert built.returncode == 0, built.stderr
    assert "prepare: drafter=pld: 3 pass shape(s) ready in" in built.stdout and "(0 read from the cache, 3 compiled)" \
        in built.stdout
    assert "prepare: drafter=ar runs the shapes compiled for drafter=pld" in built.stdout  # AR's run: the same shapes
    inductor = tmp_path / "cache" / "compiled" / "inductor"
    assert f"[{inductor}]" in built.stdout
    run = subprocess.run([sys.executable, "-m", "specbench", f"hydra.run.dir={tmp_path / 'run'}", *COMPILED_RUN],
                         capture_output=True, text=True, timeout=600, env=env)
    assert run.returncode == 0, run.stderr
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["regime"]["from_cache"] == ["1", "2", "4"]
    for module in inductor.rglob("*.py"):  # a kernel module cut short: inductor imports it rather than rebuild it
        module.write_text("truncated(")
    rebuilt = prepare()
    assert rebuilt.returncode == 0, rebuilt.stderr
    assert "inductor failed over its cache" in rebuilt.stderr and "(0 read from the cache, 3 compiled)" in rebuilt.stdout
    assert (inductor.parent / "inductor.damaged").is_dir() and any(inductor.rglob("*.py"))


@needs_compilable
def test_a_failure_inside_inductor_sets_its_cache_aside_and_compiles_again_once(tiny, tmp_path, monkeypatch, caplog):
    from specbench.targets import compiled as compiled_module

    cache = tmp_path / "inductor"
    (cache / "ab").mkdir(parents=True)
    (cache / "ab" / "kernel.py").write_text("truncated(")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(cache))
    target = CompiledTarget(aten_twin(tiny).weights.module, buckets=(1,), mode="default")
    calls, resets = [], []
    failures = [CompileFailed("run.regime=compiled: torch.compile cannot compile it (BackendCompilerFailed: "
                              "SyntaxError)", in_backend=True, cause="BackendCompilerFailed: SyntaxError")]

    def compile_shapes(shapes, progress):
        calls.append(list(shapes))
        if failures:
            raise failures.pop(0)

    monkeypatch.setattr(target, "_compile_shapes", compile_shapes)
    monkeypatch.setattr(torch._dynamo, "reset", lambda: resets.append(True))
    with torch.inference_mode():
        target.prepare(longest_sequence=8, largest_pass=1, hidden_layers=[()])
    assert calls == [[(1, ())], [(1, ())]] and resets == [True]  # compiled again once, from a forgotten state
    assert not cache.exists() and (tmp_path / "inductor.damaged" / "ab" / "kernel.py").is_file()
    assert any("inductor failed over its cache (BackendCompilerFailed: SyntaxError)" in line and
               "set aside as" in line for line in warnings_of(caplog))
    # A failure again with an empty cache is the model's or the compiler's: one line saying the cache was not it.
    failures += [CompileFailed("cannot compile (BackendCompilerFailed: X)", in_backend=True, cause="X")] * 2
    target._frozen = False
    message = refusal(target._compile, [(1, ())], None)
    assert "also with an empty cache" in message and "inductor.damaged" in message
    # A failure dynamo reports before inductor runs (a graph break) says so at once, setting nothing aside.
    failures.append(CompileFailed("cannot compile (Unsupported: print)"))
    assert refusal(target._compile, [(1, ())], None) == "cannot compile (Unsupported: print)"
    assert len(resets) == 2


def test_a_gpu_runs_path_replaying_captured_passes_decodes_exactly_as_greedy_decoding(tiny, prompt_ids):
    """What a GPU run relies on, checked on the CPU: every bucket's pass captured once over its own input tensors
    (graphs.HostReplay keeps CUDA graphs' contract: inputs copied in, outputs overwritten by the next replay), over
    the whole cache's columns, decodes as plain greedy decoding with a chain and a tree, and a drafter's hidden
    states outlive the next replay."""
    from specbench.targets.graphs import HostReplay

    graphs = HostReplay()
    target = CompiledTarget(aten_twin(tiny).weights.module, buckets=BUCKETS, mode="none", graphs=graphs)
    with torch.inference_mode():
        target.prepare(longest_sequence=200, largest_pass=8, hidden_layers=[(), (1,)])
    assert graphs.captures == 8 and list(target.compile_seconds)[::2] == ["8", "4", "2", "1"]  # the largest first
    decodes_as_greedy_decoding(target, tiny, prompt_ids)
    ids = np.asarray(prompt_ids[0], dtype=np.int64)
    with torch.inference_mode():
        target.start(ids.size + 16)
        target.request_hidden_states((1,))
        target.prefill(ids, False, 2)
        first = VerifyInputs(tokens=ids[:3], positions=np.arange(ids.size, ids.size + 3),
                             visible=np.tril(np.ones((3, 3), dtype=bool)), start=ids.size)
        target.verify(first, 3, 2)
        kept = target._hidden
        copy = kept.clone()
        second = VerifyInputs(tokens=ids[3:7], positions=np.arange(ids.size + 3, ids.size + 7),
                              visible=np.tril(np.ones((4, 4), dtype=bool)), start=ids.size + 3)
        target.verify(second, 4, 2)  # the same graph replayed: the first pass's hidden states stay as they were
        assert torch.equal(kept, copy)
        target.request_hidden_states(())
    target.release()


def test_compile_mode_none_is_for_cuda_graphs_and_refused_on_a_cpu(tiny):
    message = refusal(CompiledTarget, aten_twin(tiny).weights.module, mode="none")
    assert message == ("run.compile_mode=none captures the eager kernels in CUDA graphs, which a CPU has not; on a "
                       "CPU choose default or max-autotune-no-cudagraphs")


@needs_compilable
def test_a_shape_with_hidden_states_compiles_on_a_model_that_never_ran_eagerly_with_them():
    """transformers (5.x) installs its hidden-state recording hooks under a lock on the first pass that asks for
    them, which dynamo cannot trace: prepare runs that pass eagerly first (an EAGLE-3 run failed without it)."""
    from specbench.testing import tiny_random

    target = CompiledTarget(tiny_random(linear_backend="aten").weights.module, buckets=(1,), mode="default")
    with torch.inference_mode():
        target.prepare(longest_sequence=8, largest_pass=1, hidden_layers=[(1, 2)])
    assert set(target.compile_seconds) == {"1 with the hidden states of layers 1,2"}
