"""SuffixDecoding: the drafts of its suffix trees on hand-made cases (each expected value worked out by hand
from the reference's rules, ArcticInference suffix_tree.cc), the per-request and global trees, eviction, the
state carried across questions and the warm-up that does not teach it.

Every guard of the matching code fails a case here or in test_drafter_guards.py when removed or flipped (checked by
doing so), but those whose removal changes no draft: the early return on an empty tree or a one-token pattern (the
loop then finds no match), speculate_path's fast path for one occurrence and _children's for one continuation (the
general code gives the same), the end of a path with no continuation (``break`` or ``return``), and a pattern one token longer than
``max_tree_depth`` (its longest match drafts nothing)."""

import json

import numpy as np
import pytest

from specbench.decoding.contract import Draft, StepOutcome
from specbench.drafters.suffix import (BOUNDARY, SuffixDecoding, TokenSequences, speculate, speculate_path,
                                       speculate_tree)
from specbench.errors import SpecbenchError

VLLM = dict(max_depth=24, max_spec_tokens=24, max_spec_factor=1.0, max_spec_offset=0.0, min_token_prob=0.1)


def tree_of(*sequences):
    tree = TokenSequences()
    for sequence in sequences:
        tree.start()
        tree.extend(sequence)
    return tree


def draft_of(context, *, sequences=None, **settings):
    context = np.array(context)
    return speculate(sequences or tree_of(context), context[-settings.get("max_depth", 24):], **{**VLLM, **settings})


def step(tokens):
    return StepOutcome(step=1, draft=Draft.empty(), target_tokens=np.array(tokens), accepted_nodes=())


def test_the_best_match_length_drafts_along_the_most_frequent_continuation():
    # "1 2" occurs 4 times (the context's own end included), followed 3 times by 3: 3 has probability 3/4;
    # "1 2 3" occurs 3 times, followed twice by 4: 3/4 * 2/3 = 1/2. m=1 may draft 1 token (score 3/4), m=2 two
    # (score 5/4); every longer tail occurs only at the end, where nothing follows (score 0).
    draft = draft_of([1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3, 5, 1, 2])
    assert draft.token_ids == [3, 4]
    assert draft.probs == pytest.approx([0.75, 0.5])
    assert draft.score == pytest.approx(1.25)
    assert draft.match_len == 2
    assert draft.parents == [-1, 0]


def test_a_probability_below_the_threshold_ends_the_draft_and_a_longer_match_wins_a_tie():
    draft = draft_of([1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3, 5, 1, 2], min_token_prob=0.6)
    # m=1 and m=2 both draft [3] (score 3/4; 4 at 1/2 is cut): the longer match wins.
    assert (draft.token_ids, draft.match_len) == ([3], 2)
    assert draft_of([1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3, 5, 1, 2], min_token_prob=0.5).token_ids == [3, 4]


def test_the_spec_factor_and_offset_scale_the_draft_with_the_match():
    context = [7, 8, 9, 10, 11, 12, 7, 8]  # "7 8" occurs once before the end: what followed is certain
    assert draft_of(context).token_ids == [9, 10]  # m=2: 2 tokens, each of probability 1/2 (2 occurrences)
    assert draft_of(context, max_spec_factor=2.0).token_ids == [9, 10, 11, 12]
    assert draft_of(context, max_spec_offset=1.0).token_ids == [9, 10, 11]
    assert draft_of(context, max_spec_factor=2.0, max_spec_tokens=3).token_ids == [9, 10, 11]
    assert draft_of(context, max_spec_factor=0.0).token_ids == []


def test_the_tree_depth_bounds_match_plus_draft():
    context = [1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 2]
    # Depth 24: m=7 ("1 2 3 4 5 1 2", twice with the end) drafts all that follows, 1/2 each.
    assert draft_of(context).token_ids == [3, 4, 5, 1, 2]
    # Depth 4: the tail matched is [4, 5, 1, 2], and m tokens leave 4 - m to draft: m=2 drafts 3 (2/3) and 4
    # ("1 2 3" always goes on to 4: 2/3), m=3 one token.
    assert draft_of(context, max_depth=4).token_ids == [3, 4]
    # Depth 3: one token at most.
    assert draft_of(context, max_depth=3).token_ids == [3]


def test_occurrences_never_span_two_sequences():
    # The previous response ends in "7 8" and the next one starts with "9": no "7 8 9" across the boundary.
    tree = tree_of([5, 7, 8], [9, 1])
    assert tree.tokens.tolist() == [5, 7, 8, BOUNDARY, 9, 1]
    assert draft_of([3, 7, 8], sequences=tree).token_ids == []
    assert draft_of([5, 7], sequences=tree).token_ids == [8]


def test_a_sequences_end_is_no_continuation_however_often_a_match_ends_there():
    # "1 2" ends two of three responses and goes on to 3 in the third: 3 is its only continuation, at 1/3 (the two
    # occurrences at a response's end count in the node's total, as the suffixes ending there do in the reference's
    # node counts, and continue to nothing). The boundary between responses counted as a token would be drafted
    # (-1, at 2/3).
    draft = draft_of([5, 1, 2], sequences=tree_of([1, 2], [1, 2], [1, 2, 3]))
    assert (draft.token_ids, draft.probs, draft.match_len) == ([3], [pytest.approx(1 / 3)], 2)


def test_the_matched_tail_is_shorter_than_the_pattern_as_the_references_is():
    # The reference matches m = 1 .. len(pattern) - 1 tokens (AI suffix_tree.cc:600-620): with a 2-token context only
    # "3" is matched, though "7 3" occurs too (always followed by 5): 5 at 2/3 from the three occurrences of "3", not
    # at 1 from the two of "7 3".
    draft = draft_of([7, 3], sequences=tree_of([9, 3, 4], [7, 3, 5], [7, 3, 5]))
    assert (draft.token_ids, draft.probs, draft.match_len) == ([5], [pytest.approx(2 / 3)], 1)


def test_the_drafter_matches_the_contexts_last_max_tree_depth_tokens():
    # Depth 4: the pattern is the last 4 tokens, so matches of up to 3. "1 2 3" (3 tokens, twice followed by 4: 2/3)
    # may draft 4 - 3 = 1 token and beats "2 3" (4 at 2/5, then 1 at 1/5: 0.6); matched one token shorter, the
    # drafter would draft [4, 1].
    context = np.array([1, 2, 3, 4, 1, 2, 3, 4, 9, 2, 3, 5, 9, 2, 3, 6, 1, 2, 3])
    drafter = SuffixDecoding(max_tree_depth=4, max_cached_requests=0)
    drafter.begin(context)
    assert drafter.propose(context).token_ids.tolist() == [4]


def test_a_tail_that_never_occurred_is_no_match():
    # The search stops at the first match length that does not occur: nothing drafted, from no match (0), rather
    # than empty drafts of the longer lengths.
    draft = draft_of([4, 5, 6], sequences=tree_of([1, 2, 3]))
    assert (draft.token_ids, draft.score, draft.match_len) == ([], 0.0, 0)
    draft = draft_of([9, 1, 2], sequences=tree_of([1, 2, 3, 1, 2, 4]))  # "1 2" matches, "9 1 2" does not
    assert (draft.token_ids, draft.match_len) == ([3, 1], 2)  # 3 first seen (1/2), then what followed it


def test_ties_between_continuations_follow_the_references_sibling_order():
    # After "1 2 3", 5 then 4 follow once each: count-1 children keep the order they appeared in, so 5.
    once = np.array([1, 2, 3, 5, 1, 2, 3, 4])
    assert speculate_path(once, np.array([2, 6]), 1, 0.1).token_ids == [5]
    # Twice each, 4 reaching 2 last: a child that reaches a count goes before those that had it, so 4.
    twice = np.array([1, 2, 3, 5, 1, 2, 3, 4, 1, 2, 3, 5, 1, 2, 3, 4])
    draft = speculate_path(twice, np.array([2, 6, 10, 14]), 1, 0.1)
    assert (draft.token_ids, draft.probs) == ([4], [0.5])


def test_a_tree_draft_opens_the_most_probable_node_first():
    # After 9: 1 three times (1/2), 2 twice (1/3), and the context's own end; after "9 1": 5, 6, 7 (1/6 each);
    # after "9 2": 8 both times (1/3). Three tokens: 1, 2, then 8 under 2.
    sequence = np.array([9, 1, 5, 9, 1, 6, 9, 1, 7, 9, 2, 8, 9, 2, 8, 9])
    draft = speculate_tree(sequence, np.flatnonzero(sequence == 9), 3, 0.1)
    assert draft.token_ids == [1, 2, 8]
    assert draft.parents == [-1, -1, 1]
    assert draft.probs == pytest.approx([1 / 2, 1 / 3, 1 / 3])
    # min_token_prob 0.4: only 1 is drafted, and nothing under it (1/6 each).
    assert speculate_tree(sequence, np.flatnonzero(sequence == 9), 3, 0.4).token_ids == [1]
    # A child exactly at min_token_prob is opened (the reference keeps probabilities >= it, suffix_tree.cc:874-900;
    # 2/6 and 1/3 are the same float32)
    assert speculate_tree(sequence, np.flatnonzero(sequence == 9), 3, 1 / 3).token_ids == [1, 2, 8]
    # Where the suffix tree ends one token below the match, a tree draft stays that shallow however wide.
    shallow = speculate_tree(sequence, np.flatnonzero(sequence == 9), 5, 0.1, max_depth=1)
    assert (shallow.token_ids, shallow.parents) == ([1, 2], [-1, -1])
    # As a path draft it is one token; the tree draws on the same depth, wider.
    context = np.array([5, 1, 5, 2, 5, 1, 5])
    assert draft_of(context, max_depth=2, max_spec_factor=4.0).token_ids == [1]
    assert draft_of(context, max_depth=2, max_spec_factor=4.0, tree=True).token_ids == [1, 2]


def test_the_global_tree_drafts_from_previous_responses_and_only_when_it_scores_higher():
    drafter = SuffixDecoding()
    drafter.begin(np.array([1, 2, 3]))
    drafter.accept(np.array([7, 8, 9, 10, 11]), step([7]))
    drafter.begin(np.array([5, 6, 7, 8]))  # the first response is now a cached one
    draft = drafter.propose(np.array([5, 6, 7, 8]))
    # The prompt's own tree has "8" only at its end; the responses have "7 8" once: 9 10 with probability 1.
    assert draft.token_ids.tolist() == [9, 10]
    assert draft.sources == ("responses",) * 2
    # With the global tree off, nothing matches.
    alone = SuffixDecoding(max_cached_requests=0)
    alone.begin(np.array([1, 2, 3]))
    alone.accept(np.array([7, 8, 9, 10, 11]), step([7]))
    alone.begin(np.array([5, 6, 7, 8]))
    assert len(alone.propose(np.array([5, 6, 7, 8]))) == 0
    assert alone.state() is None


def test_the_request_tree_wins_a_tie_with_the_global_tree():
    drafter = SuffixDecoding()
    drafter.begin(np.array([4, 5, 6, 4, 5]))
    drafter.accept(np.array([4, 5, 6]), step([4]))
    drafter.begin(np.array([4, 5, 6, 4, 5]))
    # The request's tree: "4 5" twice (once at its end), then 6 4 at 1/2 each: score 1. The responses' tree:
    # "4 5" once, then 6 and the response's end: score 1. The request's draft is kept.
    draft = drafter.propose(np.array([4, 5, 6, 4, 5]))
    assert draft.token_ids.tolist() == [6, 4]
    assert draft.sources == ("request",) * 2


def test_the_current_response_is_in_the_global_tree_as_it_grows():
    drafter = SuffixDecoding()
    drafter.begin(np.array([1]))
    drafter.accept(np.array([2, 3, 4, 2, 3]), step([2]))
    assert drafter.global_tree.tokens.tolist() == [2, 3, 4, 2, 3]
    assert drafter.local.tokens.tolist() == [1, 2, 3, 4, 2, 3]


def test_the_oldest_responses_are_evicted_keeping_a_slot_for_the_new_request():
    drafter = SuffixDecoding(max_cached_requests=2)
    for prompt, response in (([1], [10, 11]), ([2], [20, 21]), ([3], [30, 31])):
        drafter.begin(np.array(prompt))
        drafter.accept(np.array(response), step(response[:1]))
    # Two requests at most, the open one included: [20, 21] was evicted when [30, 31]'s request began.
    assert [response.tolist() for response in drafter.responses] == [[20, 21]]
    assert drafter.global_tree.tokens.tolist() == [20, 21, BOUNDARY, 30, 31]
    drafter.begin(np.array([4]))
    assert drafter.global_tree.tokens.tolist() == [30, 31, BOUNDARY]


def test_state_round_trips_and_a_torn_state_is_refused():
    drafter = SuffixDecoding()
    for prompt, response in (([1], [10, 11, 12]), ([2], [20])):
        drafter.begin(np.array(prompt))
        drafter.accept(np.array(response), step(response[:1]))
    state = drafter.state()
    assert state["response_lengths"].tolist() == [3, 1]
    other = SuffixDecoding()
    other.restore({key: value.copy() for key, value in state.items()})
    assert other.global_tree.tokens.tolist() == [10, 11, 12, BOUNDARY, 20]
    other.begin(np.array([5]))
    drafter.begin(np.array([5]))
    assert other.global_tree.tokens.tolist() == drafter.global_tree.tokens.tolist()
    with pytest.raises(SpecbenchError, match="do not add up"):
        other.restore({"response_tokens": np.arange(3), "response_lengths": np.array([2, 2])})


@pytest.mark.parametrize("override, message", [
    ({"max_tree_depth": 0}, "drafter.max_tree_depth must be a positive integer"),
    ({"max_cached_requests": -1}, "drafter.max_cached_requests must be a non-negative integer"),
    ({"max_spec_factor": -1.0}, r"drafter.max_spec_factor must be a number in \[0, 24\]"),
    ({"min_token_prob": 1.5}, r"drafter.min_token_prob must be a number in \[0, 1\]"),
    ({"tree_spec": "yes"}, "drafter.tree_spec must be true or false"),
])
def test_bad_settings_name_the_key(override, message):
    with pytest.raises(SpecbenchError, match=message):
        SuffixDecoding(**override)


def test_the_warm_up_decodes_with_the_global_tree_and_puts_it_back_empty(tiny, monkeypatch, tmp_path):
    # The slow CLI test below, in the default suite with values: drafter=suffix's config does not let the warm-up
    # teach; the warm-up's decode of the first question fills the global tree while it runs, and the tree is put
    # back as it was (empty), so the first measured question meets none of the warm-up's answer.
    from hydra.utils import instantiate

    from specbench.config import compose
    from specbench.decoding.loop import Decoder
    from specbench.distributed import Processes
    from specbench.drafters.ar import NoDraft
    from specbench.engines import warm_up as warm_ups
    from specbench.questions import Prompt
    from specbench.settings import RunSettings

    monkeypatch.setattr(warm_ups, "calibrate_run", lambda *args, **kwargs: None)  # timing only, not the tree
    drafter = instantiate(compose(["drafter=suffix", "model=tiny-random"]).drafter)
    assert drafter.warm_up_teaches is False
    drafter.prepare(tiny)
    decoder = Decoder(tiny.target, frozenset(), 64)
    generate, seen = decoder.generate, []

    def recording(ids, which, tokens):
        generation = generate(ids, which, tokens)
        if which is drafter:
            seen.append((list(drafter.global_tree.lengths), len(generation.token_ids)))
        return generation

    monkeypatch.setattr(decoder, "generate", recording)
    question = Prompt(question_id=1, category="qa", task="qa", turns=("Name three colours.",))
    warm_ups.warm_up(RunSettings(max_new_tokens=16), tiny, decoder, drafter, NoDraft(), [question], tmp_path,
                     Processes())
    assert len(seen) == 1 and seen[0][1] > 0 and seen[0][0] == [seen[0][1]]  # it held the warm-up's answer
    state = drafter.state()
    assert (state["response_lengths"].tolist(), state["response_tokens"].tolist()) == ([], [])
    # the first measured question: the global tree holds its own answer alone
    ids = warm_ups.first_turn_ids(tiny, question)
    answer = generate(ids, drafter, 16).token_ids
    assert drafter.state()["response_lengths"].tolist() == [len(answer)]
    assert drafter.state()["response_tokens"].tolist() == list(answer)


@pytest.mark.slow  # moved behind slow to keep the default run under 8 minutes on 2 cores (CI runs it)
def test_the_warm_up_leaves_the_global_tree_empty(tmp_path):
    from test_cli import TINY, specbench

    run = tmp_path / "run"
    assert specbench(*TINY, "drafter=suffix", "task.tasks=[qa]", "task.limit_per_task=2",
                     f"hydra.run.dir={run}").returncode == 0
    # The global tree holds exactly the measured answers, in order: none of the warm-up's.
    answers = [json.loads(line) for line in (run / "answers.jsonl").open()]
    with np.load(run / "drafter_state.npz") as saved:
        lengths = saved["response_lengths"].tolist()
    assert lengths == [count for answer in answers for count in answer["choices"][0]["new_tokens"]]


@pytest.mark.slow
def test_a_resumed_run_continues_the_global_tree(tmp_path):
    from test_cli import assert_a_resumed_run_continues_the_state

    assert_a_resumed_run_continues_the_state(tmp_path, "suffix", "response_tokens")
