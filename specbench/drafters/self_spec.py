"""Draft & Verify, "self-speculative decoding" (Zhang et al., ACL 2024; dilab-zju/self-speculative-decoding): the
target drafts a chain itself with a fixed set of attention and MLP sublayers skipped, on its own KV cache, and
stops when the drafted token's probability falls below a threshold that adapts to how much of each draft the target
kept. docs/fidelity.md traces every setting to the original's file and line.

Per step: skipping passes from the token the last step ended on, one token each, up to ``max_step_draft``; a token
whose plain-softmax probability is below ``th_stop_draft`` is kept and ends the draft (decoding.py). After the
target's verdict (``accept``), with ``auto_parameters`` [a0, a1, a2, a3, a4]:

    matchness = a1 x matchness + (1 - a1) x kept / drafted        (reset to 0 at every question)
    new = th + a3 if matchness < a2, th if the draft was max_step_draft long, else th - a3
    th = a4 x th + (1 - a4) x new                                  (no bound; carried to the next question)

The skip set: ``skip`` when given, else the published one of the target (``published_skip_sets``), else the one the
original's offline search finds for it (``artefacts.skip_set``: Bayesian optimisation of the greedy tokens/s, built
once per target and cached, ahead of time by ``python -m specbench.prepare``).

Under sampling the chain's tokens are drawn from the run's distribution of the draft's logits (``Draft.probs``) and
verified by specbench's speculative sampling, which is lossless; the stop rule reads the untempered probability, as
the original's does.
"""

from __future__ import annotations

import numpy as np
import torch

from specbench.decoding.contract import Draft, Drafter, StepOutcome
from specbench.decoding.sampling import Sampling, target_distribution
from specbench.decoding.target import LayerSkip
from specbench.drafters.base import require_flag, require_number, require_positive
from specbench.drafters.draft_model import plain
from specbench.drafters.layer_skipping import drafting_target, skip_set_setting, skipping_chain
from specbench.errors import SpecbenchError


def next_threshold(threshold: float, matchness: float, kept: int, drafted: int, max_step_draft: int,
                   parameters: tuple[float, ...]) -> tuple[float, float]:
    """(the threshold, the matchness) after one verified draft of ``drafted`` tokens of which the target kept
    ``kept``: Draft & Verify's rule (decoding.py), ``parameters`` its auto_parameters [a0, a1, a2, a3, a4]."""
    _, momentum, wanted, step, smoothing = parameters
    matchness = momentum * matchness + (1 - momentum) * (kept / drafted)
    if matchness < wanted:
        target = threshold + step
    elif drafted == max_step_draft:
        target = threshold
    else:
        target = threshold - step
    return smoothing * threshold + (1 - smoothing) * target, matchness


def decoding_speed(target, settings: dict):
    """Draft & Verify's search objective for ``target``: a skip set -> the greedy tokens/s of self-speculative
    decoding with it (decoding.py's ``essg`` defaults, the threshold afresh on every prompt) over the search's
    prompts (searching.py:52-70)."""
    from specbench.artefacts.skip_set import search_prompts
    from specbench.decoding.loop import Decoder

    prompts = search_prompts(target, settings["prompts"])
    decoder = Decoder(target.target, target.eos_token_ids, max_draft_tokens=settings["max_step_draft"])

    def tokens_per_s(skip) -> float:
        drafter = SelfSpeculative(max_step_draft=settings["max_step_draft"], th_stop_draft=settings["th_stop_draft"],
                                  carry_threshold=False,
                                  skip={"attention": sorted(skip.attention), "mlp": sorted(skip.mlp)})
        drafter.prepare(target)
        tokens = seconds = 0.0
        for prompt in prompts:
            generation = decoder.generate(prompt, drafter, settings["new_tokens"])
            tokens += len(generation.token_ids)
            seconds += generation.wall_s
        return tokens / seconds

    return tokens_per_s


class SelfSpeculative(Drafter):
    """Draft & Verify: a chain from the target with ``skip``'s sublayers left out, stopped by an adaptive threshold."""

    queues_device_work = True  # its passes are the target's

    def __init__(self, name: str = "self-spec", max_step_draft: int = 12, th_stop_draft: float = 0.6,
                 auto_th_stop_draft: bool = True, auto_parameters=(1, 0.5, 0.9, 1e-2, 0.9),
                 carry_threshold: bool = True, skip: dict | None = None, published_skip_sets: dict | None = None,
                 search: dict | None = None, searches_by_model: dict | None = None, cache_dir: str | None = None):
        require_positive(max_step_draft=max_step_draft)
        require_number("th_stop_draft", th_stop_draft, 0.0, 1.0)
        require_flag(auto_th_stop_draft=auto_th_stop_draft, carry_threshold=carry_threshold)
        parameters = plain(auto_parameters)
        if not isinstance(parameters, (list, tuple)) or len(parameters) != 5:
            raise SpecbenchError(f"drafter.auto_parameters must be 5 numbers [every, momentum, wanted matchness, "
                                 f"step, smoothing], got {parameters!r}")
        require_positive(**{"auto_parameters[0]": parameters[0]})
        for index, value in enumerate(parameters[1:], 1):
            require_number(f"auto_parameters[{index}]", value, 0.0, 1.0)
        self.name = name
        self.max_step_draft = max_step_draft
        self.initial_threshold = float(th_stop_draft)
        self.adaptive = auto_th_stop_draft
        self.parameters = tuple(float(value) for value in parameters)
        self.carry_threshold = carry_threshold
        self.given_skip = skip_set_setting("skip", plain(skip))
        self.published = {model: skip_set_setting(f"published_skip_sets.{model}", value)
                          for model, value in (plain(published_skip_sets) or {}).items()}
        self.search = plain(search) or {}
        self.searches_by_model = plain(searches_by_model) or {}
        from specbench.artefacts.skip_set import search_settings

        search_settings(self.search, None)  # checked now, in one line, not when a target first needs a search
        for model, entry in self.searches_by_model.items():
            search_settings(self.search, entry, model)
        self.cache_dir = cache_dir
        self.threshold = self.initial_threshold
        self.skip = None
        self.skip_source: dict = {}
        self.target = None

    # ---- the skip set ---------------------------------------------------------------------------------

    def _searched(self, target) -> dict:
        """{"skip_set": the searched skip set's artefact} when neither a given nor a published set applies."""
        if self.given_skip is not None or self.published.get(target.name) is not None:
            return {}
        from specbench.artefacts.base import prepare_command
        from specbench.artefacts.skip_set import SearchedSkipSet, search_settings

        settings = search_settings(self.search, self.searches_by_model.get(target.name), target.name)
        return {"skip_set": SearchedSkipSet(target, settings, self.cache_dir,
                                            command=prepare_command(target.name, self.name),
                                            objective=lambda: decoding_speed(target, settings))}

    def artefacts(self, target) -> list:
        return list(self._searched(target).values())

    def prepare(self, target, sampling: Sampling | None = None) -> None:
        if self.given_skip is not None:
            skip, self.skip_source = self.given_skip, {"given": True}
        elif self.published.get(target.name) is not None:
            skip, self.skip_source = self.published[target.name], {"published": target.name}
        else:
            from specbench.artefacts.base import fetch

            searched = self._searched(target)
            found = fetch(searched)["skip_set"]
            skip = LayerSkip(*found.skip)
            self.skip_source = {"searched": str(searched["skip_set"].directory), "tokens_per_s": found.score,
                                "iterations": found.iterations}
        what = "drafter.skip" if "given" in self.skip_source else f"the skip set for {target.name}"
        self.skip = skip.checked(target.num_layers, what)
        self.sampling = sampling or Sampling()
        self.generator = torch.Generator(device=target.device)
        self.generator.manual_seed(self.sampling.seed)

    def sources(self) -> dict:
        return {"skip_set": {**self.skip_source, "attention": sorted(self.skip.attention), "mlp": sorted(self.skip.mlp)}}

    # ---- a decode -------------------------------------------------------------------------------------

    def decodes_with(self, target) -> None:
        self.target = drafting_target(self.name, target)

    def seed_draws(self, decode_seed: int) -> None:
        if self.skip is not None:
            self.generator.manual_seed(decode_seed)

    def begin(self, prompt_ids: np.ndarray) -> None:
        self.matchness = 0.0  # decoding.py starts every generate call from 0
        self.verified = 0
        if not self.carry_threshold:
            self.threshold = self.initial_threshold
        self._last_draft = None

    def propose(self, context_ids: np.ndarray) -> Draft:
        probs: list[torch.Tensor] = []

        def choose(logits: torch.Tensor) -> tuple[int, bool]:
            plain_probs = torch.softmax(logits.float(), dim=-1)
            if self.sampling.greedy:
                token = int(logits.argmax())
            else:
                distribution = target_distribution(logits[None], self.sampling)[0]
                token = int(torch.multinomial(distribution, 1, generator=self.generator))
                probs.append(distribution)
            return token, float(plain_probs[token]) >= self.threshold

        tokens = skipping_chain(self.target, context_ids, self.skip, self.max_step_draft, choose)
        self._last_draft = Draft(torch.tensor(tokens, dtype=torch.long),
                                 probs=torch.stack(probs) if probs else None)
        return self._last_draft

    def accept(self, accepted_ids: np.ndarray, outcome: StepOutcome) -> None:
        if outcome.draft is not self._last_draft or not self.adaptive or len(outcome.draft) == 0:
            return
        self.verified += 1
        if self.verified % int(self.parameters[0]):  # auto_parameters[0]: update every that many verifications
            return
        self.threshold, self.matchness = next_threshold(self.threshold, self.matchness, len(outcome.accepted_nodes),
                                                        len(outcome.draft), self.max_step_draft, self.parameters)

    def release(self) -> None:
        self._last_draft = None

    # ---- carried across questions ---------------------------------------------------------------------

    def state(self) -> dict[str, np.ndarray] | None:
        return {"threshold": np.asarray([self.threshold])} if self.carry_threshold else None

    def restore(self, state: dict[str, np.ndarray]) -> None:
        self.threshold = float(state["threshold"][0])
