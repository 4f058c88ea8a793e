"""What the target really receives for a tree draft, through the real loop and the tiny model: the tokens, their
position ids and the [q, q] block of the attention mask of each verification pass, worked out by hand.

Equal outputs cannot show these: a wrong position or a node that sees its sibling changes the target's choices
only where they happen to matter, and a greedy run stays lossless as long as the accepted path's own inputs are
right. So the pass's inputs are pinned directly, recorded by a Target that wraps the tiny model's."""

import torch

from specbench.decoding.contract import Draft, Drafter
from specbench.decoding.loop import Decoder
from specbench.decoding.target import Target
from specbench.testing import greedy_reference


class RecordingTarget(Target):
    """The wrapped target, unchanged, with a copy of every verification pass's inputs kept in ``passes``."""

    def __init__(self, inner: Target):
        self.inner = inner
        self.vocab_size, self.num_layers, self.device = inner.vocab_size, inner.num_layers, inner.device
        self.passes = []

    def start(self, capacity):
        self.inner.start(capacity)

    def release(self):
        self.inner.release()

    @property
    def length(self):
        return self.inner.length

    def prefill(self, prompt_ids, every_position, top_k):
        return self.inner.prefill(prompt_ids, every_position, top_k)

    def verify(self, inputs, n_nodes, top_k):
        self.passes.append((inputs.tokens.tolist(), inputs.positions.tolist(), inputs.visible.astype(int).tolist(),
                            inputs.start, n_nodes))
        return self.inner.verify(inputs, n_nodes, top_k)

    def keep(self, start, nodes):
        self.inner.keep(start, nodes)

    def truncate(self, length):
        self.inner.truncate(length)

    def synchronize(self):
        self.inner.synchronize()

    def upload(self, array, role="upload"):
        return self.inner.upload(array, role)


class OneTree(Drafter):
    """Drafts ``tokens`` with ``parents`` at its first step, nothing after."""

    name = "one-tree"

    def __init__(self, tokens, parents):
        self.tokens, self.parents = tokens, parents

    def begin(self, prompt_ids):
        self.drafted = False

    def propose(self, context_ids):
        if self.drafted:
            return Draft.empty()
        self.drafted = True
        return Draft(torch.tensor(self.tokens), parents=torch.tensor(self.parents))

    def accept(self, accepted_ids, outcome):
        pass


def test_a_tree_is_verified_at_its_depths_each_node_seeing_its_ancestors_only(each_target, tiny, prompt_ids):
    ids = prompt_ids[0]
    g1, g2, g3, g4, g5 = greedy_reference(tiny.weights.module, ids, 5)
    other = (g2 + 1) % each_target.vocab_size  # a wrong first token: the rejected sibling
    # The root's two children, the wrong one first, and a grandchild under the right one:
    #   root (g1) -+- other          nodes: 0 = root, 1 = other, 2 = g2, 3 = g3 (parent node 2)
    #              +- g2 -- g3
    target = RecordingTarget(each_target)
    generation = Decoder(target, frozenset(), 80).generate(ids, OneTree([other, g2, g3], [-1, -1, 1]), 5)
    assert generation.token_ids == [g1, g2, g3, g4, g5]
    prompt = len(ids)  # the prefill cached the prompt; the root, g1, is written at position len(prompt)
    tokens, positions, visible, start, n_nodes = target.passes[0]
    assert (tokens, start, n_nodes) == ([g1, other, g2, g3], prompt, 4)
    assert positions == [prompt, prompt + 1, prompt + 1, prompt + 2]  # the root's position plus the node's depth
    assert visible == [[1, 0, 0, 0],   # root: itself
                       [1, 1, 0, 0],   # other: the root and itself
                       [1, 0, 1, 0],   # g2: the root and itself, not its sibling before it
                       [1, 0, 1, 1]]   # g3: the root, its parent g2 and itself
    # g2 and g3 accepted, g4 the bonus: the next pass (an empty draft) writes the root g4 after the three kept.
    assert target.passes[1] == ([g4], [prompt + 3], [[1]], prompt + 3, 1)
    step = generation.steps[1]
    assert (step.accepted_tokens, step.draft_depth, step.verify_tokens) == (3, 2, 4)  # g2, g3 and the bonus g4
