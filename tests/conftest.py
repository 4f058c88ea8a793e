"""Shared fixtures over the test kit (specbench/testing.py: the tiny model, the greedy reference, the isolated
cache), and the helpers only pytest's tests use: a scripted drafter, one-line refusals, warnings, a fake nvidia-smi,
made-up answers."""

from __future__ import annotations

import atexit
import functools
import logging
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from specbench import testing
from specbench.decoding.contract import Draft, Drafter

# Databases built by tests go to a throw-away cache; converted model checkpoints are shared with the real cache, so
# the embedded model is converted once.
TEST_CACHE = testing.isolated_cache("specbench-test-cache-", share_models=True,
                                    on_made=lambda cache: atexit.register(shutil.rmtree, cache, ignore_errors=True))


@pytest.fixture(autouse=True)
def sigint_as_the_test_found_it():
    """Each test leaves Ctrl-C's handler as it found it. A script's main run in-process (runpy, as a test of its
    command line does) arms specbench's own handler (``specbench.interrupts``), which ends the process at once on
    SIGINT: a later test that sends itself a SIGINT then ended pytest (exit 130) in one order of the suite."""
    import signal

    handler = signal.getsignal(signal.SIGINT)
    yield
    if signal.getsignal(signal.SIGINT) is not handler:
        signal.signal(signal.SIGINT, handler)


@pytest.fixture(scope="session")
def tiny():
    """tiny-random exactly as ``model=tiny-random`` builds it."""
    return testing.tiny_random()


# Every Target implementation, by name: the lossless contract tests run over each (``each_target``).
# compiled: the compiled regime on a CPU; graphs: its GPU path (a graph captured per shape, the eager kernels in it),
# with graphs.HostReplay standing in for CUDA graphs
TARGET_KINDS = ("transformers", "reference", "compiled", "graphs")
def dense_state_dict(module):
    from specbench.targets.transformers import dense_state_dict as dense

    return dense(module)


def aten_twin(loaded):
    """``loaded`` (a tiny-random) built again with the model's own linear layers: the same seed, so the same
    weights (the compiled regime loads a model so; oneDNN's packed layers cannot be compiled)."""
    if loaded.weights.linear_backend_used == "aten":
        return loaded
    architecture = loaded.weights.architecture.get("model_type", "llama")
    twin = _aten_tiny(architecture)
    mine, theirs = (dense_state_dict(each.weights.module) for each in (loaded, twin))
    assert mine.keys() == theirs.keys() and all(torch.equal(mine[key], theirs[key]) for key in mine), \
        "tiny-random's aten twin has other weights"
    return twin


@functools.cache
def _aten_tiny(architecture: str):
    return testing.tiny_random(linear_backend="aten", architecture=architecture)


# The compiled target's cache in the contract tests: larger than any sequence they decode, so that it never grows
# (each growth compiles every shape again).
COMPILED_TEST_CAPACITY = 2048


SESSION_RECOMPILE_LIMIT = 1024


def target_of(kind: str, loaded):
    """A fresh Target of ``kind`` over ``loaded``'s transformers module (the reference one has no KV cache; the
    compiled one compiles each pass shape on its first use, in torch.compile's quicker default mode)."""
    from specbench.targets.compiled import CompiledTarget
    from specbench.targets.reference import ReferenceTarget
    from specbench.targets.transformers import TransformersTarget

    if kind in ("compiled", "graphs"):  # the same weights, the model's own linear layers, as run.regime=compiled loads
        from specbench.targets.compiled import FIRST_COMPILABLE, compilable_transformers

        from specbench.targets.graphs import HostReplay

        if not compilable_transformers():  # scripts/floor_env.sh: its refusal is tests/test_compiled_target.py's
            pytest.skip(f"the compiled target needs transformers {'.'.join(map(str, FIRST_COMPILABLE))} or later")
        module = aten_twin(loaded).weights.module
        # A test session compiles the passes of many models, drafters and buckets in one process, where a run compiles
        # one model's: the recompile limit the compiled regime sets for one model (64 per code object) is raised for
        # the session, so that what earlier tests compiled cannot make a later one fail (it did in the whole slow run
        # once longspec's trees came after every other drafter's on the Qwen models).
        import torch._dynamo.config as dynamo_config

        dynamo_config.recompile_limit = max(dynamo_config.recompile_limit, SESSION_RECOMPILE_LIMIT)
        target = (CompiledTarget(module, mode="default") if kind == "compiled" else
                  CompiledTarget(module, mode="none", graphs=HostReplay()))
        target.start(COMPILED_TEST_CAPACITY)
        return target
    return {"transformers": TransformersTarget, "reference": ReferenceTarget}[kind](loaded.weights.module)


# The reference Target runs the whole context again at every pass: over it, the default suite decodes every drafter
# at one length (64 tokens) and runs the short scripted contract tests; its variants of the long ones (the other
# lengths, EOS inside the output, shape padding, the other architectures) run with -m slow, as CI does.
REFERENCE_IN_THE_DEFAULT_SUITE = {"test_every_configured_drafter_matches_greedy_decoding": {"max_new_tokens": 64}}
LONG_OVER_THE_REFERENCE = {"test_every_configured_drafter_matches_greedy_decoding",
                           "test_eos_inside_the_output_ends_decoding_exactly_like_greedy",
                           "test_padding_verify_shapes_changes_nothing",
                           "test_every_configured_drafter_matches_greedy_decoding_on_the_other_architectures"}


def long_variant_over(item, kind: str) -> bool:
    """Whether ``item`` is a long contract test over the Target ``kind`` outside the set the reference Target runs
    in the default suite (REFERENCE_IN_THE_DEFAULT_SUITE)."""
    params = getattr(getattr(item, "callspec", None), "params", {})
    if item.originalname not in LONG_OVER_THE_REFERENCE or kind not in (params.get("each_target"), params.get("kind")):
        return False
    kept = REFERENCE_IN_THE_DEFAULT_SUITE.get(item.originalname)
    return kept is None or any(params.get(key) != value for key, value in kept.items())


def over_the_reference_only_with_slow(item) -> bool:
    """Whether ``item`` is a long contract test run over the reference Target outside the default suite's set."""
    return long_variant_over(item, "reference")


def over_the_compiled_target(item) -> bool:
    """Whether ``item`` runs over the compiled Target: the slow suite's (its shapes compile on first use, several
    seconds each; tests/test_compiled_target.py checks it in the default suite)."""
    params = getattr(getattr(item, "callspec", None), "params", {})
    return bool({"compiled", "graphs"} & {params.get("each_target"), params.get("kind")})


def long_over_the_graphs_stand_in(item) -> bool:
    """Whether ``item`` is a long contract test over the GPU path's CPU stand-in (``graphs``) beyond the set the
    reference Target runs in the default suite: left out, since that path's kernels are the transformers target's
    (which every variant checks) and what it adds, inputs copied into captured tensors and outputs overwritten by
    the next replay, every drafter at 64 tokens and every scripted contract test already exercise (the whole set
    took over 25 minutes on 2 cores)."""
    return long_variant_over(item, "graphs")


@pytest.hookimpl(tryfirst=True)  # before -m selects on the marks
def pytest_collection_modifyitems(config, items):
    left_out = [item for item in items if long_over_the_graphs_stand_in(item)]
    if left_out:
        config.hook.pytest_deselected(items=left_out)
        dropped = set(map(id, left_out))
        items[:] = [item for item in items if id(item) not in dropped]
    for item in items:
        if over_the_reference_only_with_slow(item) or over_the_compiled_target(item):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session", params=TARGET_KINDS)
def each_target(request, tiny):
    """tiny-random behind each Target implementation in turn."""
    return target_of(request.param, tiny)


@pytest.fixture(scope="session")
def prompt_ids(tiny):
    return testing.prompt_ids(tiny)


def first_draft(drafter, model, ids: list[int], capacity: int = 16):
    """(the draft ``drafter`` proposes after ``ids``, the transformers target it drafted on): the target prefilled with
    all but the last token, as the loop leaves it before a self-speculative drafter's first step."""
    import numpy as np

    target = target_of("transformers", model)
    drafter.decodes_with(target)
    ids = np.asarray(ids, dtype=np.int64)
    target.start(ids.size + capacity)
    target.prefill(ids[:-1], False, 2)
    drafter.begin(ids)
    return drafter.propose(ids), target


def refusal(call, *args, **kwargs) -> str:
    """The one-line SpecbenchError that ``call(*args, **kwargs)`` raises (a test fails on a second line)."""
    from specbench.errors import SpecbenchError

    with pytest.raises(SpecbenchError) as error:
        call(*args, **kwargs)
    return one_line(error)


def one_line(error_info) -> str:
    """The message of a caught error (``pytest.raises``'s info), which must be one line."""
    message = str(error_info.value)
    assert "\n" not in message, message
    return message


def warnings_of(caplog) -> list[str]:
    """The messages logged at WARNING or above."""
    return [record.getMessage() for record in caplog.records if record.levelno >= logging.WARNING]


def fake_nvidia_smi(directory: Path, listing: str, driver: str = "550.54.15") -> None:
    """An ``nvidia-smi`` in ``directory`` that answers ``-L`` with ``listing`` and the driver query with ``driver``."""
    directory.mkdir(parents=True, exist_ok=True)
    script = directory / "nvidia-smi"
    script.write_text("#!/bin/sh\n"
                      'case "$1" in\n'
                      f"  -L) printf '%s' '{listing}' ;;\n"
                      f"  --query-gpu=driver_version) echo '{driver}' ;;\n"
                      "  *) exit 9 ;;\n"
                      "esac\n")
    script.chmod(0o755)


class ScriptedDrafter(Drafter):
    """Test drafter that drafts from a known continuation of the prompt.

    mode "right": the next ``length`` tokens of ``continuation`` (always accepted);
    mode "wrong": those tokens shifted by one (never accepted);
    ``empty_every``: propose nothing on every n-th step.
    """

    def __init__(self, continuation, length, mode="right", empty_every=0, vocab_size=258):
        self.name = f"scripted-{mode}"
        self.continuation = list(continuation)
        self.length = length
        self.mode = mode
        self.empty_every = empty_every
        self.vocab_size = vocab_size
        self.prompt_length = 0
        self.calls = 0

    def begin(self, prompt_ids):
        self.prompt_length = prompt_ids.size
        self.calls = 0

    def propose(self, context_ids):
        self.calls += 1
        if self.empty_every and self.calls % self.empty_every == 0:
            return Draft.empty()
        done = context_ids.size - self.prompt_length
        tokens = np.array(self.continuation[done: done + self.length], dtype=np.int64)
        if self.mode == "wrong":
            tokens = (tokens + 1) % self.vocab_size
        return Draft.chain(tokens)


def answer(tokens=5, seconds=1.0, accepted=(1, 2, 2)):
    """A made-up Answer of ``tokens`` new tokens in ``seconds`` per turn (numbers: one turn; lists: one entry per
    turn), each turn's steps accepting ``accepted`` tokens (the first step: the prefill)."""
    from specbench.results.schema import Answer, StepRecord

    turns = zip(tokens, seconds) if isinstance(tokens, (list, tuple)) else [(tokens, seconds)]
    result = Answer()
    for turn_tokens, turn_seconds in turns:
        result.texts.append("x")
        result.token_ids.append(list(range(turn_tokens)))
        result.steps.append([StepRecord(i, n + 1, 1, n, 0.0, 0.01, 0.0, 10 + i, draft_depth=n + 1 if i else 0,
                                        candidate_tokens=n + 1 if i else 0)
                             for i, n in enumerate(accepted)])
        result.wall_times.append(turn_seconds)
    return result


# ``nvidia-smi -L``'s line for one H200.
H200 = "GPU 0: NVIDIA H200 (UUID: GPU-0f1e2d3c-0000-1111-2222-333344445555)\n"
