"""Where the loop's time goes: every operation's time must land in the phase the docs name, with device work
that runs asynchronously (as on a GPU) billed to the phase that queued it. A fake timeline plays the device:
host work advances the clock at once, device work only when the clock is fenced (synchronised)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import ScriptedDrafter

import specbench.decoding.loop as loop
from specbench.decoding.contract import Draft
from specbench.targets.kv_cache import TreeKVCache
from specbench.decoding.loop import Decoder, FencedClock, VerifyShapes
from specbench.targets.transformers import TransformersTarget
from specbench.decoding.plan import plan_verification
from specbench.decoding.sampling import Sampling
from specbench.testing import CountingTarget, greedy_reference

# Seconds of each operation: powers of two, so every sum of them is exact and tells which operations it holds.
BEGIN, PROPOSE_HOST, PROPOSE_DEVICE, ACCEPT_HOST, ACCEPT_DEVICE = 1.0, 2.0, 4.0, 8.0, 16.0
FORWARD, PLAN, INPUTS, WALK, COMPACT = 32.0, 64.0, 128.0, 256.0, 512.0


class Timeline:
    def __init__(self):
        self.host = 0.0
        self.queued = 0.0

    def host_work(self, seconds):
        self.host += seconds

    def device_work(self, seconds):
        self.queued += seconds

    def synchronize(self):
        self.host += self.queued
        self.queued = 0.0

    def now(self):
        return self.host


class DeviceModel(torch.nn.Module):
    """The tiny target, whose every forward pass queues FORWARD seconds of device work."""

    def __init__(self, inner, timeline):
        super().__init__()
        self.inner = inner
        self.timeline = timeline

    @property
    def config(self):
        return self.inner.config

    def forward(self, **kwargs):
        self.timeline.device_work(FORWARD)
        return self.inner(**kwargs)


class TimedDrafter(ScriptedDrafter):
    queues_device_work = True

    def __init__(self, timeline, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.timeline = timeline

    def begin(self, prompt_ids):
        self.timeline.host_work(BEGIN)
        super().begin(prompt_ids)

    def propose(self, context_ids):
        self.timeline.host_work(PROPOSE_HOST)
        self.timeline.device_work(PROPOSE_DEVICE)
        return super().propose(context_ids)

    def accept(self, accepted_ids, outcome):
        self.timeline.host_work(ACCEPT_HOST)
        self.timeline.device_work(ACCEPT_DEVICE)


def charge(timeline, function, seconds, on_device=False):
    def charged(*args, **kwargs):
        (timeline.device_work if on_device else timeline.host_work)(seconds)
        return function(*args, **kwargs)
    return charged


@pytest.fixture
def timed(monkeypatch, tiny):
    timeline = Timeline()
    monkeypatch.setattr(loop, "plan_verification", charge(timeline, loop.plan_verification, PLAN))
    monkeypatch.setattr(loop, "verification_inputs", charge(timeline, loop.verification_inputs, INPUTS))
    monkeypatch.setattr(loop, "greedy_accepted_path", charge(timeline, loop.greedy_accepted_path, WALK))
    monkeypatch.setattr(loop, "sampled_accepted_path", charge(timeline, loop.sampled_accepted_path, WALK))
    monkeypatch.setattr(TreeKVCache, "keep_nodes", charge(timeline, TreeKVCache.keep_nodes, COMPACT, on_device=True))
    return timeline, TimedTarget(DeviceModel(tiny.weights.module, timeline), timeline)


class TimedTarget(TransformersTarget):
    """The target of a DeviceModel, whose device-to-host read waits for the queued work, as on a GPU."""

    def __init__(self, model, timeline):
        super().__init__(model)
        self.timeline = timeline

    def _download(self, tensor):
        self.timeline.synchronize()
        return super()._download(tensor)


class Observed:
    def __init__(self):
        self.calls = []

    def observe(self, size, seconds):
        self.calls.append((size, seconds))


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_every_operation_lands_in_its_phase(timed, tiny, prompt_ids, temperature):
    timeline, model = timed
    ids = prompt_ids[0]
    reference = greedy_reference(tiny.weights.module, ids, 12)
    drafter = TimedDrafter(timeline, reference, length=3, mode="right")
    cost = Observed()
    decoder = Decoder(model, frozenset(), max_draft_tokens=8, verify_cost=cost,
                      sampling=Sampling(temperature=temperature),
                      clock=FencedClock(timeline.synchronize, timeline.now))
    generation = decoder.generate(ids, drafter, 12)

    prefill, *steps = generation.steps
    assert (prefill.draft_s, prefill.verify_s) == (BEGIN + ACCEPT_HOST + ACCEPT_DEVICE, FORWARD)
    assert prefill.overhead_s == 0.0
    assert steps
    for step in steps:
        assert step.draft_s == PROPOSE_HOST + PROPOSE_DEVICE + ACCEPT_HOST + ACCEPT_DEVICE
        assert step.verify_s == FORWARD
        assert step.overhead_s == PLAN + INPUTS + WALK + COMPACT
    # The draft budget's latency model learns from verify_s alone.
    assert cost.calls == [(step.verify_tokens, FORWARD) for step in steps]
    # Nothing happens outside the recorded phases.
    assert generation.wall_s == sum(s.draft_s + s.verify_s + s.overhead_s for s in generation.steps)


def test_an_unfenced_clock_misplaces_device_work(timed, tiny, prompt_ids):
    """The check above can fail: read the clock without synchronising and device work goes missing."""
    timeline, model = timed
    ids = prompt_ids[0]
    drafter = TimedDrafter(timeline, greedy_reference(tiny.weights.module, ids, 8), length=3)
    decoder = Decoder(model, frozenset(), max_draft_tokens=8, clock=FencedClock(lambda: None, timeline.now))
    steps = decoder.generate(ids, drafter, 8).steps[1:]
    assert all(step.verify_s != FORWARD for step in steps)


def test_the_plan_maps_numberings_as_its_docstring_example():
    draft = Draft(torch.tensor([101, 102, 103, 104, 105]), parents=torch.tensor([-1, 0, 1, -1, 3]))
    plan = plan_verification(draft, root_token=100, max_depth=1, max_nodes=64)
    assert plan.draft_indices.tolist() == [0, 3]
    assert plan.node_tokens.tolist() == [100, 101, 104]
    assert plan.parents.tolist() == [-1, 0, 0]
    assert plan.to_draft(2) == 3
    assert plan.scatter(np.array([7, 8, 9])).tolist() == [7, 8, -1, -1, 9, -1]
    assert plan.candidate_tokens() == 2 and plan.candidate_depth() == 1


def test_non_candidates_are_counted_apart():
    draft = Draft(torch.tensor([5, 6, 7]), parents=torch.tensor([-1, 0, -1]),
                  candidates=torch.tensor([True, True, False]))
    plan = plan_verification(draft, root_token=1, max_depth=8, max_nodes=64)
    assert plan.candidate_tokens() == 2 and plan.n_nodes == 4 and plan.candidate_depth() == 2


class Recorder(ScriptedDrafter):
    def accept(self, accepted_ids, outcome):
        self.outcomes = getattr(self, "outcomes", []) + [outcome]


@pytest.mark.parametrize("top_k", [0, 3])
def test_outcomes_carry_the_targets_top_k_in_draft_numbering(tiny, prompt_ids, top_k):
    ids = prompt_ids[0]
    reference = greedy_reference(tiny.weights.module, ids, 10)
    drafter = Recorder(reference, length=6, mode="wrong")
    decoder = Decoder(tiny.target, frozenset(), max_draft_tokens=2, target_top_k=top_k)
    decoder.generate(ids, drafter, 10)
    prefill, first, *_ = drafter.outcomes
    assert (prefill.step, first.step) == (0, 1)
    if top_k == 0:
        assert first.target_top_ids is None
        return
    top = first.target_top_ids
    assert top.shape == (1 + len(first.draft), top_k)
    verified = first.target_tokens >= 0
    assert verified.tolist() == [True, True, True, False, False, False, False]  # cut to 2 draft tokens
    assert (top[verified, 0] == first.target_tokens[verified]).all()
    assert (top[~verified] == -1).all()
    assert len(set(top[0].tolist())) == top_k


def test_generation_keeps_the_deciding_top_tokens(tiny, prompt_ids):
    ids = prompt_ids[1]
    reference = greedy_reference(tiny.weights.module, ids, 12)
    generation = Decoder(tiny.target, frozenset(), 8).generate(ids, ScriptedDrafter(reference, 4), 12)
    assert generation.top_ids.shape == (12, 8)
    assert generation.top_ids[:, 0].tolist() == generation.token_ids == reference
    assert (generation.top_logits[:, 0] >= generation.top_logits[:, 1]).all()


class RoundTrips:
    """Counts, per decoding step, what costs a GPU a round trip: synchronisations of the clock's fence, blocking
    reads of the target's choices and uploads (the test kit's CountingTarget around ``target``, which the decoder
    runs), and the operations that read a device scalar (``int(tensor)``, ``.item()``) or need one (``nonzero``),
    which block on a GPU as well."""

    SCALAR_READS = {"aten._local_scalar_dense.default", "aten.nonzero.default", "aten.item.default"}

    def __init__(self, target):
        self.target = CountingTarget(target)
        self.counts = {"scalar_reads": 0}
        self.per_step: list[dict] = []
        self._last = self._all()

    def _all(self) -> dict:
        return {**self.target.counts, **self.counts}

    def synchronize(self):
        self.target.synchronize()

    def on_step(self, generated, elapsed):
        now = self._all()
        self.per_step.append({key: now[key] - self._last[key] for key in now})
        self._last = now


def count_scalar_reads(counter):
    from torch.utils._python_dispatch import TorchDispatchMode

    class Mode(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if str(func) in RoundTrips.SCALAR_READS:
                counter.counts["scalar_reads"] += 1
            return func(*args, **(kwargs or {}))

    return Mode()


class TreeScript(ScriptedDrafter):
    """Two branches per step, the right one second, so that the KV cache must move the accepted nodes."""

    def propose(self, context_ids):
        chain = super().propose(context_ids)
        right = chain.token_ids
        wrong = (right + 1) % self.vocab_size
        parents = list(range(-1, len(right) - 1)) + [-1] + list(range(len(right), 2 * len(right) - 1))
        return Draft(torch.cat([wrong, right]), parents=torch.tensor(parents))


# Per step: (fence synchronisations, blocking reads, uploads, device scalar reads). Greedy: the choices are the
# one read and the compaction the one fence; the uploads are the ids, positions and mask block (+ the node
# offsets when a tree's accepted nodes move). Sampling adds the walk's random draws, read one by one.
ROUND_TRIPS = {
    ("chain", 0.0): (1, 1, 3, 0),
    ("tree", 0.0): (1, 1, 4, 0),
    ("chain", 0.8): (1, 1, 3, None),
}


@pytest.mark.parametrize("shape,temperature", list(ROUND_TRIPS))
def test_round_trips_per_step_are_pinned(monkeypatch, tiny, prompt_ids, shape, temperature):
    counter = RoundTrips(tiny.target)
    ids = prompt_ids[0]
    reference = greedy_reference(tiny.weights.module, ids, 20)
    drafter = (TreeScript if shape == "tree" else ScriptedDrafter)(reference, length=3, mode="right")
    decoder = Decoder(counter.target, frozenset(), 16, sampling=Sampling(temperature=temperature),
                      clock=FencedClock(counter.synchronize))
    with count_scalar_reads(counter):
        generation = decoder.generate(ids, drafter, 20, on_step=counter.on_step)
    if temperature == 0:
        assert generation.token_ids == reference
    syncs, reads, uploads, scalar_reads = ROUND_TRIPS[(shape, temperature)]
    full_steps = counter.per_step[1:-1]  # the first holds the prefill; the last may be cut short by the token budget
    assert full_steps
    for step in full_steps:
        assert (step["syncs"], step["reads"], step["uploads"]) == (syncs, reads, uploads), step
        if scalar_reads is not None:
            assert step["scalar_reads"] == scalar_reads, step
        else:  # sampling: the random draws of the walk, bounded by the nodes it tries, plus the recovered token
            assert 1 <= step["scalar_reads"] <= 3 + 2, step


# What the loop records for the metrics: every per-step quantity a metric reads (draft depth, draft and
# candidate tokens, accepted tokens), checked at the loop against values worked out here from the draft alone.


_CONTINUATIONS: dict = {}


def continuation(tiny, ids, count: int) -> list[int]:
    """The first ``count`` tokens of greedy decoding after ``ids`` (transformers' generate, once per prompt for
    the session: greedy's first k tokens are the same whatever the length asked)."""
    key = (id(tiny.weights.module), tuple(ids))
    if key not in _CONTINUATIONS:
        _CONTINUATIONS[key] = greedy_reference(tiny.weights.module, ids, 28)
    assert count <= 28
    return _CONTINUATIONS[key][:count]


class KnownTree(ScriptedDrafter):
    """A tree of 8 candidate nodes, 5 deep, whose right path is 2 deep, from a known continuation:

        depth:   1            2            3              4   5
                 right[0] --- right[1] --- wrong (node 3)
                 wrong ------ x ---------- x ------------ x - x

    (node order 0: right[0], 1: wrong, 2: right[1], 3: wrong, 4-7: the wrong branch's chain). With
    ``window``, 3 non-candidate nodes follow (a chain from the root, as Lookahead's Jacobi window): the target
    scores them, but they are never accepted and are no part of the draft's depth."""

    DEPTHS = (1, 1, 2, 3, 2, 3, 4, 5)  # of the candidate nodes, restated from the picture above
    RIGHT_PATH = 2

    def __init__(self, continuation, window=False, first_draft_from_prompt=False):
        super().__init__(continuation, length=3)
        self.window = window
        self.first_draft_from_prompt = first_draft_from_prompt

    def propose(self, context_ids):
        done = context_ids.size - self.prompt_length
        right = self.continuation[done: done + 3]
        tokens = [right[0], right[0] + 1, right[1], right[2] + 1, 7, 7, 7, 7]
        parents = [-1, -1, 0, 2, 1, 4, 5, 6]
        if self.window:
            tokens += [11, 12, 13]
            parents += [-1, 8, 9]
        candidates = [True] * 8 + [False] * (len(tokens) - 8)
        return Draft(torch.tensor(tokens) % self.vocab_size, parents=torch.tensor(parents),
                     candidates=torch.tensor(candidates) if self.window else None)


def expected_tree_steps(max_new_tokens, window, first_draft_from_prompt):
    """(draft_depth, draft_tokens, candidate_tokens, accepted_tokens) of each decoding step of KnownTree: the
    budget cuts candidate paths to the tokens left but one (the bonus), never the window."""
    generated, steps = 0 if first_draft_from_prompt else 1, []
    while generated < max_new_tokens:
        room = max_new_tokens - generated - 1
        kept = sum(depth <= room for depth in KnownTree.DEPTHS)
        depth = max((d for d in KnownTree.DEPTHS if d <= room), default=0)
        accepted = min(KnownTree.RIGHT_PATH, room) + 1
        steps.append((depth, kept + 3 * window, kept, accepted))
        generated += accepted
    return steps


def recorded(generation):
    return [(step.draft_depth, step.draft_tokens, step.candidate_tokens, step.accepted_tokens)
            for step in generation.steps[1:]]


@pytest.mark.parametrize("window", [False, True])
@pytest.mark.parametrize("first_draft_from_prompt", [False, True])
def test_a_tree_step_records_the_trees_depth_not_its_node_count(tiny, prompt_ids, window, first_draft_from_prompt):
    ids, max_new_tokens = prompt_ids[0], 11  # 11: the last steps are cut by the budget, down to no draft at all
    reference = continuation(tiny, ids, max_new_tokens + 3)
    drafter = KnownTree(reference, window, first_draft_from_prompt)
    generation = Decoder(tiny.target, frozenset(), max_draft_tokens=64).generate(ids, drafter, max_new_tokens)
    assert generation.token_ids == reference[:max_new_tokens]
    prefill = generation.steps[0]
    assert (prefill.draft_depth, prefill.draft_tokens, prefill.candidate_tokens) == (0, 0, 0)
    assert prefill.accepted_tokens == (0 if first_draft_from_prompt else 1)
    expected = expected_tree_steps(max_new_tokens, window, first_draft_from_prompt)
    assert recorded(generation) == expected
    # The other per-step inputs of the metrics and the throughput model: step numbers (the prefill is step 0),
    # the tokens verified (root + nodes) and the context each step met.
    assert [step.step for step in generation.steps] == list(range(len(generation.steps)))
    assert prefill.verify_tokens == prefill.context_len == len(ids) - first_draft_from_prompt
    generated = 0 if first_draft_from_prompt else 1
    for step, (_, drafted, _, accepted) in zip(generation.steps[1:], expected):
        assert (step.verify_tokens, step.context_len) == (1 + drafted, len(ids) + generated)
        generated += accepted
    assert expected[0][:3] == (5, 8 + 3 * window, 8)  # a full tree: 5 deep, 8 candidate nodes
    assert any(depth < 5 for depth, *_ in expected)  # and the budget's cuts were met


@pytest.mark.parametrize("mode,length,empty_every", [("right", 4, 0), ("wrong", 3, 0), ("right", 10, 3)])
def test_a_chain_step_records_the_chains_length(tiny, prompt_ids, mode, length, empty_every):
    ids, max_new_tokens, max_draft_tokens = prompt_ids[1], 17, 6
    reference = continuation(tiny, ids, max_new_tokens + length)
    drafter = ScriptedDrafter(reference, length, mode=mode, empty_every=empty_every)
    shapes = VerifyShapes([0, 1, 4, 4])  # 2 and 3 tokens are verified as 4: padding, which is no draft token
    generation = Decoder(tiny.target, frozenset(), max_draft_tokens, verify_shapes=shapes).generate(
        ids, drafter, max_new_tokens)
    assert generation.token_ids == reference[:max_new_tokens]
    generated, expected, verified = 1, [], []
    for call in range(1, len(generation.steps)):
        room = max_new_tokens - generated - 1
        # The loop verifies at most max_draft_tokens, and no more than the tokens left but the bonus.
        depth = 0 if empty_every and call % empty_every == 0 else min(length, max_draft_tokens, room)
        accepted = (depth if mode == "right" else 0) + 1
        expected.append((depth, depth, depth, accepted))
        verified.append((4 if depth + 1 in (2, 3) else depth + 1, len(ids) + generated))
        generated += accepted
    assert generated == max_new_tokens
    assert recorded(generation) == expected
    assert [(step.verify_tokens, step.context_len) for step in generation.steps[1:]] == verified
    assert {depth for depth, *_ in expected} >= ({0, 6} if empty_every else {min(length, 6)})
