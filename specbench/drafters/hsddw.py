"""Hierarchical Speculative Decoding with Dynamic Window (HSDDW; Findings of NAACL 2025; valexsyu/HSDDW): three
models, a tiny draft whose window its own entropy ends, a middle model that verifies the tiny one's tokens and
accumulates them until its own entropy rises, and the target verifying all of them at once. docs/fidelity.md
traces every setting to ``sampling/speculative_sampling.py``'s ``speculative_sampling_google_hrchl_adv_dynamic_
gamma_entropy``, the function the README's runs call.

One specbench step is one of the original's target verifications. Inside ``propose``, rounds of:

1. the tiny draft samples up to ``gamma`` tokens, stopping after one drawn from a distribution whose entropy (nats)
   is above ``th1`` (the token kept);
2. the middle model reads them in one pass and checks each in order: rejected when r > p_mid(x) / p_tiny(x)
   (greedy: when it is not the middle model's choice), or when its own entropy there is above ``th2`` (a veto);
   a token rejected by the ratio is replaced by one drawn from norm(max(0, p_mid - p_tiny)) (greedy: the middle
   model's choice) and the round ends; a fully accepted window gets the middle model's next token;
3. the window ends (the tokens go to the target) at a veto, after a round whose last position's middle-model entropy
   is above ``th2``, or at a ratio rejection once more than ``max_window`` tokens wait.

The thresholds start at ``initial_threshold`` each question; after its first round th1 and th2 are the least entropy
the round saw in each model; later th1 is the mean tiny-draft entropy at the middle model's ratio rejections, th2
the mean middle-model entropy at the target's rejections (both of this question).

Losslessness. Every accumulated token is the middle model's in distribution (speculative sampling's guarantee, as
the residual draws are), so the target verifies the window as a chain drawn from the middle model (``Draft.probs``
its rows) and the output is the target's. Under sampling a veto ends the window *before* the vetoed token: the
original replaces it with a residual draw, which is not the middle model's distribution when the ratio test would
have accepted it; greedy, the middle model's choice is kept there, as the original does. The original fixes the
temperature at 1 inside its function; specbench's models draw at the run's temperature and top-p, and the entropies
are those of the distributions drawn from (at temperature 0, of the plain softmax).
"""

from __future__ import annotations

import numpy as np
import torch

from specbench.decoding.contract import Draft, Drafter, StepOutcome
from specbench.decoding.sampling import Sampling, target_distribution
from specbench.drafters.base import require_number, require_positive
from specbench.drafters.draft_model import DraftModel, plain
from specbench.errors import SpecbenchError
from specbench.targets.kv_cache import TreeKVCache
from specbench.targets.transformers import cache_keyword, forward_with_cache


def entropy(probs: torch.Tensor) -> torch.Tensor:
    """The entropy in nats of each row of ``probs`` (0 log 0 = 0), as torch's Categorical computes it."""
    logs = torch.where(probs > 0, probs.log(), torch.zeros_like(probs))
    return -(probs * logs).sum(-1)


class IncrementalModel:
    """A causal LM over a growing sequence with a KV cache of what it has read: ``logits(sequence)`` feeds only
    what differs from the last sequence read (the cache cut back to the common prefix), so rolling back after a
    rejection is reading a shorter sequence next."""

    def __init__(self, module: torch.nn.Module, vocab_size: int, device: torch.device):
        self.module, self.vocab_size, self.device = module, vocab_size, device
        self.num_layers = module.config.get_text_config().num_hidden_layers
        self.keyword = cache_keyword(module)
        self.cache: TreeKVCache | None = None
        self.read = np.zeros(0, dtype=np.int64)

    def reset(self, capacity: int) -> None:
        self.cache = TreeKVCache(self.num_layers, capacity)
        self.read = np.zeros(0, dtype=np.int64)

    def logits(self, sequence: np.ndarray, rows: int) -> torch.Tensor:
        """[rows, vocab] the logits after each of ``sequence``'s last ``rows`` tokens."""
        same = min(self.read.size, sequence.size)
        differs = np.flatnonzero(self.read[:same] != sequence[:same])
        common = int(differs[0]) if differs.size else same
        common = min(common, sequence.size - rows)
        self.cache.truncate(common)
        fresh = np.ascontiguousarray(sequence[common:])
        output = forward_with_cache(self.module, self.cache, self.keyword,
                                    input_ids=torch.from_numpy(fresh).to(self.device)[None],
                                    position_ids=torch.arange(common, sequence.size, device=self.device)[None])
        self.read = sequence.copy()
        logits = output.logits[0, -rows:]
        if logits.shape[-1] < self.vocab_size:
            logits = torch.nn.functional.pad(logits, (0, self.vocab_size - logits.shape[-1]), value=float("-inf"))
        return logits[:, : self.vocab_size].float()


class DynamicWindowHierarchy(Drafter):
    """HSDDW: a tiny draft and a middle model accumulate a window the target verifies at once."""

    queues_device_work = True
    # The original's first round drafts from the prompt, which the target first reads with the window
    # (speculative_sampling.py:2500-2610), as SpS does.
    first_draft_from_prompt = True

    def __init__(self, name: str = "hsddw", gamma: int = 10, max_window: int = 50, initial_threshold: float = 10.0,
                 max_accumulated: int = 256, models_by_family: dict | None = None, draft: dict | None = None,
                 middle: dict | None = None, cache_dir: str | None = None):
        require_positive(gamma=gamma, max_window=max_window, max_accumulated=max_accumulated)
        require_number("initial_threshold", initial_threshold, 0.0, 1e6,
                       why="an entropy in nats: above the log of a vocabulary's size nothing is ever past it")
        self.name = name
        self.gamma, self.max_window, self.max_accumulated = gamma, max_window, max_accumulated
        self.initial_threshold = float(initial_threshold)
        self.models_by_family = plain(models_by_family) or {}
        self.chosen = {"draft": plain(draft) or {}, "middle": plain(middle) or {}}
        self.cache_dir = cache_dir
        self.loaders: dict[str, DraftModel] = {}

    def _loaders(self, target) -> dict[str, DraftModel]:
        """The two models' loaders (``DraftModel``: a hub id, a local path, a GGUF file or a pruned copy of the
        target, tokenizer checked), from ``draft``/``middle`` when given, else the target family's entry."""
        listed = self.models_by_family.get(target.family) or {}
        loaders = {}
        for role in ("draft", "middle"):
            chosen = self.chosen[role]
            spec = chosen if any(chosen.get(key) for key in ("hub_id", "path")) else listed.get(role)
            if not spec:
                known = ", ".join(sorted(self.models_by_family)) or "none"
                raise SpecbenchError(f"drafter={self.name} knows no {role} model for {target.name} (family "
                                     f"{target.family!r}; it knows {known}); pass drafter.{role}.hub_id=... or "
                                     f"drafter.{role}.path=...")
            loaders[role] = DraftModel(name=self.name, drafts_by_family={target.family: spec},
                                       cache_dir=self.cache_dir)
        return loaders

    def artefacts(self, target) -> list:
        return [artefact for loader in self._loaders(target).values() for artefact in loader.artefacts(target)]

    def prepare(self, target, sampling: Sampling | None = None) -> None:
        self.loaders = self._loaders(target)
        for loader in self.loaders.values():
            loader.prepare(target, sampling)
        self.tiny = IncrementalModel(self.loaders["draft"].draft, target.vocab_size, target.device)
        self.middle = IncrementalModel(self.loaders["middle"].draft, target.vocab_size, target.device)
        self.sampling = sampling or Sampling()
        self.generator = torch.Generator(device=target.device)
        self.generator.manual_seed(self.sampling.seed)
        self.device = target.device

    def sources(self) -> dict:
        return {role: {"model": loader.draft_name} for role, loader in self.loaders.items()}

    def draft_weights_fingerprint(self) -> str | None:
        parts = [loader.draft_weights_fingerprint() for loader in self.loaders.values()]
        return None if None in parts else "+".join(parts)

    def seed_draws(self, decode_seed: int) -> None:
        if self.loaders:
            self.generator.manual_seed(decode_seed)

    def begin(self, prompt_ids: np.ndarray) -> None:
        capacity = 2 * prompt_ids.size + 256
        self.tiny.reset(capacity)
        self.middle.reset(capacity)
        self.reset_thresholds()
        self._last_draft = None

    def reset_thresholds(self) -> None:
        """A question's start: both thresholds at ``initial_threshold``, nothing rejected yet."""
        self.th1 = self.th2 = self.initial_threshold
        self.first_round = True
        self.rejected_tiny_entropies: list[float] = []  # th1's source
        self.rejected_middle_entropies: list[float] = []  # th2's source

    def release(self) -> None:
        self.tiny.cache = self.middle.cache = None
        self._last_draft = None

    # ---- drafting -------------------------------------------------------------------------------------

    def _distribution(self, logits: torch.Tensor) -> torch.Tensor:
        if self.sampling.greedy:
            return torch.softmax(logits, dim=-1)
        return target_distribution(logits, self.sampling)

    def _draw(self, distribution: torch.Tensor, logits: torch.Tensor) -> int:
        if self.sampling.greedy:
            return int(logits.argmax())
        return int(torch.multinomial(distribution, 1, generator=self.generator))

    def _uniform(self) -> float:
        return float(torch.rand(1, generator=self.generator, device=self.generator.device))

    @torch.inference_mode()
    def propose(self, context_ids: np.ndarray) -> Draft:
        window: list[int] = []  # the middle model's tokens, for the target
        rows: list[torch.Tensor] = []  # the middle model's distribution each was drawn from
        entropies: list[float] = []  # the middle model's entropy at each
        ended = False
        while not ended and len(window) < self.max_accumulated:
            prefix = np.concatenate([context_ids, np.asarray(window, dtype=np.int64)])
            tiny_tokens, tiny_rows, tiny_entropies = self._tiny_window(prefix)
            sequence = np.concatenate([prefix, np.asarray(tiny_tokens, dtype=np.int64)])
            middle_logits = self.middle.logits(sequence, len(tiny_tokens) + 1)
            middle_rows = self._distribution(middle_logits)
            middle_entropies = entropy(middle_rows).tolist()
            if self.first_round:  # speculative_sampling.py:2520-2523, before the first check
                self.th1, self.th2 = min(tiny_entropies), min(middle_entropies)
                self.first_round = False
            ended = self._check(tiny_tokens, tiny_rows, tiny_entropies, middle_logits, middle_rows, middle_entropies,
                                window, rows, entropies)
        self._entropies = entropies
        self._last_draft = Draft(torch.tensor(window, dtype=torch.long),
                                 probs=None if self.sampling.greedy or not rows else torch.stack(rows))
        return self._last_draft

    def _tiny_window(self, prefix: np.ndarray):
        """Up to ``gamma`` tokens of the tiny draft, the last one drawn from a distribution above ``th1``."""
        tokens, rows, entropies = [], [], []
        sequence = prefix
        for _ in range(self.gamma):
            logits = self.tiny.logits(sequence, 1)[0]
            distribution = self._distribution(logits[None])[0]
            token = self._draw(distribution, logits)
            tokens.append(token)
            rows.append(distribution)
            entropies.append(float(entropy(distribution)))
            if entropies[-1] > self.th1:
                break
            sequence = np.append(sequence, token)
        return tokens, rows, entropies

    def _check(self, tiny_tokens, tiny_rows, tiny_entropies, middle_logits, middle_rows, middle_entropies,
               window, rows, entropies) -> bool:
        """The middle model's verdict on the tiny window, appended to ``window``; whether the window ends."""
        for index, token in enumerate(tiny_tokens):
            p_middle, p_tiny = middle_rows[index], tiny_rows[index]
            if self.sampling.greedy:
                accepted = token == int(middle_logits[index].argmax())
            else:
                accepted = self._uniform() <= float(p_middle[token] / p_tiny[token])
            vetoed = middle_entropies[index] > self.th2
            if accepted and not vetoed:
                window.append(token)
                rows.append(p_middle)
                entropies.append(middle_entropies[index])
                continue
            if vetoed:
                if self.sampling.greedy:  # the middle model's own choice, as the original's residual is then
                    window.append(int(middle_logits[index].argmax()))
                    rows.append(p_middle)
                    entropies.append(middle_entropies[index])
                return True
            self.rejected_tiny_entropies.append(tiny_entropies[index])
            self.th1 = float(np.mean(self.rejected_tiny_entropies))
            if self.sampling.greedy:
                replacement = int(middle_logits[index].argmax())
            else:
                residual = torch.clamp(p_middle - p_tiny, min=0)
                residual = residual / residual.sum()
                replacement = int(torch.multinomial(residual, 1, generator=self.generator))
            window.append(replacement)
            rows.append(p_middle)
            entropies.append(middle_entropies[index])
            return len(window) > self.max_window
        bonus = self._draw(middle_rows[-1], middle_logits[-1])
        window.append(bonus)
        rows.append(middle_rows[-1])
        entropies.append(middle_entropies[-1])
        return middle_entropies[-1] > self.th2

    def accept(self, accepted_ids: np.ndarray, outcome: StepOutcome) -> None:
        if outcome.draft is not self._last_draft:
            return
        kept = len(outcome.accepted_nodes)
        # The target rejected draft token ``kept`` when it verified it (a token cut by the loop was never seen):
        # speculative_sampling.py:2627 records the middle model's entropy there.
        if kept < len(outcome.draft) and outcome.target_tokens[kept + 1] != -1:
            self.rejected_middle_entropies.append(self._entropies[kept])
            self.th2 = float(np.mean(self.rejected_middle_entropies))
