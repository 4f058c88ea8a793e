"""HSDDW (drafter=hsddw): the three-level window, its entropy thresholds and settings, pinned against the original
(valexsyu/HSDDW @c8fed41, sampling/speculative_sampling.py; docs/fidelity.md). Its losslessness is the contract
tests' (every drafter config, every Target, greedy and sampling)."""

from __future__ import annotations

import numpy as np
import torch
from conftest import refusal

from specbench.config import compose
from specbench.decoding.loop import Decoder
from specbench.decoding.sampling import Sampling
from specbench.drafters.hsddw import DynamicWindowHierarchy, IncrementalModel, entropy
from specbench.testing import configured_drafter, greedy_reference


def test_entropy_is_torchs_categorical_entropy_in_nats():
    probs = torch.tensor([[0.5, 0.5, 0.0], [1.0, 0.0, 0.0], [0.2, 0.3, 0.5]])
    expected = torch.distributions.Categorical(probs=probs).entropy()
    torch.testing.assert_close(entropy(probs), expected)
    assert abs(float(entropy(probs)[0]) - np.log(2)) < 1e-6


def test_the_config_restates_the_originals_settings():
    config = compose(["drafter=hsddw"]).drafter
    # README / common_inference_fun7.sh --gamma 10; speculative_sampling.py:2461-2462 (thresholds 10), :2549-2551 (50)
    assert (config.gamma, config.initial_threshold, config.max_window) == (10, 10.0, 50)
    # common_inference_fun7.sh:13-19, main_modify.py:40-45: llama-68m drafts; TinyLlama-1.1B-chat is the repository's
    assert config.models_by_family.llama2.draft.hub_id == "JackFram/llama-68m"
    assert config.models_by_family.llama2.middle.hub_id == "TinyLlama/TinyLlama-1.1B-Chat-v1.0"


@torch.inference_mode()
def test_reading_a_shorter_or_other_sequence_rolls_the_cache_back(tiny, prompt_ids):
    model = IncrementalModel(tiny.weights.module, tiny.vocab_size, torch.device("cpu"))
    model.reset(64)
    ids = np.asarray(prompt_ids[0] + [3, 4, 5], dtype=np.int64)
    full = tiny.weights.module(input_ids=torch.tensor([list(ids)])).logits[0].float()
    torch.testing.assert_close(model.logits(ids, 3), full[-3:], rtol=1e-4, atol=1e-4)
    other = ids.copy()
    other[-2] = 9  # a rejection: the same prefix, then another token
    expected = tiny.weights.module(input_ids=torch.tensor([list(other)])).logits[0, -2:].float()
    torch.testing.assert_close(model.logits(other, 2), expected, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(model.logits(ids[:-1], 1), full[-2:-1], rtol=1e-4, atol=1e-4)


def _rows(*rows):
    return torch.tensor(rows, dtype=torch.float32)


def _drafter(greedy=True):
    drafter = DynamicWindowHierarchy()
    drafter.sampling = Sampling() if greedy else Sampling(temperature=1.0, seed=0)
    drafter.generator = torch.Generator()
    drafter.reset_thresholds()
    return drafter


def test_a_ratio_rejection_replaces_the_token_and_ends_the_round_a_veto_ends_the_window():
    drafter = _drafter()
    drafter.th2 = 0.5
    middle_logits = torch.log(_rows([0.1, 0.8, 0.1], [0.7, 0.2, 0.1], [0.3, 0.3, 0.4]))
    middle_rows = torch.softmax(middle_logits, -1)
    window, rows, entropies = [], [], []
    # token 1 is the middle model's choice at 0 (accepted, entropy 0.64 > 0.5 would veto: raise th2 first)
    drafter.th2 = 1.0
    ended = drafter._check([1, 2], [middle_rows[0], middle_rows[1]], [0.3, 0.9], middle_logits, middle_rows,
                           entropy(middle_rows).tolist(), window, rows, entropies)
    # token 2 at position 1 is not the middle model's choice (0): replaced by 0, th1 the tiny entropy there
    assert window == [1, 0] and not ended and drafter.th1 == 0.9 and drafter.rejected_tiny_entropies == [0.9]
    drafter.th2 = 0.7  # position 0's entropy (0.64) passes, position 1's (0.80) is vetoed: the window ends there
    window = []
    ended = drafter._check([1, 0], [middle_rows[0], middle_rows[1]], [0.3, 0.3], middle_logits, middle_rows,
                           entropy(middle_rows).tolist(), window, [], [])
    assert ended and window == [1, 0]  # greedy keeps the middle model's choice at the veto
    sampled = _drafter(greedy=False)
    sampled.th2 = 0.7
    window = []
    ended = sampled._check([1, 0], [middle_rows[0], middle_rows[1]], [0.3, 0.3], middle_logits, middle_rows,
                           entropy(middle_rows).tolist(), window, [], [])
    assert ended and window == [1]  # under sampling the window ends before the vetoed token
    bonus_window = []
    drafter.th2 = 5.0
    ended = drafter._check([1], [middle_rows[0]], [0.3], middle_logits[:2], middle_rows[:2],
                           entropy(middle_rows[:2]).tolist(), bonus_window, [], [])
    assert bonus_window == [1, 0] and not ended  # all accepted: the middle model's next token, entropy 0.80 < 5


@torch.inference_mode()
def test_the_first_round_sets_both_thresholds_to_the_least_entropy_seen(tiny, prompt_ids):
    drafter = configured_drafter("hsddw", tiny)
    drafter.begin(np.asarray(prompt_ids[0]))
    assert drafter.th1 == drafter.th2 == 10.0
    drafter.propose(np.asarray(prompt_ids[0], dtype=np.int64))
    assert drafter.th1 < 10.0 and drafter.th2 < 10.0 and not drafter.first_round


def test_a_family_without_models_is_one_line(tiny):
    drafter = DynamicWindowHierarchy(models_by_family={})
    assert "knows no draft model for tiny-random" in refusal(drafter.prepare, tiny)
