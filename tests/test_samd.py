"""SAM-Decoding's drafter and specbench's hybrid on hand-made contexts: which source drafts, and what."""

import numpy as np
import pytest
from test_recycling import FakeTarget

from specbench.datastores.suffix_automaton import StaticSuffixAutomaton
from specbench.decoding.contract import StepOutcome
from specbench.drafters.hybrid import HybridDrafter, TokenTrie
from specbench.drafters.samd import SuffixAutomatonDrafter
from specbench.errors import SpecbenchError

VOCAB = 128
EOS = 99


def samd(auxiliary="recycling", corpus_documents=None, **settings):
    drafter = SuffixAutomatonDrafter(auxiliary=auxiliary, corpus=None, **settings)
    drafter.prepare(FakeTarget(vocab=VOCAB, eos=(EOS,)))
    if corpus_documents is not None:
        drafter.static = StaticSuffixAutomaton.build([np.array(d, dtype=np.int32) for d in corpus_documents], EOS,
                                                     progress=False)
    return drafter


def propose(drafter, context):
    context = np.array(context, dtype=np.int64)
    drafter.begin(context[:3])
    return drafter.propose(context)


def test_with_an_auxiliary_a_short_match_falls_back_to_recycling():
    drafter = samd()
    # The newest token 5 extends "1 2 3 4" to a 5-token match of the first occurrence: a context sequence.
    draft = propose(drafter, [1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2, 3, 4, 5])
    assert set(draft.sources) == {"context"} and draft.parents is None
    # 39 tokens: the match is shortened to "5" (its earliest occurrence leaves more room), then padded with 0.
    assert draft.token_ids.tolist() == [6, 7, 8, 9, 1, 2, 3, 4] + [0] * 31
    # One token shorter, the match is 4 < len_threshold: Token Recycling's 60-node tree.
    draft = propose(drafter, [1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2, 3, 4])
    assert set(draft.sources) == {"recycling"} and len(draft) == 60 and draft.parents is not None


def test_the_corpus_match_counts_len_bias_tokens_less():
    corpus = [list(range(10, 26))]
    drafter = samd(corpus_documents=corpus)
    # The context never repeats itself; in the corpus its last 10 tokens match: 10 - len_bias 5 = 5, enough.
    draft = propose(drafter, list(range(10, 20)))
    assert set(draft.sources) == {"corpus"}
    assert draft.token_ids.tolist() == [20, 21, 22, 23, 24, 25, EOS] + [0] * 32
    # A 9-token match counts 4: the auxiliary drafts.
    draft = propose(drafter, list(range(11, 20)))
    assert set(draft.sources) == {"recycling"}
    # Without the bias the 9-token corpus match would have drafted.
    draft = propose(samd(corpus_documents=corpus, len_bias=0), list(range(11, 20)))
    assert set(draft.sources) == {"corpus"}


def test_without_an_auxiliary_the_draft_grows_with_the_match():
    drafter = samd(auxiliary="none")
    text = list(range(1, 30))
    # A match of 2 drafts min(40, 1 + int(4 * 2)) - 1 = 8 tokens, of 3: 12, copied from the first occurrence.
    assert propose(drafter, text + [1, 2]).token_ids.tolist() == list(range(3, 11))
    assert propose(drafter, text + [1, 2, 3]).token_ids.tolist() == list(range(4, 16))
    assert drafter.target_top_k == 0 and not drafter.reads_prompt_choices
    # A longer corpus match wins, as a tree of its most frequent continuations.
    drafter = samd(auxiliary="none", corpus_documents=[[40, 41, 42, 43], [40, 41, 42, 44], [40, 41, 42, 44]])
    draft = propose(drafter, [7, 40, 41, 42])
    # Best first: 44 (2 of 3 continuations), the EOS after it (2/3 x 1), then 43 (1/3).
    assert draft.token_ids.tolist()[:3] == [44, EOS, 43] and draft.parents.tolist()[:3] == [-1, 0, -1]


def test_the_automata_hold_everything_but_the_newest_token():
    drafter = samd()
    context = [5, 6, 7, 8, 9]
    propose(drafter, context)
    assert drafter.context.text[1:] == context[:-1]
    drafter.propose(np.array(context + [10, 11]))
    assert drafter.context.text[1:] == context + [10]


def test_every_pass_feeds_the_auxiliary_whichever_source_drafted():
    drafter = samd()
    draft = propose(drafter, [1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2, 3, 4, 5])
    assert set(draft.sources) == {"context"}
    top = np.tile(np.arange(50, 58), (len(draft) + 1, 1))
    top[:, 0] = 60 + np.arange(len(draft) + 1) % 8
    drafter.accept(np.array([6, 7]), StepOutcome(step=1, draft=draft, target_tokens=top[:, 0], accepted_nodes=(0,),
                                                 target_top_ids=top))
    assert drafter.recycling.successors[5].tolist() == top[0].tolist()  # the root's row
    assert drafter.recycling.successors[6].tolist() == top[1].tolist()
    # an EOS accepted does not stop SAM-Decoding's update (unlike Token Recycling's own loop)
    assert drafter.recycling.update_on_eos and drafter.recycling.reads_prompt_choices


def test_samd_settings_are_checked():
    with pytest.raises(SpecbenchError, match="auxiliary='eagle2'.*recycling, none"):
        SuffixAutomatonDrafter(auxiliary="eagle2", corpus=None)
    with pytest.raises(SpecbenchError, match="len_bias"):
        SuffixAutomatonDrafter(len_bias=-1, corpus=None)


def test_a_trie_merges_shared_paths_and_keeps_the_first_sources_label():
    trie = TokenTrie()
    trie.add_chain([4, 5, 6], "context2")
    node = trie.add(-1, 4, "recycling")
    assert node == 0
    trie.add(node, 7, "recycling")
    draft = trie.draft()
    assert draft.token_ids.tolist() == [4, 5, 6, 7]
    assert draft.parents.tolist() == [-1, 0, 1, 0]
    assert draft.sources == ("context2", "context2", "context2", "recycling")


def test_the_hybrid_labels_context_nodes_by_match_length_and_adds_the_matrix_tree():
    drafter = HybridDrafter(context_tokens=4, label_max_match=3)
    drafter.prepare(FakeTarget(vocab=VOCAB, eos=(EOS,)))
    context = np.array([1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2, 3, 4, 5])
    drafter.begin(context[:3])
    draft = drafter.propose(context)
    # "1 2 3 4 5" matched (5 tokens, labelled 3 = the cap): the 4 tokens after its first occurrence, then the
    # matrix's tree (all zeros here: an empty matrix proposes token 0 everywhere, merged into few nodes).
    assert draft.token_ids.tolist()[:4] == [6, 7, 8, 9]
    assert draft.sources[:4] == ("context3",) * 4
    assert set(draft.sources[4:]) == {"recycling"}
    pairs = list(zip(draft.parents.tolist(), draft.token_ids.tolist()))
    assert len(pairs) == len(set(pairs))
    with pytest.raises(SpecbenchError, match="needs a source"):
        HybridDrafter(context_tokens=0, recycling_template=None)
    with pytest.raises(SpecbenchError, match="recycling_when='never'.*always, no_match"):
        HybridDrafter(recycling_when="never")
    # Falling back in SAM-Decoding's order: the matrix only when nothing matched.
    fallback = HybridDrafter(context_tokens=4, recycling_when="no_match")
    fallback.prepare(FakeTarget(vocab=VOCAB, eos=(EOS,)))
    fallback.begin(context[:3])
    assert fallback.propose(context).token_ids.tolist() == [6, 7, 8, 9]
    fallback.begin(np.array([1, 2, 3]))
    assert set(fallback.propose(np.array([1, 2, 3, 50])).sources) == {"recycling"}  # 50 never occurred


def test_the_hybrid_keyed_by_two_tokens_prefers_the_pairs_row_and_falls_back_to_the_tokens():
    drafter = HybridDrafter(context_tokens=0, recycling_context=2)
    drafter.prepare(FakeTarget(vocab=VOCAB, eos=(EOS,)))
    drafter.begin(np.array([1, 2]))
    drafter.recycling.successors[3] = np.arange(40, 48)  # token 3 alone
    drafter.recycling.successors[40] = np.arange(50, 58)
    drafter.pairs[(2, 3)] = np.arange(60, 68)  # 3 after 2
    draft = drafter.propose(np.array([1, 2, 3]))
    tokens = draft.token_ids.tolist()
    assert tokens[0] == 60  # the pair's best, not the token's (40)
    # After 9 then 3 no pair was verified: the token's row.
    drafter.begin(np.array([9]))
    draft = drafter.propose(np.array([9, 3]))
    tokens = draft.token_ids.tolist()
    assert tokens[0] == 40
    # Verified nodes record (their parent's token, their token); unverified rows (-1) are skipped.
    top = np.full((len(draft) + 1, 8), -1)
    top[0] = 70
    top[1] = 71
    drafter.accept(np.array([5]), StepOutcome(step=1, draft=draft, target_tokens=top[:, 0], accepted_nodes=(),
                                              target_top_ids=top))
    assert drafter.pairs[(9, 3)].tolist() == [70] * 8  # the root 3 after 9
    assert drafter.pairs[(3, 40)].tolist() == [71] * 8
    assert len(drafter.pairs) == 3  # (2, 3) set by hand, and the two verified nodes
    other = HybridDrafter(context_tokens=0, recycling_context=2)
    other.prepare(FakeTarget(vocab=VOCAB, eos=(EOS,)))
    other.restore(drafter.state())
    assert {k: v.tolist() for k, v in other.pairs.items()} == {k: v.tolist() for k, v in drafter.pairs.items()}
