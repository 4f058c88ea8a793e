"""Pins of behaviours a line-by-line reading of the originals found under-tested (issue 20): each test works on a
hand-made case and fails when specbench's code reverts to what it did before.

Token Recycling's tree and first pass, its EOS rule for a bonus token, the warm-up that teaches a method with
cross-question state, PLD's and SpS's first draft from the prompt, HD's model-database prompt source, and
SAM-Decoding's prompt feeding and EOS handling."""

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from hydra.utils import instantiate
from test_recycling import FakeTarget
from test_samd import EOS, samd

from specbench.engines import warm_up as warm_ups
from specbench.config import compose
from specbench.questions import Prompt
from specbench.datastores import prompts as prompt_sets
from specbench.datastores.model_db import describe_source
from specbench.decoding.contract import Drafter, StepOutcome
from specbench.decoding.loop import Decoder
from specbench.distributed import Processes
from specbench.drafters.ar import NoDraft
from specbench.drafters.recycling import TEMPLATES, TokenRecycling
from specbench.settings import RunSettings

# The published trees written out level by level as digit strings (a node's sibling ranks from the root), in the
# order the originals list them: Spec-Bench model/recycling/tree_template_.py:3-11 ("2.2.2") and
# model/samd/config/token_recycle.json ("tree_adj", node ids 1-60) @fd2c1cd.
PUBLISHED_TREES = {
    "2.2.2": "0 1 2 3 4 5 6 7 | 00 01 02 03 04 05 06 07 10 11 12 13 20 21 22 30 31 40 50 60 70 | 000 001 002 003 004 "
             "005 006 007 010 011 012 020 021 030 040 050 060 070 100 101 110 200 300 400 500 | 0000 0001 0002 0003 "
             "0004 0010 0011 0020 0030 0040 0100 0200 1000 2000 3000 | 00000 00001 00002 00010 00020 00100 01000 10000"
             " | 000000 000001 000100",
    "samd": "0 1 2 3 4 5 6 | 00 01 02 03 04 05 10 11 12 13 14 20 21 22 30 31 40 41 50 60 | 000 001 002 010 011 020 021 "
            "030 040 100 101 102 110 111 120 130 200 210 300 400 500 | 0000 0001 0010 0100 1000 1001 1100 2000 | "
            "00000 00001 00100 10000",
}


@pytest.mark.parametrize("name", sorted(PUBLISHED_TREES))
def test_recycling_templates_are_the_published_trees_node_by_node(name):
    published = [tuple(int(digit) for digit in node) for node in PUBLISHED_TREES[name].replace("|", " ").split()]
    # Node order matters: it is the draft's numbering, so two swapped nodes are a different tree.
    assert TEMPLATES[name] == published


def recycling(**settings):
    drafter = TokenRecycling(template="2.2.2", **settings)
    drafter.prepare(FakeTarget())
    return drafter


def test_an_eos_bonus_token_still_teaches_the_pass_but_an_accepted_eos_does_not():
    # inference_recycling.py:128-135: the break on an EOS among the accepted tokens comes before the update, the
    # break on an EOS bonus token after it.
    for accepted_ids, accepted_nodes, teaches in (([5, 19], (0,), True), ([19], (0,), False)):
        drafter = recycling()
        drafter.begin(np.array([1, 2]))
        drafter.successors[2] = [5, 19, 1, 1, 1, 1, 1, 1]
        draft = drafter.propose(np.array([1, 2]))
        node = draft.token_ids.tolist().index(accepted_ids[0])
        top = np.full((81, 8), 6)
        drafter.accept(np.array(accepted_ids), StepOutcome(step=1, draft=draft, target_tokens=top[:, 0],
                                                           accepted_nodes=(node,), target_top_ids=top))
        assert (drafter.successors[2].tolist() == [6] * 8) is teaches, accepted_ids


def test_recyclings_first_pass_drafts_from_the_last_prompt_token_and_learns_81_rows(tiny, prompt_ids):
    # inference_recycling.py:24-34, 100-104, 131-132: the prefill reads the prompt but its last token and its
    # logits are dropped; the first pass verifies the last prompt token and 80 template nodes and learns 81 rows.
    drafter = instantiate(compose(["drafter=recycling", "model=tiny-random"]).drafter)
    drafter.prepare(tiny)
    learned = []
    original = drafter.learn
    drafter.learn = lambda tokens, top: learned.append((np.asarray(tokens).copy(), top.shape)) or original(tokens, top)
    ids = prompt_ids[0]
    generation = Decoder(tiny.target, frozenset(), 80).generate(ids, drafter, 8)
    prefill, first = generation.steps[:2]
    assert (prefill.verify_tokens, prefill.accepted_tokens) == (len(ids) - 1, 0)
    assert first.verify_tokens == 81 and first.context_len == len(ids)
    tokens, shape = learned[0]
    assert tokens[0] == ids[-1] and shape == (81, 8) and len(tokens) == 81


class ContextSpy(Drafter):
    """Records the contexts a wrapped drafter is asked to continue."""

    def __init__(self, inner):
        self.inner, self.contexts = inner, []
        self.name, self.first_draft_from_prompt = inner.name, inner.first_draft_from_prompt
        self.queues_device_work = inner.queues_device_work

    def begin(self, prompt_ids):
        self.inner.begin(prompt_ids)

    def propose(self, context_ids):
        self.contexts.append(context_ids.copy())
        return self.inner.propose(context_ids)

    def accept(self, accepted_ids, outcome):
        self.inner.accept(accepted_ids, outcome)


@pytest.mark.parametrize("name", ["pld", "sps"])
def test_pld_and_sps_draft_first_from_the_prompt_as_their_originals(name, tiny):
    # PLD (pld.py:86-110) and transformers' assisted decoding (utils.py:4336-4368 in 4.37.1) have no separate
    # prefill: the first draft continues the prompt itself.
    drafter = instantiate(compose([f"drafter={name}", "model=tiny-random"]).drafter)
    drafter.prepare(tiny)
    spy = ContextSpy(drafter)
    prompt = list(range(30, 50)) + [30, 31, 32]  # PLD finds "30 31 32" at the start: 33..42 follow it
    generation = Decoder(tiny.target, frozenset(), 80).generate(prompt, spy, 16)
    assert spy.contexts[0].tolist() == prompt
    assert generation.steps[0].accepted_tokens == 0
    if name == "pld":
        assert generation.steps[1].draft_tokens == 10


def test_a_method_with_cross_question_state_warms_up_as_spec_bench_does(tiny, monkeypatch, tmp_path):
    # evaluation/eval.py:90-116: three decodes of the first question, every turn, at the measured length, before
    # it is measured; a stateless method keeps the short timing warm-up.
    calls = []
    monkeypatch.setattr(warm_ups, "answer_question", lambda model, decoder, drafter, prompt, tokens, on_step=None:
                        calls.append(("answer", drafter.name, len(prompt.turns), tokens)))
    question = Prompt(question_id=81, category="writing", task="mt_bench", turns=("Write a poem.", "Shorter."))
    settings = RunSettings(max_new_tokens=48)

    def warm_up(drafter, teach_state=True):
        calls.clear()
        decoder = SimpleNamespace(generate=lambda ids, which, tokens: calls.append(("generate", which.name, tokens)))
        warm_ups.warm_up(settings, tiny, decoder, drafter, NoDraft(), [question], tmp_path, Processes(),
                        teach_state=teach_state)
        return list(calls)

    stateful = TokenRecycling()
    stateful.prepare(tiny)
    assert warm_up(stateful) == [("generate", "ar", 32)] + [("answer", "recycling", 2, 48)] * 3
    # A resumed run restores the saved state instead: its warm-up is for timing only.
    assert warm_up(stateful, teach_state=False) == [("generate", "recycling", 32), ("generate", "ar", 32)]
    stateless = instantiate(compose(["drafter=pld", "model=tiny-random"]).drafter)
    assert warm_up(stateless) == [("generate", "pld", 32), ("generate", "ar", 32)]
    settings = RunSettings(max_new_tokens=48, state_warmup_runs=1, state_warmup_turns="first",
                           state_warmup_max_new_tokens=8)
    assert warm_up(stateful) == [("generate", "ar", 32), ("answer", "recycling", 1, 8)]


def test_the_state_warm_up_defaults_are_spec_benchs():
    run = compose([]).run
    assert (run.state_warmup_runs, run.state_warmup_turns, run.state_warmup_max_new_tokens) == (3, "all", None)


def test_hds_model_database_prompt_source_is_named_and_oasst1_is_walked_as_hds_script(monkeypatch):
    build = compose(["drafter=hd"]).drafter.model_db_build
    # The default is specbench's built-in set (it runs offline), and the record says it is not HD's.
    assert build.prompts is None and build.source_rows is None
    built_in = describe_source({"prompts": str(prompt_sets.MODEL_DB_PROMPTS), "prompts_used": 96})
    assert "not HD's OASST1" in built_in["prompt_set"] and built_in["prompts_used"] == 96
    oasst = describe_source({"prompts": "hf:OpenAssistant/oasst1", "source_rows": 11})
    assert "first 11 rows" in oasst["prompt_set"]
    rows = [{"text": "Q?", "role": "prompter", "lang": "en"}, {"text": "A.", "role": "assistant", "lang": "en"}]
    monkeypatch.setattr(prompt_sets, "load_hub_rows", lambda name, split: iter(rows))
    assert prompt_sets.model_db_prompts("hf:OpenAssistant/oasst1") == ["Q?", "A."]  # construct_model_DB.py:61


@pytest.mark.slow  # moved behind slow to keep the default run under 8 minutes on 2 cores (CI runs it)
def test_a_runs_summary_names_the_prompts_of_hds_model_database(tmp_path):
    from test_cli import TINY, specbench

    run = tmp_path / "run"
    result = specbench(*TINY, "drafter=hd", "task.tasks=[qa]", "task.limit_per_task=1",
                       "drafter.model_db_build.max_prompts=2", "drafter.model_db_build.max_new_tokens=8",
                       f"hydra.run.dir={run}")
    assert result.returncode == 0, result.stderr
    import json

    summary = json.loads((run / "summary.json").read_text())
    source = summary["drafter_sources"]["model_db"]
    assert "specbench's built-in prompts" in source["prompt_set"] and source["prompts_used"] == 2


def test_samd_feeds_the_whole_prompt_to_its_automaton_and_its_auxiliary(tiny, prompt_ids):
    # samd_model.py:119-124: the prefill hands every prompt token to the automata (the first one included), and
    # the target's top-k at every prompt position to the auxiliary Token Recycling.
    drafter = samd(auxiliary="none")
    prompt = np.array([7, 1, 2, 3, 4, 5, 6, 8, 9, 10, 11], dtype=np.int64)  # 7 occurs first at position 0
    drafter.begin(prompt)
    draft = drafter.propose(np.concatenate([prompt, [7]]))
    assert draft.token_ids.tolist()[:3] == [1, 2, 3]
    with_auxiliary = instantiate(compose(["drafter=samd", "model=tiny-random", "drafter.corpus=null"]).drafter)
    with_auxiliary.prepare(tiny)
    ids = prompt_ids[0]
    Decoder(tiny.target, frozenset(), 80).generate(ids, with_auxiliary, 2)
    logits = tiny.weights.module(input_ids=__import__("torch").tensor([ids])).logits[0]
    rows = with_auxiliary.recycling.successors
    last_position = {token: position for position, token in enumerate(ids)}  # a repeated token keeps its last row
    for token, position in list(last_position.items())[:-1]:  # the last prompt token's row is relearned by step 1
        assert rows[token, 0] == int(logits[position].argmax()), token


def test_samd_keeps_learning_from_the_pass_that_accepts_an_eos():
    # samd_model.py:196-210, 259-261: the automata and the auxiliary are updated before the output is cut at EOS.
    drafter = samd()
    prompt = np.array([1, 2, 3, 4, 5, EOS, 7, 8, 9, 1, 2, 3, 4, 5], dtype=np.int64)
    drafter.begin(prompt)
    draft = drafter.propose(prompt)
    assert draft.token_ids[0] == EOS  # the context copies what followed 5: the EOS
    top = np.full((len(draft) + 1, 8), 7)
    top[:, 1] = 8
    drafter.accept(np.array([EOS]), StepOutcome(step=1, draft=draft, target_tokens=top[:, 0],
                                                accepted_nodes=(0,), target_top_ids=top))
    # The root's row and the EOS node's, learned although the pass accepted an EOS (Token Recycling's own loop
    # would skip them).
    assert drafter.recycling.successors[5].tolist() == top[0].tolist()
    assert drafter.recycling.successors[EOS].tolist() == top[1].tolist()


def spec_bench_tree_turn(appended: list[int], eos_step: int | None = None, max_new_tokens: int = 1024,
                         max_steps: int = 512) -> tuple[int, int]:
    """Medusa's and Hydra's turn in Spec-Bench, restated from evaluation/inference_medusa.py:61-98 and
    inference_hydra.py:60-95 @fd2c1cd (512 steps: their --max-steps default, :133-138 and :130-135): step ``idx``
    appends ``appended[idx]`` tokens, the tree's root and its accepted nodes (``new_token += accept_length + 1``,
    model/medusa/utils.py:399, model/hydra/utils.py:513), and only then does the loop stop, on an EOS among the
    appended tokens (step ``eos_step``) or ``new_token > max_new_tokens``. Returns (new tokens, steps)."""
    new_token = 0
    for idx in range(max_steps):
        new_token += appended[idx]
        if idx == eos_step:
            break
        if new_token > max_new_tokens:
            break
    return new_token, idx + 1


def test_medusa_and_hydra_turns_stop_as_spec_benchs_loop_stops():
    from specbench.drafters.hydra import TREES
    from specbench.drafters.medusa import CHOICE_TREES, ChoiceTree

    # A step appends at most the root and a whole path: the tree's depth + 1 (4 + 1 for mc_sim_7b_63, both methods).
    depth = ChoiceTree(CHOICE_TREES["mc_sim_7b_63"]).depth
    assert depth == max(len(path) for path in TREES["mc_sim_7b_63"]) == 4
    most = depth + 1
    # The worst case runs `most` tokens past the limit: 1,024 reached exactly, then a full step.
    assert spec_bench_tree_turn([4] * 256 + [most]) == (1024 + most, 257)
    assert spec_bench_tree_turn([most] * 300) == (1025, 205)  # a full path every step: 1 past
    # A turn accepting nothing ends at its 512th step with 512 tokens, where AR's answer has 1,024.
    assert spec_bench_tree_turn([1] * 1024) == (512, 512)
    # An EOS that is a step's bonus token is appended as the next step's root: one more pass than the step that
    # produced it (specbench's loop stops at that step).
    assert spec_bench_tree_turn([3] * 20, eos_step=7 + 1) == (27, 9)
    # docs/fidelity.md says so for both methods.
    text = (Path(__file__).parents[1] / "docs" / "fidelity.md").read_text(encoding="utf-8")
    medusa = text[text.index("## Medusa: `drafter=medusa`"):text.index("## SuffixDecoding")]
    hydra = text[text.index("## Hydra: `drafter=hydra`"):text.index("## Medusa: `drafter=medusa`")]
    assert f"(up to {most} tokens over" in medusa and "up to 4 tokens over" not in text
    assert f"a step appends up to {most} tokens" in medusa and "512 steps" in medusa
    stopping = next(line for line in hydra.splitlines() if line.startswith("| stopping |"))
    assert "512 steps" in stopping and f"the tree's depth + 1 = {most}" in stopping
    assert f"up to {most} tokens past 1,024" in stopping and "one more pass" in stopping
    assert f"at most {most} of the original's {1024 + most:,}" in " ".join(hydra.split())
