"""``engine=vllm`` without vLLM: the pure parts of ``specbench.engines.vllm`` and ``vllm_requests`` (a turn's steps
from vLLM's per-request counts, stop tokens, the device check, start failures, token digests, the top
log-probabilities), that neither module imports vLLM until an engine starts, the CLI's one-line refusals in an
environment without vLLM, and the contention meter counting an engine's child processes as the run's own."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from specbench.engines.vllm import check_device, start_failure, steps_from_counts, as_loop_tokens, verify_steps
from specbench.results.load import token_digest
from specbench.engines.vllm_methods import vllm_drafters
from specbench.engines.vllm_requests import top_arrays

from conftest import refusal

ROOT = Path(__file__).resolve().parent.parent


# --- a turn's steps from vLLM's counts --------------------------------------------------------------------------

def counts(drafted, accepted):
    """vLLM's per-request counts (``RequestSpecDecodeMetrics.to_dict()`` at the ``detailed`` level)."""
    return {"num_spec_steps": len(drafted), "num_draft_tokens": sum(drafted),
            "num_accepted_draft_tokens": sum(accepted), "num_spec_tokens": max(drafted, default=0),
            "per_step_drafted": list(drafted), "per_step_accepted": list(accepted)}


def as_tuples(steps):
    return [(step.step, step.draft_tokens, step.verify_tokens, step.accepted_tokens, step.context_len)
            for step in steps]


def test_steps_are_the_prefill_then_each_verify_step_then_the_undrafted_tokens():
    steps = steps_from_counts(prompt_length=4, tokens=10, spec=counts([3, 3, 3], [2, 0, 3]))
    # prefill: 1 token; verify steps: accepted + 1 each (3, 1, 4); one token decoded without a draft
    assert as_tuples(steps) == [(0, 0, 4, 1, 0), (1, 3, 4, 3, 5), (2, 3, 4, 1, 8), (3, 3, 4, 4, 9),
                                (4, 0, 1, 1, 13)]
    assert sum(step.accepted_tokens for step in steps) == 10
    assert [step.draft_depth for step in steps[1:4]] == [3, 3, 3]


def test_a_last_verify_step_that_overshoots_the_output_is_cut_to_what_was_kept():
    steps = steps_from_counts(4, 6, counts([3, 3, 3], [2, 0, 3]))  # the third step's 4 tokens: only 1 kept
    assert [step.accepted_tokens for step in steps] == [1, 3, 1, 1]
    steps = steps_from_counts(4, 4, counts([3, 3, 3], [2, 0, 3]))  # ended inside the first verify step
    assert [step.accepted_tokens for step in steps] == [1, 3]
    steps = steps_from_counts(4, 3, counts([5], [4]))
    assert [step.accepted_tokens for step in steps] == [1, 2] and steps[1].draft_tokens == 5


def test_steps_carry_no_times():
    for step in steps_from_counts(4, 10, counts([3, 3], [3, 1])):
        assert step.draft_s is None and step.verify_s is None and step.overhead_s is None


def test_without_speculation_every_step_decodes_one_token():
    for spec in (None, {"num_spec_steps": 0, "num_draft_tokens": 0, "num_accepted_draft_tokens": 0}):
        steps = steps_from_counts(7, 3, spec)
        assert as_tuples(steps) == [(0, 0, 7, 1, 0), (1, 0, 1, 1, 8), (2, 0, 1, 1, 9)]
    assert steps_from_counts(7, 0, counts([3], [3])) == []


def test_the_eos_token_that_ends_a_turn_is_kept_as_the_specbench_loop_keeps_it():
    from specbench.decoding.loop import cut_at_eos

    generated = [5, 6, 2, 9]
    loop_tokens, ended = cut_at_eos(generated, frozenset({2}))
    assert ended and as_loop_tokens([5, 6, 2]) == loop_tokens == [5, 6, 2]  # vLLM's output, stopped at EOS
    assert as_loop_tokens((5, 6)) == [5, 6] and all(type(token) is int for token in as_loop_tokens((5, 6)))


# --- refusals and advice ----------------------------------------------------------------------------------------

def test_a_device_the_vllm_build_cannot_honour_is_refused_in_one_line():
    line = refusal(check_device, "cuda", "cpu")
    assert "run.device=cuda" in line and "CPU build" in line and "SPECBENCH_VLLM=gpu" in line
    line = refusal(check_device, "cpu", "cuda")
    assert "run.device=cpu" in line and "SPECBENCH_VLLM=cpu" in line
    for device, platform in (("auto", "cpu"), ("auto", "cuda"), ("cpu", "cpu"), ("cuda", "cuda"), ("cuda:1", "cuda")):
        check_device(device, platform)


def test_a_model_target_other_than_the_transformers_one_is_refused_before_vllm_is_needed():
    """vLLM decodes with its own model: a Target the config names would be built, never run, and recorded."""
    from omegaconf import OmegaConf

    from specbench.config import compose
    from specbench.engines.vllm import VllmEngine, check_vllm_target

    check_vllm_target(None)
    check_vllm_target(compose(["model=tiny-random"]).model.target)  # what every model config names
    other = compose(["model=tiny-random", "model.target._target_=specbench.targets.reference.ReferenceTarget"])
    line = refusal(VllmEngine.load, None, other.model, other.drafter, None, None)
    assert line == ("model.target._target_=specbench.targets.reference.ReferenceTarget on engine=vllm: vLLM decodes "
                    "with its own model, never a specbench Target; leave model.target as the model config sets it, or "
                    "run engine=specbench")
    assert refusal(check_vllm_target, OmegaConf.create({"_target_": "specbench.targets.transformers.TransformersTarget",
                                                        "_partial_": True, "linear_backend": "x"}))


def test_a_start_that_runs_out_of_memory_gets_advice():
    line = start_failure("target /models/x", ValueError("No available memory for the cache blocks.\nTry again"))
    assert "\n" not in line and line.startswith("vLLM could not start for target /models/x")
    assert "engine.max_model_len" in line and "engine.cpu_kv_cache_gib" in line
    assert "engine.gpu_memory_utilization" in line
    assert "engine.max_model_len" in start_failure("x", RuntimeError("KV cache is too small"))


def test_another_start_failure_says_what_could_not_load():
    line = start_failure("pld's ngram checkpoint /d", OSError("config.json\nnot found"))
    assert line == "vLLM could not load pld's ngram checkpoint /d: OSError: config.json not found"
    long = start_failure("x", RuntimeError("y" * 1000))
    assert len(long) < 400 and long.endswith("...")
    assert start_failure("x", RuntimeError("")).endswith("RuntimeError: RuntimeError")


def test_token_digests_tell_outputs_apart():
    digest = token_digest([1, 2, 3])
    assert len(digest) == 16 and int(digest, 16) >= 0
    assert token_digest(np.array([1, 2, 3])) == digest
    assert token_digest([1, 2, 3]) == digest
    assert len({digest, token_digest([3, 2, 1]), token_digest([1, 2]), token_digest([12, 3]), token_digest([])}) == 5


# --- the top log-probabilities ----------------------------------------------------------------------------------

@dataclass
class FakeLogprob:
    """What vLLM's ``Logprob`` carries that top_arrays reads."""

    logprob: float
    rank: int | None


def test_top_arrays_rank_vllms_logprobs_and_pad():
    positions = [
        {7: FakeLogprob(-0.1, 1), 3: FakeLogprob(-2.5, 2), 9: FakeLogprob(-3.0, 3)},
        {4: FakeLogprob(-9.0, 40), 5: FakeLogprob(-0.2, 1), 6: FakeLogprob(-1.0, 2)},  # sampled 4, outside the top
        {8: FakeLogprob(-0.5, 1)},
        {1: FakeLogprob(-4.0, None), 2: FakeLogprob(-0.7, 1)},
    ]
    ids, values = top_arrays(positions, 2)
    assert ids.shape == values.shape == (4, 2) and ids.dtype == np.int64 and values.dtype == np.float32
    assert ids.tolist() == [[7, 3], [5, 6], [8, -1], [2, 1]]
    assert values[0].tolist() == pytest.approx([-0.1, -2.5])
    assert values[1].tolist() == pytest.approx([-0.2, -1.0])
    assert values[2, 0] == pytest.approx(-0.5) and values[2, 1] == -np.inf
    ids, values = top_arrays([], 3)
    assert ids.shape == (0, 3)


# --- vLLM is imported only when an engine starts ----------------------------------------------------------------

def test_the_vllm_modules_import_without_vllm():
    """Both modules import in an environment without vLLM and import no vLLM at module level (the runner imports
    specbench.engines.vllm for engine=vllm before it checks that vLLM is there, so as to say so in one line)."""
    code = ("import sys\n"
            "import specbench.engines.vllm_requests, specbench.engines.vllm, specbench.load_sweep\n"
            "from specbench.config import check_config, compose\n"
            "check_config(compose(['engine=vllm', 'model=tiny-random']))  # the engine's own check, by _target_\n"
            "loaded = sorted(name for name in sys.modules if name == 'vllm' or name.startswith('vllm.'))\n"
            "assert not loaded, loaded\n")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


# --- the CLI without vLLM ---------------------------------------------------------------------------------------

def specbench(*overrides: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "specbench", "model=tiny-random", "task.tasks=[qa]",
                           "task.limit_per_task=1", *overrides], cwd=ROOT, capture_output=True, text=True, timeout=300)


def error_line(result: subprocess.CompletedProcess) -> str:
    """The one error line a refused run prints (log lines aside), and no traceback."""
    assert "Traceback" not in result.stderr, result.stderr
    [line] = [line for line in result.stderr.splitlines() if line.startswith("specbench: error:")]
    return line


@pytest.mark.slow  # moved behind slow to keep the default run under 8 minutes on 2 cores (CI runs it)
def test_engine_vllm_without_vllm_is_one_line_naming_the_script_and_leaves_no_directory(tmp_path):
    import importlib.util

    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("this python has vLLM; the refusal is for one without")
    run = tmp_path / "runs" / "run"
    result = specbench("engine=vllm", "drafter=pld", f"hydra.run.dir={run}")
    assert result.returncode == 2, result.stderr
    line = error_line(result)
    assert "engine=vllm needs vLLM" in line and "scripts/vllm_env.sh" in line and sys.executable in line
    assert not (tmp_path / "runs").exists()  # refused after the directory was locked: what it made is removed

    run.mkdir(parents=True)  # a directory that was there stays, empty
    result = specbench("engine=vllm", "drafter=pld", f"hydra.run.dir={run}")
    assert result.returncode == 2 and list(run.iterdir()) == []


def test_a_drafter_vllm_lacks_is_one_line_naming_those_it_runs_before_vllm_is_needed(tmp_path):
    run = tmp_path / "runs" / "run"
    result = specbench("engine=vllm", "drafter=hd", f"hydra.run.dir={run}")
    assert result.returncode == 2, result.stderr
    line = error_line(result)
    assert "drafter=hd runs on engine=specbench only" in line
    assert f"engine=vllm runs drafter={', '.join(vllm_drafters())}" in line
    assert "vllm_env.sh" not in line  # refused by the configuration check, before vLLM is looked for
    assert not (tmp_path / "runs").exists()


# --- an engine's child processes are the run's own load ---------------------------------------------------------

def test_own_cpu_time_counts_a_live_child_process():
    from specbench.measure.machine import _own_cpu_s

    child = subprocess.Popen([sys.executable, "-c", "import sys, time\nend = time.process_time() + 1.2\n"
                              "while time.process_time() < end: pass\nprint('done', flush=True)\n"
                              "sys.stdin.read()"],  # stays alive until the test lets it go
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        before = _own_cpu_s()
        assert child.stdout.readline() == "done\n"  # 1.2 s of the child's CPU time spent
        during = _own_cpu_s()
        assert child.poll() is None
        assert during - before >= 0.5
    finally:
        child.stdin.close()
        child.wait(timeout=30)


def test_a_requests_verify_steps_are_vllms_counts_in_specbenchs_names():
    """Under load a request reaches the load sweep as a ServedRequest: per verify step its draft depth (vLLM's
    tokens proposed) and accept length (accepted + the bonus token); none without speculation."""
    assert verify_steps(counts([3, 3, 2], [2, 0, 2])) == ([3, 3, 2], [3, 1, 3])
    assert verify_steps(None) == (None, None)


# --- the turn loop both engines answer through ----------------------------------------------------------------

class WordModel:
    """A model for the turn loop alone: a user turn's words become ids 100, 101, ... (one per word, by turn),
    an answer's text its own ids back; the context is 12 tokens."""

    name, max_context, eos_token_ids = "words", 12, {2}

    def encode_conversation(self, turns, answers):
        ids = []
        for index, turn in enumerate(turns):
            ids += [100 + index] * len(turn.split())
            if index < len(answers):
                ids += [int(word) for word in answers[index].split()]
        return ids

    def decode(self, tokens):
        return " ".join(map(str, tokens))


class ScriptedServed:
    """vLLM's engine as ``VllmEngine.answer`` calls it: every request answers 7 8 9 (cut to its max_tokens) in two
    verify steps' counts, and is kept with its prompt, max_tokens and seed."""

    def __init__(self):
        self.requests = []

    def sampling_params(self, max_tokens, temperature, top_p, seed, stop_token_ids, top_k_logprobs):
        return {"max_tokens": max_tokens, "seed": seed}

    def complete(self, prompt_ids, params, timeout_s):
        from specbench.engines.vllm_requests import Completion

        self.requests.append((list(prompt_ids), params["max_tokens"], params["seed"]))
        tokens = [7, 8, 9][: params["max_tokens"]]
        return Completion(None, tokens, 0.1, 0.3, counts([2], [1]), None, "length"), 0.5


def test_vllm_answers_turn_by_turn_through_the_one_turn_loop():
    """A later turn's prompt holds the earlier answer, its length is cut to what the context leaves and its seed
    is the turn's own (conversation.converse, which the specbench loop answers through too); a turn that leaves no
    room is a skipped question, as in the specbench loop."""
    from specbench.engines.base import METHOD, SkipQuestion
    from specbench.engines.conversation import turn_seed
    from specbench.engines.vllm import VllmEngine
    from specbench.engines.vllm_methods import VllmSettings
    from specbench.questions import Prompt
    from specbench.settings import RunSettings

    served = ScriptedServed()
    engine = VllmEngine(WordModel(), "pld", RunSettings(max_new_tokens=4, seed=5), VllmSettings(), {METHOD: served},
                        {"dtype": "float32"}, {}, {}, greedy=True)
    shown = []
    answer = engine.answer(Prompt(question_id=9, category="qa", task="qa", turns=("a b", "c d e")), METHOD,
                           lambda tokens, seconds: shown.append((tokens, seconds)))
    assert served.requests == [([100, 100], 4, turn_seed(5, 9, 0)),  # 12 - 2 leaves 10: the run's 4
                               ([100, 100, 7, 8, 9, 101, 101, 101], 4, turn_seed(5, 9, 1))]  # the answer, then turn 2
    assert answer.texts == ["7 8 9", "7 8 9"] and answer.wall_times == [0.5, 0.5]
    assert [[step.accepted_tokens for step in turn] for turn in answer.steps] == [[1, 2], [1, 2]]
    assert shown == [(3, 0.5), (6, 1.0)]  # the question's tokens and seconds so far, after each turn

    served.requests.clear()
    answer = engine.answer(Prompt(question_id=9, category="qa", task="qa", turns=("a b c d e f g h i",)), METHOD)
    assert served.requests == [([100] * 9, 3, turn_seed(5, 9, 0))]  # 12 - 9 leaves 3 of the 4
    with pytest.raises(SkipQuestion, match="turn 2"):  # 9 + 3 + 2 = 14 prompt tokens: no room left in 12
        engine.answer(Prompt(question_id=9, category="qa", task="qa", turns=("a b c d e f g h i", "j k")), METHOD)


@pytest.mark.parametrize("paired, levels", [(False, [2]), (True, [1, 4]), (True, [])])
def test_the_vllm_engine_tells_the_runner_what_its_settings_ask_to_measure(paired, levels):
    """The runner reads Engine.paired and Engine.load_levels: engine.paired=false measures the load levels alone
    (tests/test_load_sweep.py's scripted engine sets both itself, so this pins that VllmEngine does)."""
    from specbench.engines.base import METHOD
    from specbench.engines.vllm import VllmEngine
    from specbench.engines.vllm_methods import VllmSettings
    from specbench.settings import RunSettings

    engine = VllmEngine(WordModel(), "pld", RunSettings(), VllmSettings(paired=paired, concurrency=levels),
                        {METHOD: ScriptedServed()}, {"dtype": "float32"}, {}, {}, greedy=True)
    assert engine.paired is paired and engine.load_levels == levels


# --- what vLLM loads of a drafter: the drafter contract ----------------------------------------------------------

def test_vllm_loads_what_the_drafter_contract_shares_and_frees_it_through_the_contract():
    """engines/vllm.py reads no drafter field: the head or draft comes from Drafter.shared_weights (of the kind the
    method loads), and the drafter's copy goes through Drafter.release_weights."""
    from specbench.decoding.contract import Draft, Drafter, SharedWeights
    from specbench.engines.vllm import release, shared_checkpoint

    class Sharing(Drafter):
        name = "sharing"

        def __init__(self, shared):
            self.kept_elsewhere, self.shared, self.released = "not a field vLLM knows", shared, 0

        def propose(self, context_ids):
            return Draft.empty()

        def shared_weights(self):
            return self.shared

        def release_weights(self):
            self.released += 1

    head = Sharing(SharedWeights("head", "/heads/e3"))
    assert shared_checkpoint(head, "eagle3") == shared_checkpoint(head, "eagle") == "/heads/e3"
    assert shared_checkpoint(head, "ngram") is None and shared_checkpoint(Sharing(None), None) is None
    assert shared_checkpoint(Sharing(SharedWeights("draft_model", "/drafts/d")), "draft_model") == "/drafts/d"
    for drafter, method in ((Sharing(None), "draft_model"), (head, "draft_model")):
        line = refusal(shared_checkpoint, drafter, method)
        assert line.startswith("drafter=sharing's draft_model checkpoint has no directory vLLM can read")

    model = type("Loaded", (), {"target": object(), "weights": object()})()
    release(model, head)
    assert head.released == 1 and model.target is None and model.weights is None


# --- time to first token: from the first output that carried a token ------------------------------------------

@dataclass
class FakePiece:
    """What vLLM's ``CompletionOutput`` carries that the client reads."""

    token_ids: list
    logprobs: list | None = None
    spec_decode_metrics: object = None
    finish_reason: str | None = None


@dataclass
class FakeOutput:
    outputs: list


def test_a_requests_first_token_time_is_its_first_tokens_arrival_and_its_last_the_last_ones():
    """vLLM streams a request as outputs that each carry the tokens new since the last (an output may carry none);
    the client times each that does from the request's submission. Outputs with tokens arrive at 10.25, 10.75 and
    11.5 s on a clock where it was submitted at 10.0 (one without a token between the first two): first token
    0.25 s, last 1.5 s."""
    import asyncio

    from specbench.engines.vllm_requests import StreamedRequest

    arrivals = iter([10.25, 10.75, 11.5])

    async def outputs():
        for piece in (FakePiece([5]), FakePiece([]), FakePiece([6, 7]), FakePiece([8], finish_reason="stop")):
            yield FakeOutput([piece])

    stream = StreamedRequest("q1", 10.0, clock=lambda: next(arrivals))
    asyncio.run(stream.consume(outputs()))
    completion = stream.completion(None)
    assert completion.first_token_s == 0.25 and completion.last_token_s == 1.5
    assert completion.token_ids == [5, 6, 7, 8] and completion.finish_reason == "stop" and completion.key == "q1"
    assert stream.times == [0.25, 0.75, 1.5]  # the output without a token is not a token's arrival
    assert completion.spec is None and completion.top is None


def test_under_load_a_levels_time_to_first_token_is_the_requests_first_token_times():
    """VllmEngine.serve hands each completion on as a ServedRequest with its first and last token times, and the
    level's ttft_s is their distribution: 0.25 and 0.75 s first tokens (mean 0.5), 1.0 and 2.0 s last ones."""
    from specbench.engines.base import BASELINE
    from specbench.engines.vllm import VllmEngine
    from specbench.engines.vllm_methods import VllmSettings
    from specbench.engines.vllm_requests import Completion
    from specbench.questions import Prompt
    from specbench.results.load import summarise_level
    from specbench.settings import RunSettings

    class Served(ScriptedServed):
        def serve(self, requests, concurrency, timeout_s):
            times = {1: (0.25, 1.0), 2: (0.75, 2.0)}
            return [Completion(key, [7, 8, 9], *times[key], None, None, "length") for key, _, _ in requests], 4.0

    engine = VllmEngine(WordModel(), "ar", RunSettings(max_new_tokens=3), VllmSettings(), {BASELINE: Served()},
                        {"dtype": "float32"}, {}, {}, greedy=True)
    prompts = [Prompt(question_id=q, category="qa", task="qa", turns=("a b",)) for q in (1, 2)]
    served, duration = engine.serve(prompts, BASELINE, 2)
    assert [(request.first_token_s, request.last_token_s) for request in served] == [(0.25, 1.0), (0.75, 2.0)]
    level = summarise_level(2, BASELINE, "ar@vllm", served, duration)
    assert level.ttft_s == {"mean": 0.5, "p50": 0.5, "p90": 0.7, "p99": 0.745}
    assert level.latency_s["mean"] == 1.5 and level.tpot_s["mean"] == 0.5  # (1.0-0.25)/2, (2.0-0.75)/2: 0.375, 0.625


# --- the heads vLLM runs are the heads the specbench loop runs, or the method is refused -------------------------

@pytest.fixture(scope="module")
def tiny_target():
    from specbench.models.tiny import build_tiny_random

    return build_tiny_random()


def saved_eagle_head(target, directory, kind: str, **overrides):
    """A randomly initialised head for ``target`` (its fc bias nn.Linear's default when it has one) in ``directory``."""
    import torch

    from specbench.heads.eagle_head_files import save_eagle_head
    from specbench.heads.eagle_heads import build_head, head_config_for

    torch.manual_seed(0)
    head = build_head(head_config_for(target, kind, **overrides), target.weights.module.get_output_embeddings(),
                      target.weights.module.get_input_embeddings().weight)
    save_eagle_head(head, directory, kind)
    return head


def test_an_eagle_head_whose_fc_has_a_bias_is_refused_as_vllm_would_drop_it(tiny_target, tmp_path):
    """The check reads the checkpoint vLLM would read: EAGLE-1's fc bias (EAGLE's default) refuses eagle/eagle2 in
    one line; a head without one (config.json "bias": false), or whose bias is zero, computes on vLLM what it
    computes in the specbench loop and runs; EAGLE-3's fc has none."""
    import torch

    from specbench.engines.vllm import check_head_loads_whole, largest_fc_bias
    from specbench.heads.eagle_head_files import save_eagle_head

    head = saved_eagle_head(tiny_target, tmp_path / "e1", "eagle")
    assert largest_fc_bias(str(tmp_path / "e1")) == float(head.fc.bias.detach().abs().max()) > 0
    line = refusal(check_head_loads_whole, "eagle2", "eagle", str(tmp_path / "e1"))
    assert line.startswith(f"drafter=eagle2 on engine=vllm: its head ({tmp_path / 'e1'}) has an fc layer with a bias")
    with torch.no_grad():
        head.fc.bias.zero_()
    save_eagle_head(head, tmp_path / "e1", "eagle")
    assert largest_fc_bias(str(tmp_path / "e1")) == 0.0
    check_head_loads_whole("eagle2", "eagle", str(tmp_path / "e1"))  # a zero bias is no bias: the same function

    saved_eagle_head(tiny_target, tmp_path / "e1-plain", "eagle", fc_bias=False)
    assert largest_fc_bias(str(tmp_path / "e1-plain")) is None
    check_head_loads_whole("eagle", "eagle", str(tmp_path / "e1-plain"))
    saved_eagle_head(tiny_target, tmp_path / "e3", "eagle3")
    check_head_loads_whole("eagle3", "eagle3", str(tmp_path / "e3"))


def test_a_head_specbench_would_train_for_vllm_is_refused_before_it_is_trained(tiny_target, tmp_path):
    """specbench trains EAGLE-1 heads with EAGLE's fc bias: drafter=eagle on engine=vllm refuses such a head before
    its training starts, not after; an EAGLE-3 head (no fc bias) is let through to be trained."""
    from omegaconf import OmegaConf

    from specbench.config import compose
    from specbench.engines.vllm import check_heads_to_train
    from specbench.run.instantiate import build

    def drafter(name):
        node = compose([f"drafter={name}", "model=tiny-random", f"drafter.cache_dir={tmp_path}"]).drafter
        return build(node), OmegaConf.to_container(node, resolve=True)

    eagle, _ = drafter("eagle2")
    line = refusal(check_heads_to_train, eagle, tiny_target, "eagle")
    assert line.startswith("drafter=eagle2 on engine=vllm: its head (trained for tiny-random in ")
    check_heads_to_train(drafter("eagle3")[0], tiny_target, "eagle3")
    assert list(tmp_path.iterdir()) == []  # nothing was trained


def vllm_medusa_logits(directory, hidden):
    """vLLM 0.32's Medusa (model_executor/models/medusa.py) over ``hidden``, restated on the file it reads: per
    head, ``num_hidden_layers`` blocks x + SiLU(Linear(x)) whose bias exists only when config.json sets
    medusa_fc_bias (a bias in the file is otherwise dropped), then the head's lm_head."""
    import torch
    from safetensors.torch import load_file

    config = json.loads((directory / "config.json").read_text())
    weights = load_file(str(directory / "model.safetensors"))
    logits = []
    for head in range(config["num_heads"]):
        x = hidden
        for block in range(config["num_hidden_layers"]):
            weight = weights[f"blocks.{head}.layers.{block}.weight"]
            bias = weights[f"blocks.{head}.layers.{block}.bias"] if config.get("medusa_fc_bias", False) else None
            x = x + torch.nn.functional.silu(torch.nn.functional.linear(x, weight, bias))
        logits.append(x @ weights[f"lm_heads.{head}.weight"].T)
    return torch.stack(logits)


def test_medusa_on_vllm_reads_the_very_heads_drafter_medusa_reads(tiny_target, tmp_path, monkeypatch):
    """The copy vLLM is given holds the first drafter.heads heads, their blocks' biases and the shape in its
    config: vLLM's Medusa computes from it what specbench's heads compute, head by head (vLLM drafts each head's
    best token, the chain along the tree's first path)."""
    import torch

    from specbench.engines.vllm import medusa_for_vllm
    from specbench.heads.medusa_heads import MedusaConfig, MedusaHeads, save_medusa_heads

    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "cache"))
    torch.manual_seed(3)
    config = MedusaConfig(5, 1, tiny_target.weights.hidden_size, tiny_target.vocab_size, "tiny-random")
    heads = MedusaHeads(config)
    with torch.no_grad():
        for parameter in heads.parameters():
            parameter.copy_(torch.randn_like(parameter) / 4)
    save_medusa_heads(heads, tmp_path / "medusa")

    copy = Path(medusa_for_vllm(tiny_target, str(tmp_path / "medusa"), 4))
    written = json.loads((copy / "config.json").read_text())
    assert {key: written[key] for key in ("model_type", "num_heads", "num_hidden_layers", "medusa_fc_bias")} == {
        "model_type": "medusa", "num_heads": 4, "num_hidden_layers": 1, "medusa_fc_bias": True}
    assert (written["hidden_size"], written["vocab_size"]) == (config.hidden_size, config.vocab_size)
    hidden = torch.randn(3, config.hidden_size)
    expected = heads.truncated(4)(hidden)
    assert torch.allclose(vllm_medusa_logits(copy, hidden), expected, atol=1e-5)
    assert medusa_for_vllm(tiny_target, str(tmp_path / "medusa"), 4) == str(copy)  # made once
    assert medusa_for_vllm(tiny_target, str(tmp_path / "medusa"), 3) != str(copy)  # other heads, another copy


# --- a Ctrl-C while vLLM starts an engine ---------------------------------------------------------------------------

def test_a_ctrl_c_that_vllm_swallows_while_an_engine_starts_still_interrupts_the_run():
    """vLLM 0.32 catches a KeyboardInterrupt raised around its engine's handshake and goes on: the engine it started
    is shut down and the interrupt raised again; a start without a Ctrl-C returns its engine, the handler as it was."""
    import os
    import signal
    import time

    from specbench.engines.vllm_requests import keeping_interrupts

    def swallowing_start():
        try:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1)
        except KeyboardInterrupt:
            pass  # vllm/utils/network_utils.py:471-472
        return "engine"

    undone = []
    # Python's own Ctrl-C handler, as a run has it: whatever an earlier test left (SIG_DFL would end pytest itself
    # at the kill above) is put back afterwards.
    handler = signal.default_int_handler
    earlier = signal.signal(signal.SIGINT, handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            keeping_interrupts(swallowing_start, undone.append)
        assert undone == ["engine"] and signal.getsignal(signal.SIGINT) is handler
        assert keeping_interrupts(lambda: "engine", undone.append) == "engine" and undone == ["engine"]
        assert signal.getsignal(signal.SIGINT) is handler
    finally:
        signal.signal(signal.SIGINT, earlier)
