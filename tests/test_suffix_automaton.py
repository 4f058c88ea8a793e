"""Suffix automata of SAM-Decoding (specbench/datastores/suffix_automaton.py) against brute force on small
random texts, against each other, and on hand-made examples whose expected drafts are worked out below."""

from __future__ import annotations

import heapq
import random

import numpy as np
import pytest

from specbench.datastores import suffix_automaton as sa
from specbench.datastores.suffix_automaton import DynamicSuffixAutomaton, StaticSuffixAutomaton
from specbench.errors import SpecbenchError


def random_text(rng: random.Random, vocab: int, length: int) -> list[int]:
    return [rng.randrange(vocab) for _ in range(length)]


def as_bytes(tokens) -> bytes:
    return bytes(int(t) for t in tokens)  # token ids < 256: substring search in C


def longest_suffix_in(query: list[int], text: list[int]) -> tuple[int, int]:
    """(l, earliest 1-based end position in ``text``) of the longest suffix of ``query`` that is a substring
    of ``text``; (0, 0) when none (the empty one)."""
    haystack, best = as_bytes(text), (0, 0)
    for l in range(1, len(query) + 1):
        at = haystack.find(as_bytes(query[len(query) - l :]))
        if at < 0:
            break
        best = (l, at + l)
    return best


def occurrences(pattern: list[int], text: list[int]) -> int:
    return sum(text[i : i + len(pattern)] == pattern for i in range(len(text) - len(pattern) + 1))


def naive_walk_counts(text: list[int]) -> list[int]:
    """End-position counts the way the reference keeps them: a clone starts with the count of the state it
    copies, and every new token adds 1 to each state on the suffix-link path from its state to the root
    (root excluded)."""
    sam, counts = DynamicSuffixAutomaton(), [0]
    for token in text:
        before = len(sam.link)
        sam.add_tokens([token])
        cur = before
        counts.append(0)
        if len(sam.link) == before + 2:  # a clone was made: it copied the state now linked to it
            clone = before + 1
            source = next(v for v in range(1, before) if sam.link[v] == clone)
            counts.append(counts[source])
        v = cur
        while v != 0:
            counts[v] += 1
            v = sam.link[v]
    return counts


def corpus_text(documents: list[list[int]], eos: int) -> list[int]:
    text = []
    for document in documents:
        text += document + ([] if document[-1] == eos else [eos])
    return text


# ---- both automata against brute force ------------------------------------------------------------------


def test_dynamic_cursor_and_lookups_match_brute_force():
    """After each token the cursor's length is that of the longest suffix of text[:i] occurring in
    text[:i-1] (the cursor moves before the automaton grows); lookup(t) gives the longest suffix of
    text + [t] occurring in text, and its state's min_endpos is that suffix's earliest end (1-based)."""
    for seed in range(25):
        rng = random.Random(seed)
        vocab = rng.randint(3, 5)
        text = random_text(rng, vocab, rng.randint(1, 200))
        sam = DynamicSuffixAutomaton()
        for i in range(1, len(text) + 1):
            sam.add_tokens(text[i - 1 : i])
            length, end = longest_suffix_in(text[:i], text[: i - 1])
            assert sam.cursor_length == length
            assert sam.min_endpos[sam.cursor_state] == end
            for token in range(vocab + 1):
                state, match = sam.lookup(token)
                assert (match, sam.min_endpos[state]) == longest_suffix_in(text[:i] + [token], text[:i])
                assert (state == 0) == (match == 0)
        assert sam.text == [-1] + text


def test_static_cursor_and_lookups_match_brute_force():
    """Over a corpus (documents + eos): transfer_tokens follows the longest suffix of the query that occurs
    in the corpus, lookup extends it by one token, min_endpos is the earliest end; reset() restarts."""
    for seed in range(20):
        rng = random.Random(seed)
        vocab = rng.randint(3, 5)
        documents = [random_text(rng, vocab, rng.randint(1, 60)) for _ in range(rng.randint(1, 4))]
        text = corpus_text(documents, eos=0)
        sam = StaticSuffixAutomaton.build(documents, eos_token=0, progress=False)
        assert sam.tokens.tolist() == [-1] + text
        for _ in range(3):
            sam.reset()
            query = random_text(rng, vocab + 1, rng.randint(0, 40))
            for i in range(len(query) + 1):
                if i:
                    sam.transfer_tokens(query[i - 1 : i])
                assert sam.cursor_length == longest_suffix_in(query[:i], text)[0]
                for token in range(vocab + 1):
                    state, match = sam.lookup(token)
                    assert (match, int(sam.min_endpos[state])) == longest_suffix_in(query[:i] + [token], text)
            sam.reset()
            sam.transfer_tokens(query)  # many tokens in one call
            assert sam.cursor_length == longest_suffix_in(query, text)[0]


def test_static_and_dynamic_automata_are_the_same_automaton():
    """On one text (ending with eos, so the static build adds nothing) both constructions give the same
    states, transitions in the same (insertion) order, the same cursor after construction, lookups and
    unshortened drafts."""
    for seed in range(25):
        rng = random.Random(seed)
        vocab = rng.randint(3, 5)
        text = random_text(rng, vocab, rng.randint(1, 200)) + [vocab]
        dynamic = DynamicSuffixAutomaton()
        dynamic.add_tokens(text)
        static = StaticSuffixAutomaton.build([np.array(text)], eos_token=vocab, progress=False)
        assert static.link.tolist() == dynamic.link
        assert static.length.tolist() == dynamic.length
        assert static.min_endpos.tolist() == dynamic.min_endpos
        assert [static.transitions(v) for v in range(static.num_states)] == [list(d.items()) for d in dynamic.next]
        assert (static.cursor_state, static.cursor_length) == (dynamic.cursor_state, dynamic.cursor_length)
        for token in range(vocab + 2):
            state, match = static.lookup(token)
            assert (state, match) == dynamic.lookup(token)
            n_predicts, end = rng.randint(1, 12), dynamic.min_endpos[state]
            expected = [token] + text[end : end + n_predicts - 1] + [0] * n_predicts  # text is 0-based here
            assert static.draft(state, token, n_predicts) == expected[:n_predicts]


def test_hash_table_growth_changes_nothing(monkeypatch):
    """A table started far too small grows (rehashing) several times during the build; the automaton is
    the same as one built without growing."""
    rng = random.Random(7)
    documents = [random_text(rng, 40, rng.randint(50, 400)) for _ in range(10)]
    reference = StaticSuffixAutomaton.build(documents, eos_token=0, progress=False)
    monkeypatch.setattr(sa, "_TRANSITIONS_PER_TOKEN", 0.001)
    monkeypatch.setattr(sa, "_MIN_HASH_SLOTS", 16)
    grown = StaticSuffixAutomaton.build(documents, eos_token=0, progress=False)
    assert grown.hash_keys.size > 16 * 1.5**4 and grown.hash_keys.size != reference.hash_keys.size
    for name in ("link", "length", "min_endpos", "count", "first_edge", "edge_token", "edge_next"):
        assert np.array_equal(getattr(grown, name), getattr(reference, name)), name
    assert [grown.transitions(v) for v in range(grown.num_states)] == [
        reference.transitions(v) for v in range(reference.num_states)]


def test_documents_get_eos_unless_they_end_with_it_and_empty_ones_are_skipped():
    sam = StaticSuffixAutomaton.build([[1, 3], [], np.array([4, 2]), [5]], eos_token=2, progress=False)
    assert sam.tokens.tolist() == [-1, 1, 3, 2, 4, 2, 5, 2]
    assert sam.manifest["documents"] == 3 and sam.manifest["tokens"] == 7
    assert [d.tolist() for d in sa.split_at_separator(np.array([1, 2, -1, -1, 3, -1]))] == [[1, 2], [3]]


# ---- end-position counts ------------------------------------------------------------------------------


def test_linear_counts_equal_the_naive_walk_and_occurrence_counts():
    """count[v] from the linear pass equals the reference's per-token walk up the suffix links, and the
    number of occurrences of the state's longest string; the root keeps 0 as in the reference."""
    for seed in range(25):
        rng = random.Random(seed)
        text = random_text(rng, rng.randint(3, 5), rng.randint(1, 200))
        text.append(9)
        sam = StaticSuffixAutomaton.build([text], eos_token=9, progress=False)
        assert sam.count.tolist() == naive_walk_counts(text)
        assert sam.count[0] == 0
        for v in range(1, sam.num_states):
            end, length = int(sam.min_endpos[v]), int(sam.length[v])
            assert sam.count[v] == occurrences(text[end - length : end], text)


# ---- drafts -------------------------------------------------------------------------------------------


def test_draft_uses_the_earliest_occurrence():
    """Text 7 8 1 7 8 2 7: the cursor is on "7"; lookup(8) matches "7 8", which ends at positions 2 and 5.
    The draft follows the earliest one: 8, then text[3:5] = 1 7 (the later one would give 8 2 7)."""
    sam = DynamicSuffixAutomaton()
    sam.add_tokens([7, 8, 1, 7, 8, 2, 7])
    state, match = sam.lookup(8)
    assert (match, sam.min_endpos[state]) == (2, 2)
    assert sam.draft(state, 8, 3) == [8, 1, 7]
    assert sam.alpha_draft(state, match, 8, 3, alpha=4.0) == [8, 1, 7]


def test_draft_pads_with_zero():
    """Text 1 2 3 1 2: lookup(3) matches "1 2 3" (earliest and only end: position 3), followed by 1 2 only.
    Its suffix link is the root, so to_anc cannot shorten it: 3 1 2 padded to 5 tokens with 0. The static
    automaton of the same text (it ends with the eos token 2, so nothing is appended) pads the same way;
    the alpha draft is not padded."""
    dynamic = DynamicSuffixAutomaton()
    dynamic.add_tokens([1, 2, 3, 1, 2])
    state, match = dynamic.lookup(3)
    assert (match, dynamic.min_endpos[state], dynamic.link[state]) == (3, 3, 0)
    assert dynamic.draft(state, 3, 5) == [3, 1, 2, 0, 0]
    assert dynamic.alpha_draft(state, match, 3, 5, alpha=4.0) == [3, 1, 2]
    static = StaticSuffixAutomaton.build([[1, 2, 3, 1, 2]], eos_token=2, progress=False)
    static.transfer_tokens([1, 2])
    assert static.lookup(3) == (state, 3)
    assert static.draft(state, 3, 5) == [3, 1, 2, 0, 0]


def test_dynamic_draft_moves_to_an_ancestor_when_the_continuation_is_too_short():
    """Text (positions 1..12): 3 4 9 9 9 9 2 3 4 8 2 3. The cursor is on "2 3"; lookup(4) matches "2 3 4",
    whose only occurrence ends at 9, leaving 12 - 9 = 3 tokens (8 2 3) for a 4-token draft. to_anc moves to
    the suffix link, the state of "3 4" (and "4"), ending at 2 and 9; its link is the root, so it stops
    there: draft 4 + text[3:6] = 4 9 9 9. Without to_anc it would be 4 8 2 3, which is what the alpha draft
    and the static automaton's draft (no to_anc in the reference) give. With 3 tokens the continuation is
    long enough and the match is kept: 4 8 2."""
    text = [3, 4, 9, 9, 9, 9, 2, 3, 4, 8, 2, 3]
    dynamic = DynamicSuffixAutomaton()
    dynamic.add_tokens(text)
    state, match = dynamic.lookup(4)
    assert (match, dynamic.min_endpos[state]) == (3, 9)
    ancestor = dynamic.link[state]
    assert (dynamic.length[ancestor], dynamic.min_endpos[ancestor], dynamic.link[ancestor]) == (2, 2, 0)
    assert dynamic.draft(state, 4, 4) == [4, 9, 9, 9]
    assert dynamic.draft(state, 4, 3) == [4, 8, 2]
    assert dynamic.alpha_draft(state, match, 4, 4, alpha=4.0) == [4, 8, 2, 3]
    assert dynamic.alpha_draft(state, match, 4, 4, alpha=0.5) == [4, 8]  # n = min(4, 1 + int(1.5)) = 2
    static = StaticSuffixAutomaton.build([text], eos_token=3, progress=False)
    static.transfer_tokens([2, 3])
    assert static.lookup(4) == (state, 3)
    assert static.draft(state, 4, 4) == [4, 8, 2, 3]


# ---- probable tree ------------------------------------------------------------------------------------


class _ProbOnly:
    """A heap entry comparing on the probability alone, as the reference's SearchItem does."""

    def __init__(self, prob, *payload):
        self.prob, self.payload = prob, payload

    def __lt__(self, other):
        return self.prob < other.prob


def oracle_tree(sam: DynamicSuffixAutomaton, counts, state, match, start, n_predicts, alpha, k):
    """The probable tree computed on the dict automaton: children are the transitions sorted by the
    target's count, stably (insertion order among equals), cut to k; Python's heapq on prob-only entries."""
    n = min(n_predicts, 1 + int(match * alpha))
    heap, tokens, parents, per_depth = [_ProbOnly(-1.0, start, state, -1, 0)], [], [], {}
    while len(tokens) != n and heap:
        item = heapq.heappop(heap)
        token, v, parent, depth = item.payload
        if per_depth.get(depth, 0) + 1 > k:
            continue
        per_depth[depth] = per_depth.get(depth, 0) + 1
        node = len(tokens)
        tokens.append(token)
        parents.append(parent)
        if len(tokens) == n:
            break
        children = sorted(sam.next[v].items(), key=lambda item: counts[item[1]], reverse=True)[:k]
        for child_token, child in children:
            heapq.heappush(heap, _ProbOnly(item.prob * (counts[child] / counts[v]), child_token, child, node,
                                           depth + 1))
    return tokens, parents


def test_probable_tree_matches_heapq_on_random_corpora_including_ties():
    """Small vocabularies make many equal probabilities; the tree (order of nodes and parents) must be the
    one Python's heapq gives when entries compare on the probability alone (a push-order tie rule differs
    on about a third of these cases). Vocabularies above 8 make the top-k cut bind."""
    for seed in range(40):
        rng = random.Random(seed)
        vocab = rng.choice([2, 3, 4, 12])
        text = random_text(rng, vocab, rng.randint(20, 150)) + [vocab]
        dynamic = DynamicSuffixAutomaton()
        dynamic.add_tokens(text)
        counts = naive_walk_counts(text)
        static = StaticSuffixAutomaton.build([text], eos_token=vocab, progress=False)
        for v in range(static.num_states):
            expected = sorted(dynamic.next[v].items(), key=lambda item: counts[item[1]], reverse=True)[:8]
            assert [(t, s) for t, s, _ in static.children(v)] == expected
        for _ in range(5):
            static.reset()
            static.transfer_tokens(random_text(rng, vocab, rng.randint(0, 5)))
            state, match = static.lookup(rng.randrange(vocab))
            if state == 0:
                continue
            k, alpha = rng.choice([(8, 4.0), (2, 4.0), (3, 0.7)])
            got = static.probable_tree(state, match, 99, 40, alpha=alpha, top_k=k)
            assert got == oracle_tree(dynamic, counts, state, match, 99, 40, alpha, k)


def test_probable_tree_on_a_hand_made_corpus():
    """Documents (eos 0): for c = 1..10, "100 c 20+c u" 2c times, then "100 c 40+c u" once, u a token of
    its own in every document. After 100 (120 occurrences) come ten tokens c with counts 2c + 1, inserted
    in the order 1..10; the eight most frequent, 10 down to 3, are the root's children, most frequent
    first, while 2 and 1 never appear. Each child has two continuations, so depth 2 has 16 candidates, of
    which only 8 are taken.

    Worked example, match 1 and alpha 4, so n = min(40, 1 + int(1 * 4)) = 5 nodes: take 100 (prob 1),
    push its children 10, 9, .. (21/120, 19/120, ..); take 10, push 30 (21/120 * 20/21 = 20/120) and 50
    (1/120); take 30 (20/120 beats 9's 19/120), push its u's (1/120 each); take 9, push 29 (18/120) and 49;
    take 29 (18/120 beats 8's 17/120): tokens 100 10 30 9 29 with parents -1 0 1 0 3.
    """
    documents = []
    for c in range(1, 11):
        documents += [[100, c, 20 + c]] * (2 * c) + [[100, c, 40 + c]]
    documents = [document + [1000 + i] for i, document in enumerate(documents)]
    sam = StaticSuffixAutomaton.build(documents, eos_token=0, progress=False)
    text = sam.tokens[1:].tolist()
    sam.reset()  # the build leaves the cursor at the end of the corpus, as the reference's does
    state, match = sam.lookup(100)
    assert match == 1 and sam.count[state] == 120
    assert [(t, c) for t, _, c in sam.children(state)] == [(c, 2 * c + 1) for c in range(10, 2, -1)]
    assert [t for t, _ in sam.transitions(state)] == list(range(1, 11))  # insertion order differs

    assert sam.probable_tree(state, match, 100, 40) == ([100, 10, 30, 9, 29], [-1, 0, 1, 0, 3])

    tokens, parents = sam.probable_tree(state, 20, 100, 60, alpha=4.0)
    assert len(tokens) == 60 and (tokens[0], parents[0]) == (100, -1)
    assert [t for t, p in zip(tokens, parents) if p == 0] == list(range(10, 2, -1))
    assert sum(len(sam.transitions(child)) for _, child, _ in sam.children(state)) == 16
    depth = [0]
    for p in parents[1:]:
        depth.append(depth[p] + 1)
    per_depth = np.bincount(depth)
    assert per_depth.max() == 8 and per_depth[2] == 8
    for i in range(len(tokens)):  # every root-to-node path continues "100" somewhere in the corpus
        path, j = [], i
        while j != -1:
            path.append(tokens[j])
            j = parents[j]
        assert occurrences(path[::-1], text) > 0

    assert len(sam.probable_tree(state, 2, 100, 60, alpha=4.0)[0]) == 9
    assert len(sam.probable_tree(state, 20, 100, 7, alpha=4.0)[0]) == 7
    assert len(sam.probable_tree(state, 3, 100, 60, alpha=0.5)[0]) == 2
    assert sam.probable_tree(state, 0, 100, 60) == ([100], [-1])


# ---- storage ------------------------------------------------------------------------------------------


@pytest.fixture
def built():
    rng = random.Random(3)
    documents = [random_text(rng, 6, rng.randint(5, 80)) for _ in range(6)]
    return StaticSuffixAutomaton.build(documents, eos_token=0, progress=False, source={"corpus": "random"})


def test_save_and_load_round_trip(built, tmp_path):
    directory = tmp_path / "sam"
    built.save(directory)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".sam.versions", "sam"]
    assert not [p for p in (tmp_path / ".sam.versions").iterdir() if p.name.startswith(".staging-")]  # none left
    loaded = StaticSuffixAutomaton.load(directory, expected_manifest_subset={"source": {"corpus": "random"}})
    manifest = loaded.manifest
    assert manifest["format_version"] == sa.FORMAT_VERSION and manifest["source"] == {"corpus": "random"}
    assert (manifest["states"], manifest["transitions"], manifest["tokens"]) == (
        built.num_states, built.num_transitions, built.num_tokens)
    assert manifest["build_seconds"] >= 0
    for name in sa._ARRAYS:
        array = getattr(loaded, name)
        assert np.array_equal(array, getattr(built, name)) and not array.flags.writeable, name
    assert loaded.memory_bytes() == built.memory_bytes() > 0
    for automaton in (built, loaded):
        automaton.reset()
        automaton.transfer_tokens([1, 2, 3])
    for token in range(7):
        state, match = built.lookup(token)
        assert loaded.lookup(token) == (state, match)
        assert loaded.draft(state, token, 10) == built.draft(state, token, 10)
        if state:
            assert loaded.probable_tree(state, match, token, 40) == built.probable_tree(state, match, token, 40)
    built.save(directory)  # overwriting an existing automaton
    StaticSuffixAutomaton.load(directory)


def test_damaged_or_foreign_directories_are_refused(built, tmp_path):
    directory = tmp_path / "sam"
    with pytest.raises(SpecbenchError, match="manifest.json missing"):
        StaticSuffixAutomaton.load(directory)

    built.save(directory)
    (directory / "edge_next.npy").unlink()
    with pytest.raises(SpecbenchError, match=f"{directory}.*edge_next.npy"):
        StaticSuffixAutomaton.load(directory)

    built.save(directory)
    data = (directory / "hash_keys.npy").read_bytes()
    (directory / "hash_keys.npy").write_bytes(data[: len(data) - 40])
    with pytest.raises(SpecbenchError, match=f"{directory}: damaged.*hash_keys.npy"):
        StaticSuffixAutomaton.load(directory)

    built.save(directory)
    np.save(directory / "link.npy", np.asarray(built.link)[:-1])  # a whole .npy, of the wrong size
    with pytest.raises(SpecbenchError, match=f"{directory}: damaged.*link.npy"):
        StaticSuffixAutomaton.load(directory)

    built.save(directory)
    with pytest.raises(SpecbenchError, match=f"{directory}: suffix automaton built for source"):
        StaticSuffixAutomaton.load(directory, expected_manifest_subset={"source": {"corpus": "other"}})
    manifest = (directory / "manifest.json").read_text()
    (directory / "manifest.json").write_text(manifest.replace('"format_version": 1', '"format_version": 0'))
    with pytest.raises(SpecbenchError, match=f"{directory}: suffix automaton format 0"):
        StaticSuffixAutomaton.load(directory)
