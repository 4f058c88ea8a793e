"""SuffixDecoding (Oliaro et al., "SuffixDecoding: Extreme Speculative Decoding for Emerging AI Applications",
arXiv 2411.04975, NeurIPS 2025), as vLLM's ``suffix`` method runs it on ArcticInference's suffix cache.

Two suffix trees, each holding every suffix of its sequences cut to ``max_tree_depth`` tokens, with a count per
node (how many of those suffixes pass through or end there):
- a per-request tree of the prompt and the output so far (one sequence, extended as tokens are accepted);
- a global tree of previous responses (one sequence per request, the current response included as it grows),
  kept across questions, oldest response evicted first beyond ``max_cached_requests``.

A draft (ArcticInference csrc/suffix_decoding/suffix_tree.cc ``speculate``, ``_speculate_path``): for every
match length m = 1, 2, ... of the context's last tokens (the last ``max_tree_depth`` of them, m up to one
fewer) that the tree holds, walk down from the matched node always to the most frequent child, the draft
token's probability being the product of child count / parent count along the way, and stop at
``min(max_spec_tokens, int(m * max_spec_factor + max_spec_offset))`` tokens, at a probability below
``min_token_prob``, or where the tree ends (depth ``max_tree_depth``). The draft's score is the sum of its
tokens' probabilities; the best score over m wins, a longer match on a tie. The per-request tree's draft is
kept unless the global tree's scores strictly higher (cache.py ``speculate``). ``tree_spec`` drafts a tree
instead: best-first by probability up to the same length (``_speculate_tree``, the paper's simulator option;
vLLM and ArcticInference's own vLLM plugin draft the path).

A node's count is the number of occurrences of its string in the tree's sequences (a string of at most
``max_tree_depth`` tokens is in every depth-cut suffix that starts where it occurs), so this module keeps the
sequences themselves and counts occurrences when it drafts, rather than building the tree: the same counts,
the same drafts. Where two continuations have the same count, the order of the reference's sibling lists
decides, which this module follows where the history it needs is just the order of occurrences (see
``_children``).
"""

from __future__ import annotations

import copy
import heapq
import itertools
from dataclasses import dataclass, field

import numpy as np
import torch

from specbench.decoding.contract import Draft, Drafter, StepOutcome
from specbench.drafters.base import require_flag, require_non_negative, require_number, require_positive
from specbench.errors import SpecbenchError

BOUNDARY = -1  # between two sequences of one tree: no occurrence spans it and nothing follows it


class TokenSequences:
    """The sequences of one suffix tree, end to end in one growing buffer with ``BOUNDARY`` between them.

    ``extend`` appends to the newest sequence; ``start`` opens a new one; ``ends_of`` finds where a string
    occurs (the positions of its last tokens), which is all the counts a suffix tree holds."""

    def __init__(self):
        self._buffer = np.empty(1024, dtype=np.int64)
        self._length = 0
        self.lengths: list[int] = []  # tokens per sequence, oldest first

    @property
    def tokens(self) -> np.ndarray:
        """The buffer so far (a view: read-only use)."""
        return self._buffer[: self._length]

    def start(self) -> None:
        if self.lengths:
            self._append(np.array([BOUNDARY], dtype=np.int64))
        self.lengths.append(0)

    def extend(self, tokens) -> None:
        if not self.lengths:
            self.lengths.append(0)
        tokens = np.asarray(tokens, dtype=np.int64)
        self._append(tokens)
        self.lengths[-1] += tokens.size

    def _append(self, tokens: np.ndarray) -> None:
        needed = self._length + tokens.size
        if needed > self._buffer.size:
            grown = np.empty(max(needed, 2 * self._buffer.size), dtype=np.int64)
            grown[: self._length] = self._buffer[: self._length]
            self._buffer = grown
        self._buffer[self._length : needed] = tokens
        self._length = needed

    def sequences(self) -> list[np.ndarray]:
        """Each sequence's tokens (views into the buffer), oldest first."""
        starts = np.concatenate(([0], np.cumsum(np.array(self.lengths[:-1], dtype=np.int64) + 1)))
        return [self.tokens[start : start + length] for start, length in zip(starts.tolist(), self.lengths)]

    @staticmethod
    def of(sequences) -> "TokenSequences":
        """A buffer holding ``sequences`` in order."""
        built = TokenSequences()
        for sequence in sequences:
            built.start()
            built.extend(sequence)
        return built

    def ends_of(self, token: int) -> np.ndarray:
        """Positions holding ``token``: the ends of its one-token occurrences."""
        return np.flatnonzero(self.tokens == token)


@dataclass
class SuffixDraft:
    """A speculation: tokens, each one's parent index (-1: after the context), estimated probabilities, their
    sum (the expected accepted length) and the match length it came from (0: none)."""

    token_ids: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    probs: list[float] = field(default_factory=list)
    score: float = 0.0
    match_len: int = 0

    def add(self, token: int, parent: int, prob: np.float32) -> None:
        self.token_ids.append(int(token))
        self.parents.append(parent)
        self.probs.append(float(prob))
        self.score = float(np.float32(self.score) + prob)  # the reference sums in float32


def _children(tokens: np.ndarray, ends: np.ndarray) -> list[tuple[int, int, np.ndarray]]:
    """The tokens that follow the occurrences ending at ``ends`` (ascending), in the reference's sibling order:
    (token, count, the ends of the occurrences extended by it), the most frequent first. An occurrence at its
    sequence's end has none.

    Between equal counts the reference (0.1.1's sibling lists, suffix_tree.cc ``_increment_count``) keeps count-1
    children in the order they appeared, and puts a child that reaches a higher count at the front of that
    count's group in most cases (behind it when it was not its old group's head, which only its history tells):
    here, the earliest first at count 1, the one that reached its count last first above it. Positions are
    the order tokens were added in, so the latest occurrence is the last one."""
    following = ends + 1
    following = following[following < tokens.size]
    nexts = tokens[following]
    valid = nexts != BOUNDARY
    following, nexts = following[valid], nexts[valid]
    if nexts.size <= 1:
        return [(int(nexts[0]), 1, following)] if nexts.size else []
    values, first, counts = np.unique(nexts, return_index=True, return_counts=True)
    last = nexts.size - 1 - np.unique(nexts[::-1], return_index=True)[1]
    # Sort keys: count descending; then first occurrence (count 1) or last occurrence descending (count > 1).
    order = np.lexsort((np.where(counts == 1, first, -last), -counts))
    return [(int(values[i]), int(counts[i]), following[nexts == values[i]]) for i in order.tolist()]


def speculate_path(tokens: np.ndarray, ends: np.ndarray, max_tokens: int, min_token_prob: float) -> SuffixDraft:
    """The path draft from the string whose occurrences end at ``ends`` (``_speculate_path``): always the most
    frequent continuation (``_children``'s first), its probability the running product of child count over
    parent count, stopping at ``max_tokens`` tokens or below ``min_token_prob``."""
    draft = SuffixDraft()
    prob, threshold = np.float32(1.0), np.float32(min_token_prob)  # float32, as the reference computes
    while len(draft.token_ids) < max_tokens:
        if ends.size == 1:
            # One occurrence: every ratio is 1 from here to its sequence's end (or the draft's length).
            start = int(ends[0]) + 1
            rest = tokens[start : start + max_tokens - len(draft.token_ids)]
            cut = np.flatnonzero(rest == BOUNDARY)
            for token in (rest[: cut[0]] if cut.size else rest).tolist():
                draft.add(token, len(draft.token_ids) - 1, prob)
            break
        children = _children(tokens, ends)
        if not children:
            break
        token, count, following = children[0]
        prob = prob * (np.float32(count) / np.float32(ends.size))
        if prob < threshold:
            break
        draft.add(token, len(draft.token_ids) - 1, prob)
        ends = following
    return draft


def speculate_tree(tokens: np.ndarray, ends: np.ndarray, max_tokens: int, min_token_prob: float,
                   max_depth: int | None = None) -> SuffixDraft:
    """The tree draft from the string whose occurrences end at ``ends`` (``_speculate_tree``): the most probable
    open node first (the earlier opened on a tie), a child's probability its parent's times child count over
    parent count, children below ``min_token_prob`` never opened, until ``max_tokens`` tokens; no node deeper
    than ``max_depth`` below the match (where the suffix tree ends; None: no limit)."""
    draft = SuffixDraft()
    order = itertools.count()
    open_nodes: list = []
    threshold = np.float32(min_token_prob)

    def open_children(node_ends: np.ndarray, prob: np.float32, parent: int, depth: int) -> None:
        if max_depth is not None and depth >= max_depth:
            return
        for token, count, following in _children(tokens, node_ends):
            child_prob = prob * np.float32(count) / np.float32(node_ends.size)  # float32, in the reference's order
            if child_prob >= threshold:
                heapq.heappush(open_nodes, (-child_prob, next(order), token, following, parent, depth + 1))

    open_children(ends, np.float32(1.0), -1, 0)
    while open_nodes and len(draft.token_ids) < max_tokens:
        negative_prob, _, token, node_ends, parent, depth = heapq.heappop(open_nodes)
        draft.add(token, parent, -negative_prob)
        open_children(node_ends, -negative_prob, len(draft.token_ids) - 1, depth)
    return draft


def _one_token_longer(tokens: np.ndarray, ends: np.ndarray, pattern: np.ndarray, match_len: int) -> np.ndarray:
    """Of the occurrences of ``pattern``'s last ``match_len - 1`` tokens (ending at ``ends``), those that match
    its last ``match_len``: one token further back."""
    ends = ends[ends >= match_len - 1]
    return ends[tokens[ends - (match_len - 1)] == pattern[-match_len]]


def match_ends(sequences: TokenSequences, pattern: np.ndarray, match_len: int) -> np.ndarray:
    """Where the last ``match_len`` tokens of ``pattern`` occur in ``sequences`` (the positions of their ends)."""
    ends = sequences.ends_of(int(pattern[-1]))
    for length in range(2, match_len + 1):
        ends = _one_token_longer(sequences.tokens, ends, pattern, length)
    return ends


def speculate(sequences: TokenSequences, pattern: np.ndarray, max_depth: int, max_spec_tokens: int,
              max_spec_factor: float, max_spec_offset: float, min_token_prob: float,
              tree: bool = False) -> SuffixDraft:
    """The best draft of one tree for the context's last tokens ``pattern`` (``SuffixTree::speculate``): every
    match length m from 1 to len(pattern) - 1 that occurs, each allowed ``int(m * factor + offset)`` tokens (at
    most ``max_spec_tokens``), none deeper than the tree's ``max_depth``; the highest score wins, the longer
    match on a tie."""
    tokens = sequences.tokens
    best = SuffixDraft()
    if pattern.size < 2 or tokens.size == 0:
        return best
    ends = sequences.ends_of(int(pattern[-1]))
    for match_len in range(1, pattern.size):
        if match_len > 1:
            ends = _one_token_longer(tokens, ends, pattern, match_len)
        if ends.size == 0:
            break
        scaled = float(np.float32(match_len) * np.float32(max_spec_factor) + np.float32(max_spec_offset))
        allowed = max(min(max_spec_tokens, int(scaled + 1e-6)), 0)
        # The tree holds strings of at most max_depth tokens: a path draft is that deep at most, a tree no deeper.
        if tree:
            draft = speculate_tree(tokens, ends, allowed, min_token_prob, max_depth - match_len)
        else:
            draft = speculate_path(tokens, ends, min(allowed, max_depth - match_len), min_token_prob)
        if draft.score >= best.score:
            best = draft
            best.match_len = match_len
    return best


class FinishedResponses:
    """The responses of finished questions that a SuffixDecoding drafter's forks share, oldest first, at most
    ``capacity`` (the oldest evicted first, as the cache evicts)."""

    def __init__(self, responses, capacity: int):
        self.capacity = capacity
        self.responses: list[np.ndarray] = list(responses)[-capacity:] if capacity else []

    def add(self, response: np.ndarray) -> None:
        self.responses = (self.responses + [response])[-self.capacity:]

    def latest(self, count: int) -> list[np.ndarray]:
        return self.responses[max(0, len(self.responses) - count):] if count > 0 else []


class SuffixDecoding(Drafter):
    """SuffixDecoding's drafter (see the module docstring); vLLM's defaults (SpeculativeConfig, ``suffix``).

    max_tree_depth:      tokens per suffix in both trees; also the context tail matched (vLLM: 24)
    max_cached_requests: responses the global tree keeps, oldest evicted first; 0 = no global tree (10000)
    max_spec_tokens:     longest draft; null = max_tree_depth (vLLM's num_speculative_tokens default)
    max_spec_factor:     tokens drafted per matched token (1.0)
    max_spec_offset:     tokens drafted beyond that (0.0)
    min_token_prob:      lowest estimated probability drafted (0.1)
    tree_spec:           draft a tree, best-first by probability (the paper's simulator); false: the path (vLLM)
    warm_up_teaches:     keep the warm-up's responses in the global tree; false (default): the first measured
                         question meets an empty one (the warm-up decodes that very question, whose answer would
                         otherwise be in the cache)
    """

    def __init__(self, name: str = "suffix", max_tree_depth: int = 24, max_cached_requests: int = 10000,
                 max_spec_tokens: int | None = None, max_spec_factor: float = 1.0, max_spec_offset: float = 0.0,
                 min_token_prob: float = 0.1, tree_spec: bool = False, warm_up_teaches: bool = False):
        require_positive(max_tree_depth=max_tree_depth)
        require_non_negative(max_cached_requests=max_cached_requests)
        if max_spec_tokens is not None:
            require_positive(max_spec_tokens=max_spec_tokens)
        longest = max_tree_depth if max_spec_tokens is None else max_spec_tokens
        # A draft is min(max_spec_tokens, int(m x factor + offset)) tokens for a match of m >= 1, computed in float32
        # as the reference does: at max_spec_tokens either already drafts the most from every match, and a larger
        # finite value changes nothing but could overflow float32 (1e39 is inf there) and fail int() mid-run.
        bound = f"at max_spec_tokens={longest} every match already drafts max_spec_tokens tokens"
        require_number("max_spec_factor", max_spec_factor, low=0, high=longest, why=bound)
        require_number("max_spec_offset", max_spec_offset, low=0, high=longest, why=bound)
        require_number("min_token_prob", min_token_prob, low=0, high=1)
        require_flag(tree_spec=tree_spec, warm_up_teaches=warm_up_teaches)
        self.name = name
        self.max_tree_depth = max_tree_depth
        self.max_cached_requests = max_cached_requests
        self.max_spec_tokens = max_tree_depth if max_spec_tokens is None else max_spec_tokens
        self.max_spec_factor = float(max_spec_factor)
        self.max_spec_offset = float(max_spec_offset)
        self.min_token_prob = float(min_token_prob)
        self.tree_spec = tree_spec
        self.warm_up_teaches = warm_up_teaches
        self.local = TokenSequences()  # the current request's prompt and output
        self.global_tree = TokenSequences()  # the cached responses, oldest first, then the open request's
        self._open = False  # whether a request is open (its response the global tree's last sequence)
        # The finished responses that forks decoding questions at the same time share (``fork``); None: this drafter
        # decodes one question at a time and its global tree is the cache itself.
        self._shared: FinishedResponses | None = None

    @property
    def responses(self) -> list[np.ndarray]:
        """The global tree's finished responses, oldest first (the open request's is not one yet)."""
        sequences = self.global_tree.sequences()
        return sequences[:-1] if self._open else sequences

    # ---- one request per turn: the prompt into a fresh per-request tree, the response into both ---------

    def begin(self, prompt_ids: np.ndarray) -> None:
        self.local = TokenSequences()
        self.local.extend(prompt_ids)
        if self.max_cached_requests == 0:
            return
        if self._shared is not None:  # a fork: the responses finished so far, then its own
            self.global_tree = TokenSequences.of(self._shared.latest(self.max_cached_requests - 1))
            self.global_tree.start()
            self._open = True
            return
        self._open = False  # the previous request's response is a finished one now
        # The new request takes a slot of the cache too (cache.py _generate_seq_id, _maybe_evict_requests).
        kept = self.max_cached_requests - 1
        if len(self.global_tree.lengths) > kept:
            self.global_tree = TokenSequences.of(self.responses[len(self.global_tree.lengths) - kept:])
        self.global_tree.start()
        self._open = True

    def accept(self, accepted_ids: np.ndarray, outcome: StepOutcome) -> None:
        self.local.extend(accepted_ids)
        if self.max_cached_requests > 0:
            self.global_tree.extend(accepted_ids)

    def propose(self, context_ids: np.ndarray) -> Draft:
        pattern = context_ids[-self.max_tree_depth:]
        settings = (self.max_tree_depth, self.max_spec_tokens, self.max_spec_factor, self.max_spec_offset,
                    self.min_token_prob, self.tree_spec)
        best, source = speculate(self.local, pattern, *settings), "request"
        if self.max_cached_requests > 0:
            from_responses = speculate(self.global_tree, pattern, *settings)
            if from_responses.score > best.score:  # the per-request tree's draft on a tie (cache.py speculate)
                best, source = from_responses, "responses"
        if not best.token_ids:
            return Draft.empty()
        tokens = torch.tensor(best.token_ids, dtype=torch.long)
        parents = torch.tensor(best.parents, dtype=torch.long) if self.tree_spec else None
        return Draft(tokens, parents=parents, sources=(source,) * len(best.token_ids))

    # ---- questions decoded at the same time (a serving engine's batch) ------------------------------------

    def fork(self) -> SuffixDecoding:
        """A fork with its own per-request tree and a global tree of its own, begun from the responses finished
        before its question began (those this drafter held, then those of forks that have ended), its own response
        last. specbench's global tree holds one open response, so a fork sees another fork's response once that
        question has ended, where ArcticInference's cache (vLLM's ``suffix``) adds every active response as it grows."""
        forked = copy.copy(self)
        forked.local, forked.global_tree, forked._open = TokenSequences(), TokenSequences(), False
        if self.max_cached_requests > 0:
            if self._shared is None:
                self._shared = FinishedResponses(self.responses, self.max_cached_requests)
            forked._shared = self._shared
        return forked

    def fork_ended(self) -> None:
        if self._shared is not None and self._open:
            self._shared.add(self.global_tree.sequences()[-1].copy())
            self._open = False

    # ---- the global tree carried across questions --------------------------------------------------------

    def state(self) -> dict[str, np.ndarray] | None:
        if self.max_cached_requests == 0:
            return None
        lengths = np.array(self.global_tree.lengths, dtype=np.int64)
        tokens = self.global_tree.tokens
        return {"response_tokens": tokens[tokens != BOUNDARY].copy(), "response_lengths": lengths}

    def restore(self, state: dict[str, np.ndarray]) -> None:
        tokens, lengths = state["response_tokens"], state["response_lengths"]
        if lengths.ndim != 1 or (lengths < 0).any() or int(lengths.sum()) != tokens.size:
            raise SpecbenchError(f"the saved SuffixDecoding responses do not add up: lengths sum to "
                                 f"{int(lengths.sum())} tokens, {tokens.size} saved")
        bounds = np.concatenate(([0], np.cumsum(lengths)))[-self.max_cached_requests - 1:]
        self.global_tree = TokenSequences.of(tokens[start:end] for start, end in zip(bounds[:-1], bounds[1:]))
        self._open = False
