"""Suffix automata for SAM-Decoding (Hu et al. 2024, "SAM Decoding: Speculative Decoding via Suffix
Automaton"), reproducing the drafting of the authors' code as Spec-Bench carries it (commit fd2c1cd,
``model/samd/sam/dyn_sam.py``, ``model/samd/sam/static_sam.py``, used by ``model/samd/draft.py``).

A suffix automaton of a text is the smallest automaton that accepts exactly the text's substrings. Each
state stands for a class of substrings that end at the same set of positions ("end positions"); ``length``
is the longest string of the class, ``link`` points to the state of the longest suffix that falls in
another class, and the automaton has at most 2n states and 3n transitions for n tokens. It is built online
in amortised linear time, and it lets a drafter follow, one token at a time, the longest suffix of the
generated text that occurs in a corpus: each step is one transition, or a walk down the suffix links when
the match breaks. SAM-Decoding keeps two of them: a dynamic one over the current question's prompt and
output (``DynamicSuffixAutomaton``, pure Python, a few thousand tokens) and a static one over a corpus of
millions of tokens (``StaticSuffixAutomaton``, flat numpy arrays built by numba, saved and memory-mapped).
A draft is the text that followed the earliest occurrence of the match (``min_endpos``), or, for the static
automaton, a tree of the most frequent continuations (``cnt_endpos``).

Conventions shared with the reference: the text is 1-based (position 0 holds a dummy -1, tokens occupy
1..n); state 0 is the root; ``min_endpos`` is the earliest end position of a state's strings (a clone keeps
that of the state it was cloned from); a cursor ``(state, length)`` follows the longest suffix of the
text fed so far that occurs in the automaton's text.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Iterable, Sequence

import numba
import numpy as np

from specbench.storage.manifest import read_manifest, verify_files
from specbench.storage.publish import replace_directory
from specbench.datastores.suffix_array import out_of_vocabulary
from specbench.errors import SpecbenchError, damage_reason

FORMAT_VERSION = 1

_EMPTY = -1  # free slot in the transition hash table (keys are never negative)
_MAX_TOKEN = 2**31 - 1  # token ids are stored as int32
_LOAD_LIMIT = 0.75  # the hash table grows by half when more of it than this is used
_TRANSITIONS_PER_TOKEN = 2.4  # initial table size; natural-language corpora give about 2.1
_MIN_HASH_SLOTS = 1024
_CHUNK = 1 << 20  # tokens per call of the jitted construction loop (progress bar granularity)
_ARRAYS = ("tokens", "link", "length", "min_endpos", "count", "first_edge", "edge_token", "edge_next",
           "hash_keys", "hash_values")


# ---------------------------------------------------------------------------------------------------------
# Dynamic automaton: one question's context, pure Python.
# ---------------------------------------------------------------------------------------------------------


class DynamicSuffixAutomaton:
    """The suffix automaton of one question's prompt and output, with a cursor on the longest suffix of
    the text that also occurs earlier in it (Spec-Bench fd2c1cd model/samd/sam/dyn_sam.py:8-122).

    States are parallel lists; ``next`` holds one dict of transitions per state, so transitions keep their
    insertion order as in the reference.
    """

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """Forget the text: a fresh automaton with only the root (Spec-Bench fd2c1cd model/samd/sam/dyn_sam.py:30-36)."""
        self.next: list[dict[int, int]] = [{}]
        self.link: list[int] = [-1]
        self.length: list[int] = [0]
        self.min_endpos: list[int] = [0]
        self.text: list[int] = [-1]  # 1-based: position 0 is a dummy
        self.last = 0
        self.cursor_state = 0
        self.cursor_length = 0

    @property
    def num_tokens(self) -> int:
        return len(self.text) - 1

    def _extend(self, token: int) -> None:
        """Online construction step with clones (Spec-Bench fd2c1cd model/samd/sam/dyn_sam.py:43-69).
        A clone copies the dict of the state it splits (so its transitions keep that order) and its
        ``min_endpos``."""
        nxt, link, length, min_endpos = self.next, self.link, self.length, self.min_endpos
        position = len(self.text)  # the 1-based position of ``token``, appended by the caller afterwards
        cur = len(link)
        nxt.append({})
        link.append(-1)
        length.append(position)
        min_endpos.append(position)
        p = self.last
        while p != -1 and token not in nxt[p]:
            nxt[p][token] = cur
            p = link[p]
        if p == -1:
            link[cur] = 0
        else:
            q = nxt[p][token]
            if length[p] + 1 == length[q]:
                link[cur] = q
            else:
                clone = len(link)
                nxt.append(dict(nxt[q]))
                link.append(link[q])
                length.append(length[p] + 1)
                min_endpos.append(min_endpos[q])
                while p != -1 and nxt[p][token] == q:
                    nxt[p][token] = clone  # an existing key: its position in the dict is kept
                    p = link[p]
                link[q] = clone
                link[cur] = clone
        self.last = cur

    def transfer(self, state: int, length: int, token: int) -> tuple[int, int]:
        """Follow ``token`` from the match (state, length), shortening the match along suffix links until
        a transition exists; (0, 0) when none does (Spec-Bench fd2c1cd model/samd/sam/dyn_sam.py:71-80)."""
        nxt, link = self.next, self.link
        while state != 0 and token not in nxt[state]:
            state = link[state]
            length = self.length[state]
        target = nxt[state].get(token)
        if target is None:
            return 0, 0
        return target, length + 1

    def add_tokens(self, tokens: Iterable[int]) -> None:
        """Append tokens to the text: for each, first move the cursor with it, then extend the automaton
        (Spec-Bench fd2c1cd model/samd/sam/dyn_sam.py:86-90), so the cursor follows the longest suffix of the text that
        occurs earlier."""
        for token in tokens:
            token = int(token)
            self.cursor_state, self.cursor_length = self.transfer(self.cursor_state, self.cursor_length, token)
            self._extend(token)
            self.text.append(token)

    def lookup(self, token: int) -> tuple[int, int]:
        """(state, match length) of the cursor moved by ``token``, without moving it
        (Spec-Bench fd2c1cd model/samd/sam/dyn_sam.py:96-99)."""
        return self.transfer(self.cursor_state, self.cursor_length, int(token))

    def draft(self, state: int, start_token: int, n_predicts: int) -> list[int]:
        """``start_token`` and the text after the earliest occurrence of the match, ``n_predicts`` tokens
        in all, padded with token 0 (Spec-Bench fd2c1cd model/samd/sam/dyn_sam.py:109-115).

        First the match is shortened ("to_anc", Spec-Bench fd2c1cd model/samd/sam/dyn_sam.py:101-107): while the earliest
        occurrence of the state's strings ends too close to the end of the text to be followed by
        ``n_predicts`` tokens, the state moves to its suffix link, whose strings occur earlier too, but never
        to the root.
        """
        link, min_endpos = self.link, self.min_endpos
        max_length = self.num_tokens
        if state != 0:
            while link[state] != 0 and n_predicts > max_length - min_endpos[state]:
                state = link[state]
        end = min_endpos[state]
        draft = [int(start_token)] + self.text[end + 1 : end + n_predicts]
        draft.extend([0] * (n_predicts - len(draft)))
        return draft

    def alpha_draft(self, state: int, match_length: int, start_token: int, n_predicts: int,
                    alpha: float = 4.0) -> list[int]:
        """``start_token`` and the text after the earliest occurrence of the match, at most
        min(n_predicts, 1 + int(match_length * alpha)) tokens in all; neither shortened nor padded
        (``gen_dyn_draft``, Spec-Bench fd2c1cd model/samd/sam/dyn_sam.py:117-122)."""
        n = min(n_predicts, 1 + int(match_length * alpha))
        end = self.min_endpos[state]
        return [int(start_token)] + self.text[end + 1 : end + n]


# ---------------------------------------------------------------------------------------------------------
# Static automaton: numba kernels on flat arrays.
#
# Transitions live in an open-addressing hash table (linear probing) keyed by (state << 32) | token, whose
# value is the target state. Each state also has a singly-linked list of its transitions' tokens
# (first_edge[state], edge_token[e], edge_next[e]) holding them newest first; a clone copies its source's
# list in the same order, so reversing a list gives the insertion order of the reference's dicts.
# ---------------------------------------------------------------------------------------------------------


@numba.njit(cache=True)
def _slot(key, capacity):
    """Home slot of a key: a splitmix64 finaliser, then the top 32 bits scaled to the capacity (< 2**32)."""
    x = np.uint64(key)
    x ^= x >> np.uint64(30)
    x *= np.uint64(0xBF58476D1CE4E5B9)
    x ^= x >> np.uint64(27)
    x *= np.uint64(0x94D049BB133111EB)
    x ^= x >> np.uint64(31)
    return np.int64(((x >> np.uint64(32)) * np.uint64(capacity)) >> np.uint64(32))


@numba.njit(cache=True)
def _find(hash_keys, state, token):
    """Slot of (state, token) if present, else -1 - (the free slot where it would go)."""
    key = (np.int64(state) << 32) | np.int64(token)
    capacity = hash_keys.size
    slot = _slot(key, capacity)
    while True:
        k = hash_keys[slot]
        if k == key:
            return slot
        if k == _EMPTY:
            return -1 - slot
        slot += 1
        if slot == capacity:
            slot = 0


@numba.njit(cache=True)
def _target(hash_keys, hash_values, state, token):
    """Target of the transition (state, token), or -1."""
    if token < 0 or token > _MAX_TOKEN:
        return -1
    slot = _find(hash_keys, state, token)
    if slot < 0:
        return -1
    return hash_values[slot]


@numba.njit(cache=True)
def _extend_chunk(text, start, stop, grow_at, link, length, min_endpos, count, first_edge, edge_token,
                  edge_next, hash_keys, hash_values, counters):
    """Feed text[start:stop] (1-based positions) to the automaton: per token move the cursor, then extend
    (Spec-Bench fd2c1cd model/samd/sam/static_sam.py:116-120, add_state at :69-96). ``counters`` =
    [states, transitions, last, cursor state, cursor length] is read and written back. Returns the
    position reached: before ``stop`` when the transitions reached ``grow_at`` and the hash table must grow
    first. New states count 1 end position, clones 0; ``_propagate_counts`` sums them up the suffix links
    afterwards."""
    n_states = counters[0]
    n_edges = counters[1]
    last = counters[2]
    cursor = counters[3]
    cursor_length = counters[4]
    capacity = hash_keys.size
    position = start
    while position < stop:
        if n_edges >= grow_at:
            break
        token = text[position]
        # cursor (transfer_state, Spec-Bench fd2c1cd model/samd/sam/static_sam.py:101-110)
        while True:
            slot = _find(hash_keys, cursor, token)
            if slot >= 0:
                cursor = hash_values[slot]
                cursor_length += 1
                break
            if cursor == 0:
                cursor_length = 0
                break
            cursor = link[cursor]
            cursor_length = length[cursor]
        # extension
        cur = n_states
        n_states += 1
        link[cur] = -1
        length[cur] = position
        min_endpos[cur] = position
        count[cur] = 1
        first_edge[cur] = -1
        p = last
        slot = -1
        while p != -1:
            slot = _find(hash_keys, p, token)
            if slot >= 0:
                break
            if n_edges + 1 >= capacity:
                raise RuntimeError("suffix automaton: transition hash table full")
            free = -1 - slot
            hash_keys[free] = (np.int64(p) << 32) | np.int64(token)
            hash_values[free] = cur
            edge_token[n_edges] = token
            edge_next[n_edges] = first_edge[p]
            first_edge[p] = n_edges
            n_edges += 1
            p = link[p]
        if p == -1:
            link[cur] = 0
        else:
            q = hash_values[slot]
            if length[p] + 1 == length[q]:
                link[cur] = q
            else:
                clone = n_states
                n_states += 1
                link[clone] = link[q]
                length[clone] = length[p] + 1
                min_endpos[clone] = min_endpos[q]
                count[clone] = 0
                first_edge[clone] = -1
                tail = -1
                e = first_edge[q]
                while e != -1:  # copy q's transitions, keeping their order
                    t = edge_token[e]
                    target = hash_values[_find(hash_keys, q, t)]
                    if n_edges + 1 >= capacity:
                        raise RuntimeError("suffix automaton: transition hash table full")
                    free = -1 - _find(hash_keys, clone, t)
                    hash_keys[free] = (np.int64(clone) << 32) | np.int64(t)
                    hash_values[free] = target
                    edge_token[n_edges] = t
                    edge_next[n_edges] = -1
                    if tail == -1:
                        first_edge[clone] = n_edges
                    else:
                        edge_next[tail] = n_edges
                    tail = n_edges
                    n_edges += 1
                    e = edge_next[e]
                while p != -1:
                    slot = _find(hash_keys, p, token)
                    if hash_values[slot] != q:
                        break
                    hash_values[slot] = clone
                    p = link[p]
                link[q] = clone
                link[cur] = clone
        last = cur
        position += 1
    counters[0] = n_states
    counters[1] = n_edges
    counters[2] = last
    counters[3] = cursor
    counters[4] = cursor_length
    return position


@numba.njit(cache=True)
def _rehash(old_keys, old_values, new_keys, new_values):
    for i in range(old_keys.size):
        key = old_keys[i]
        if key != _EMPTY:
            capacity = new_keys.size
            slot = _slot(key, capacity)
            while new_keys[slot] != _EMPTY:
                slot += 1
                if slot == capacity:
                    slot = 0
            new_keys[slot] = key
            new_values[slot] = old_values[i]


@numba.njit(cache=True)
def _propagate_counts(link, length, count, n_states, max_length):
    """Number of end positions of every state in linear time: each state added for a token holds one end
    position (clones none), and a state's end positions are the union of those of the states whose suffix
    link points to it, so adding counts to the link in decreasing order of length (a counting sort) gives
    the totals. The root keeps 0, as the reference's walk (Spec-Bench fd2c1cd model/samd/sam/static_sam.py:97-99) never
    reaches it."""
    buckets = np.zeros(max_length + 2, np.int64)
    for v in range(n_states):
        buckets[length[v] + 1] += 1
    for i in range(1, max_length + 2):
        buckets[i] += buckets[i - 1]
    order = np.empty(n_states, np.int32)
    for v in range(n_states):
        order[buckets[length[v]]] = v
        buckets[length[v]] += 1
    for i in range(n_states - 1, 0, -1):
        v = order[i]
        count[link[v]] += count[v]
    count[0] = 0


@numba.njit(cache=True)
def _transfer_tokens(hash_keys, hash_values, link, length, state, match_length, tokens):
    """Move the match (state, match_length) by each token in turn (Spec-Bench fd2c1cd model/samd/sam/static_sam.py:101-124)."""
    for i in range(tokens.size):
        token = tokens[i]
        while True:
            target = _target(hash_keys, hash_values, state, token)
            if target >= 0:
                state = target
                match_length += 1
                break
            if state == 0:
                match_length = 0
                break
            state = link[state]
            match_length = length[state]
    return state, match_length


@numba.njit(cache=True)
def _top_children(hash_keys, hash_values, count, first_edge, edge_token, edge_next, state, k,
                  out_tokens, out_states, out_counts):
    """The ``k`` transitions of ``state`` whose targets have the most end positions, most first, equal
    counts in insertion order (Python's stable sort, Spec-Bench fd2c1cd model/samd/sam/static_sam.py:141-150). Returns how
    many."""
    size = 0
    e = first_edge[state]
    while e != -1:  # newest first: a transition goes before every kept one with an equal count
        token = edge_token[e]
        target = hash_values[_find(hash_keys, state, token)]
        c = count[target]
        at = 0
        while at < size and out_counts[at] > c:
            at += 1
        if at < k:
            end = size if size < k else k - 1
            for j in range(end, at, -1):
                out_tokens[j] = out_tokens[j - 1]
                out_states[j] = out_states[j - 1]
                out_counts[j] = out_counts[j - 1]
            out_tokens[at] = token
            out_states[at] = target
            out_counts[at] = c
            if size < k:
                size += 1
        e = edge_next[e]
    return size


@numba.njit(cache=True)
def _sift_into(heap, pos, item, prob):
    """Move ``item`` from the hole at ``pos`` towards the root past parents of higher ``prob`` and place it
    (CPython heapq's _siftdown, comparing on the probability alone)."""
    while pos > 0:
        parent_pos = (pos - 1) >> 1
        parent = heap[parent_pos]
        if prob[item] < prob[parent]:
            heap[pos] = parent
            pos = parent_pos
            continue
        break
    heap[pos] = item


@numba.njit(cache=True)
def _heap_push(heap, size, item, prob):
    """heapq.heappush on item ids ordered by ``prob`` only (CPython's _siftdown), so ties go exactly where
    heapq puts items that compare on the probability alone. Returns the new size."""
    _sift_into(heap, size, item, prob)
    return size + 1


@numba.njit(cache=True)
def _heap_pop(heap, size, prob):
    """heapq.heappop (CPython's _siftup then _siftdown). Returns the item; the heap shrinks by one."""
    size -= 1
    last = heap[size]
    if size == 0:
        return last
    top = heap[0]
    pos = 0
    child = 1
    while child < size:
        right = child + 1
        if right < size and not prob[heap[child]] < prob[heap[right]]:
            child = right
        heap[pos] = heap[child]
        pos = child
        child = 2 * pos + 1
    _sift_into(heap, pos, last, prob)  # _siftdown(heap, 0, pos) with ``last``
    return top


@numba.njit(cache=True)
def _probable_tree(hash_keys, hash_values, count, first_edge, edge_token, edge_next, root_state,
                   start_token, n, k):
    """Best-first tree of likely continuations (Spec-Bench fd2c1cd model/samd/sam/static_sam.py:194-227); see
    ``probable_tree``."""
    capacity = 1 + n * k
    prob = np.empty(capacity, np.float64)
    item_token = np.empty(capacity, np.int64)
    item_state = np.empty(capacity, np.int64)
    item_parent = np.empty(capacity, np.int64)
    item_depth = np.empty(capacity, np.int64)
    heap = np.empty(capacity, np.int64)
    per_depth = np.zeros(n + 2, np.int64)
    tokens = np.empty(n, np.int64)
    parents = np.empty(n, np.int64)
    child_tokens = np.empty(k, np.int64)
    child_states = np.empty(k, np.int64)
    child_counts = np.empty(k, np.int64)
    prob[0] = -1.0
    item_token[0] = start_token
    item_state[0] = root_state
    item_parent[0] = -1
    item_depth[0] = 0
    items = 1
    heap_size = _heap_push(heap, 0, 0, prob)
    size = 0
    while size != n and heap_size != 0:
        item = _heap_pop(heap, heap_size, prob)
        heap_size -= 1
        depth = item_depth[item]
        if per_depth[depth] + 1 > k:
            continue
        per_depth[depth] += 1
        node = size
        tokens[size] = item_token[item]
        parents[size] = item_parent[item]
        size += 1
        if size == n:
            break
        state = item_state[item]
        total = count[state]
        m = _top_children(hash_keys, hash_values, count, first_edge, edge_token, edge_next, state, k,
                          child_tokens, child_states, child_counts)
        for j in range(m):
            prob[items] = prob[item] * (child_counts[j] / total)
            item_token[items] = child_tokens[j]
            item_state[items] = child_states[j]
            item_parent[items] = node
            item_depth[items] = depth + 1
            heap_size = _heap_push(heap, heap_size, items, prob)
            items += 1
    return tokens[:size], parents[:size]


def split_at_separator(tokens: np.ndarray, separator: int = -1) -> list[np.ndarray]:
    """Documents of a token array whose documents are separated (or ended) by ``separator``, as views;
    empty ones dropped."""
    tokens = np.asarray(tokens)
    cuts = np.flatnonzero(tokens == separator)
    starts = np.concatenate(([0], cuts + 1))
    ends = np.concatenate((cuts, [tokens.size]))
    return [tokens[s:e] for s, e in zip(starts.tolist(), ends.tolist()) if e > s]


class StaticSuffixAutomaton:
    """The suffix automaton of a corpus, with end-position counts, on flat arrays (Spec-Bench fd2c1cd
    model/samd/sam/static_sam.py:22-227), and a per-question cursor.

    Arrays (one entry per state unless said): ``tokens`` (the 1-based text, n+1 entries), ``link``,
    ``length``, ``min_endpos``, ``count`` (end positions), ``first_edge``; per transition ``edge_token``,
    ``edge_next``; the hash table ``hash_keys`` ((state << 32) | token, -1 when free) and ``hash_values``
    (target state).
    """

    def __init__(self, arrays: dict[str, np.ndarray], manifest: dict):
        for name in _ARRAYS:
            setattr(self, name, arrays[name])
        self.manifest = manifest
        self.cursor_state = 0
        self.cursor_length = 0

    # ---- construction and storage -------------------------------------------------------------------

    @staticmethod
    def build(documents: Iterable[Sequence[int] | np.ndarray], eos_token: int, progress: bool = True,
              source: dict | None = None) -> StaticSuffixAutomaton:
        """The automaton of the documents, each followed by ``eos_token`` unless it already ends with it
        (Spec-Bench fd2c1cd model/samd/sam/static_sam.py:135-139; empty documents, on which the reference fails, are
        skipped).

        Linear time: the online construction runs in numba over chunks of the concatenated text; end
        positions are counted afterwards in one pass (``_propagate_counts``) instead of the reference's walk
        up the suffix links at every token (Spec-Bench fd2c1cd model/samd/sam/static_sam.py:97-99), which gives the same
        numbers. As in the reference the cursor follows the text during construction (``reset()`` before a
        question).
        """
        from tqdm import tqdm

        started = time.perf_counter()
        eos = np.array([eos_token], dtype=np.int32)
        pieces = [np.array([-1], dtype=np.int32)]
        n_documents = 0
        for document in documents:
            ids = np.asarray(document)
            if ids.size == 0:
                continue
            if ids.min() < 0 or ids.max() > _MAX_TOKEN:
                raise ValueError("token ids must lie in [0, 2**31)")
            pieces.append(ids.astype(np.int32, copy=False))
            if int(ids[-1]) != eos_token:
                pieces.append(eos)
            n_documents += 1
        text = np.concatenate(pieces)
        del pieces
        n = text.size - 1
        if n >= 2**30:
            raise ValueError("corpus too large for int32 state ids")

        state_capacity = 2 * n + 2
        edge_capacity = 3 * n + 4  # a suffix automaton has at most 3n - 4 transitions (n >= 3)
        link = np.empty(state_capacity, np.int32)
        length = np.empty(state_capacity, np.int32)
        min_endpos = np.empty(state_capacity, np.int32)
        count = np.empty(state_capacity, np.int32)
        first_edge = np.empty(state_capacity, np.int32)
        edge_token = np.empty(edge_capacity, np.int32)
        edge_next = np.empty(edge_capacity, np.int32)
        link[0], length[0], min_endpos[0], count[0], first_edge[0] = -1, 0, 0, 0, -1
        hash_capacity = max(_MIN_HASH_SLOTS, int(_TRANSITIONS_PER_TOKEN * n / _LOAD_LIMIT))
        hash_keys = np.full(hash_capacity, _EMPTY, np.int64)
        hash_values = np.empty(hash_capacity, np.int32)
        counters = np.array([1, 0, 0, 0, 0], np.int64)

        bar = tqdm(total=n, desc="suffix automaton", unit="tok", unit_scale=True, disable=not progress)
        position = 1
        while position <= n:
            stop = min(position + _CHUNK, n + 1)
            reached = _extend_chunk(text, position, stop, int(_LOAD_LIMIT * hash_keys.size), link, length,
                                    min_endpos, count, first_edge, edge_token, edge_next, hash_keys,
                                    hash_values, counters)
            bar.update(reached - position)
            position = reached
            if position < stop:  # the table is full enough: grow it by half
                new_capacity = int(hash_keys.size * 1.5)
                if new_capacity >= 2**32:
                    raise ValueError("corpus too large for the transition hash table")
                new_keys = np.full(new_capacity, _EMPTY, np.int64)
                new_values = np.empty(new_capacity, np.int32)
                _rehash(hash_keys, hash_values, new_keys, new_values)
                hash_keys, hash_values = new_keys, new_values
                del new_keys, new_values
        bar.close()
        n_states, n_edges = int(counters[0]), int(counters[1])
        _propagate_counts(link, length, count, n_states, n)

        arrays = {
            "tokens": text, "link": link[:n_states], "length": length[:n_states],
            "min_endpos": min_endpos[:n_states], "count": count[:n_states], "first_edge": first_edge[:n_states],
            "edge_token": edge_token[:n_edges], "edge_next": edge_next[:n_edges],
            "hash_keys": hash_keys, "hash_values": hash_values,
        }
        manifest = {
            "format_version": FORMAT_VERSION, "tokens": n, "documents": n_documents, "states": n_states,
            "transitions": n_edges, "eos_token": int(eos_token),
            "build_seconds": round(time.perf_counter() - started, 3), "source": dict(source or {}),
        }
        automaton = StaticSuffixAutomaton(arrays, manifest)
        automaton.cursor_state, automaton.cursor_length = int(counters[3]), int(counters[4])
        return automaton

    def save(self, directory: str | Path, source: dict | None = None) -> None:
        """Write the arrays (``.npy``) and ``manifest.json`` into a staging directory next to
        ``directory`` and rename it into place, so a reader never sees a half-written automaton.
        ``source`` (what the corpus was), when given, replaces the manifest's."""
        directory = Path(directory)
        if source is not None:
            self.manifest["source"] = dict(source)

        def write(staging: Path) -> None:
            for name in _ARRAYS:
                np.save(staging / f"{name}.npy", np.ascontiguousarray(getattr(self, name)))

        replace_directory(directory, write, self.manifest)

    @staticmethod
    def load(directory: str | Path, expected_manifest_subset: dict | None = None, vocab_size: int | None = None,
             fix: str = "rebuild it") -> StaticSuffixAutomaton:
        """Memory-map a saved automaton, checking that it is whole (``verify_files``; every array of the size
        and dtype the manifest says), of this format, when ``expected_manifest_subset`` is given that its
        manifest has those entries, and, given ``vocab_size`` (the target's embedding rows), that its text
        and transitions hold token ids 0..vocab_size-1 only (the text's first entry is the dummy -1). ``fix``
        ends every error message."""
        directory = Path(directory)
        rebuild = fix
        manifest = read_manifest(directory, "suffix automaton", rebuild)
        if manifest.get("format_version") != FORMAT_VERSION:
            raise SpecbenchError(
                f"{directory}: suffix automaton format {manifest.get('format_version')}, expected {FORMAT_VERSION}; "
                f"{rebuild}")
        for key, value in (expected_manifest_subset or {}).items():
            if manifest.get(key) != value:
                raise SpecbenchError(
                    f"{directory}: suffix automaton built for {key}={manifest.get(key)!r}, expected {value!r}; "
                    f"{rebuild}")
        problem = verify_files(directory, manifest)
        if problem:
            raise SpecbenchError(f"{directory}: damaged suffix automaton ({problem}); {rebuild}")
        arrays = {}
        for name in _ARRAYS:
            try:
                loaded = np.load(directory / f"{name}.npy", mmap_mode="r")
                if not isinstance(loaded, np.ndarray):  # an .npz archive under the name
                    raise ValueError("not a .npy array")
                arrays[name] = np.asarray(loaded)
            except Exception as error:  # numpy raises OSError, ValueError, EOFError, pickle's errors, ...
                raise SpecbenchError(f"{directory}: damaged suffix automaton ({name}.npy: {damage_reason(error)}); "
                                     f"{rebuild}") from None
        try:
            states, transitions, n = int(manifest["states"]), int(manifest["transitions"]), int(manifest["tokens"])
        except (KeyError, TypeError, ValueError):
            raise SpecbenchError(f"{directory}: damaged suffix automaton (manifest incomplete); {rebuild}") from None
        expected = {"tokens": (n + 1, np.int32), "edge_token": (transitions, np.int32),
                    "edge_next": (transitions, np.int32), "hash_keys": (None, np.int64),
                    "hash_values": (arrays["hash_keys"].size, np.int32)}
        for name in ("link", "length", "min_endpos", "count", "first_edge"):
            expected[name] = (states, np.int32)
        for name, (size, dtype) in expected.items():
            array = arrays[name]
            if array.ndim != 1 or array.dtype != dtype or (size is not None and array.size != size):
                raise SpecbenchError(
                    f"{directory}: damaged suffix automaton ({name}.npy has shape {array.shape} and dtype "
                    f"{array.dtype}); {rebuild}")
        if arrays["hash_keys"].size <= transitions or arrays["hash_keys"].size >= 2**32:
            raise SpecbenchError(f"{directory}: damaged suffix automaton (hash table size); {rebuild}")
        if n >= 0 and int(arrays["tokens"][0]) != -1:
            raise SpecbenchError(f"{directory}: damaged suffix automaton (tokens.npy does not start with -1); {rebuild}")
        for name, ids in (("tokens", arrays["tokens"][1:]), ("edge_token", arrays["edge_token"])):
            bad = out_of_vocabulary(ids, 0, vocab_size)
            if bad is not None:
                raise SpecbenchError(f"{directory}: token id {bad} in {name}.npy is outside the target's vocabulary "
                                     f"(ids 0..{(vocab_size or 0) - 1}); {rebuild}")
        return StaticSuffixAutomaton(arrays, manifest)

    # ---- sizes ------------------------------------------------------------------------------------------

    @property
    def num_tokens(self) -> int:
        return self.tokens.size - 1

    @property
    def num_states(self) -> int:
        return self.link.size

    @property
    def num_transitions(self) -> int:
        return self.edge_token.size

    def memory_bytes(self) -> int:
        """Bytes of all arrays (mapped, when loaded, not necessarily resident)."""
        return sum(int(getattr(self, name).nbytes) for name in _ARRAYS)

    # ---- cursor -----------------------------------------------------------------------------------------

    def reset(self) -> None:
        """Put the cursor back on the root for a new question; the automaton stays
        (Spec-Bench fd2c1cd model/samd/sam/static_sam.py:131-133)."""
        self.cursor_state = 0
        self.cursor_length = 0

    def transfer_tokens(self, tokens: Sequence[int] | np.ndarray) -> None:
        """Move the cursor by the tokens, without extending the automaton
        (Spec-Bench fd2c1cd model/samd/sam/static_sam.py:122-124)."""
        tokens = np.asarray(tokens, dtype=np.int64).reshape(-1)
        state, length = _transfer_tokens(self.hash_keys, self.hash_values, self.link, self.length,
                                         self.cursor_state, self.cursor_length, tokens)
        self.cursor_state, self.cursor_length = int(state), int(length)

    def lookup(self, token: int) -> tuple[int, int]:
        """(state, match length) of the cursor moved by ``token``, without moving it
        (Spec-Bench fd2c1cd model/samd/sam/static_sam.py:126-129)."""
        state, length = _transfer_tokens(self.hash_keys, self.hash_values, self.link, self.length,
                                         self.cursor_state, self.cursor_length, np.array([token], np.int64))
        return int(state), int(length)

    def transitions(self, state: int) -> list[tuple[int, int]]:
        """(token, target) of every transition of ``state`` in insertion order (the reference's dict order)."""
        out = []
        e = int(self.first_edge[state])
        while e != -1:
            token = int(self.edge_token[e])
            out.append((token, int(_target(self.hash_keys, self.hash_values, state, token))))
            e = int(self.edge_next[e])
        return out[::-1]

    # ---- drafts -----------------------------------------------------------------------------------------

    def draft(self, state: int, start_token: int, n_predicts: int) -> list[int]:
        """``start_token`` and the corpus text after the earliest occurrence of the match, ``n_predicts``
        tokens in all, padded with token 0 (Spec-Bench fd2c1cd model/samd/sam/static_sam.py:152-158). Unlike the dynamic
        automaton's draft the match is not shortened first (the reference has that call commented out,
        :153), and the text runs on across documents and their eos tokens, as the reference's does."""
        end = int(self.min_endpos[state])
        draft = [int(start_token)] + self.tokens[end + 1 : end + n_predicts].tolist()
        draft.extend([0] * (n_predicts - len(draft)))
        return draft

    def children(self, state: int, top_k: int = 8) -> list[tuple[int, int, int]]:
        """(token, target, target's count) of the ``top_k`` transitions of ``state`` with the largest
        counts, largest first, equal counts in insertion order (Spec-Bench fd2c1cd model/samd/sam/static_sam.py:141-150)."""
        tokens, states, counts = (np.empty(top_k, np.int64) for _ in range(3))
        m = _top_children(self.hash_keys, self.hash_values, self.count, self.first_edge, self.edge_token,
                          self.edge_next, state, top_k, tokens, states, counts)
        return list(zip(tokens[:m].tolist(), states[:m].tolist(), counts[:m].tolist()))

    def probable_tree(self, state: int, match_length: int, start_token: int, n_predicts: int,
                      alpha: float = 4.0, top_k: int = 8) -> tuple[list[int], list[int]]:
        """A tree of n = min(n_predicts, 1 + int(match_length * alpha)) likely continuations of the match
        (``gen_dyn_draft``, Spec-Bench fd2c1cd model/samd/sam/static_sam.py:194-227): tokens in the order the nodes were
        taken, root (``start_token``) first, and each node's parent index (-1 for the root).

        Best-first search: a heap holds candidates keyed by minus the product of the
        count(child) / count(parent) ratios along the path (the root -1.0); the best one is taken unless its
        depth already has ``top_k`` nodes (then it is dropped), and its children, the ``top_k`` transitions
        with the largest counts, are pushed. Ties: candidates compare on the probability alone, and the heap
        reproduces CPython's heapq step by step (``_heap_push``/``_heap_pop``), so equal-probability
        candidates come out in exactly the order the reference's heap gives them (not in push order).
        The reference picks children from a top-8 list made at build time, so ``top_k`` above 8 differs
        from it.
        """
        n = min(n_predicts, 1 + int(match_length * alpha))
        if n <= 0:
            return [], []
        if state == 0 and n > 1:
            raise ValueError("probable_tree from the root: the root has no end-position count (a match of "
                             "length 0 gives a tree of one node)")
        tokens, parents = _probable_tree(self.hash_keys, self.hash_values, self.count, self.first_edge,
                                         self.edge_token, self.edge_next, state, start_token, n, top_k)
        return tokens.tolist(), parents.tolist()
