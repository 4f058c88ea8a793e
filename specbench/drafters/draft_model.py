"""A separate, smaller causal LM drafts ``gamma`` tokens autoregressively (speculative sampling with a draft
model, Leviathan et al. 2023; Chen et al. 2023; Spec-Bench's SpS).

The draft keeps its own KV cache over the committed context and its drafted tokens; after each step the
cache is rolled back to what the target accepted, so the draft never recomputes a token twice.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import torch

from specbench.targets.kv_cache import TreeKVCache
from specbench.targets.transformers import cache_keyword, forward_with_cache, parameter_count, weights_fingerprint
from specbench.decoding.sampling import Sampling, target_distribution
from specbench.decoding.contract import Draft, Drafter, SharedWeights, StepOutcome
from specbench.drafters.base import chosen_or_listed, require_flag, require_positive
from specbench.errors import SpecbenchError

log = logging.getLogger(__name__)
DTYPE_NAMES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}


def plain(value):
    """Hydra hands nested config as DictConfig; drafters keep plain dicts and lists."""
    from omegaconf import DictConfig, ListConfig, OmegaConf

    return OmegaConf.to_container(value, resolve=True) if isinstance(value, (DictConfig, ListConfig)) else value


class DraftModel(Drafter):
    """Drafts with a small model of the target's vocabulary.

    The draft is ``model`` (hub id or local path) or, when that is empty, the entry of ``drafts_by_family``
    for the target's family: ``{hub_id|path: ...}``, ``{gguf: FILE}`` (``cache:REL`` = in the specbench
    cache), or ``{pruned: {layers, selection, distill_tokens, corpus}}`` for a depth-pruned copy of the
    target built by ``scripts/prune_draft.py`` (on first use if missing).
    """

    queues_device_work = True  # its forward passes run on the target's device

    def __init__(self, name: str = "draft_model", model: dict | None = None, drafts_by_family: dict | None = None,
                 gamma: int = 4, adaptive_gamma: bool = False, max_gamma: int | None = 16,
                 cache_dir: str | None = None, first_draft_from_prompt: bool = True):
        require_positive(gamma=gamma)
        if max_gamma is not None:
            require_positive(max_gamma=max_gamma)
        require_flag(adaptive_gamma=adaptive_gamma, first_draft_from_prompt=first_draft_from_prompt)
        self.name = name
        self.model_spec = plain(model) or {}
        self.drafts_by_family = plain(drafts_by_family) or {}
        self.initial_gamma = gamma
        self.first_draft_from_prompt = bool(first_draft_from_prompt)
        self.adaptive_gamma = adaptive_gamma
        self.max_gamma = max_gamma if max_gamma is not None else float("inf")  # null: unbounded (transformers)
        self.cache_dir = cache_dir
        self.draft = None
        self.draft_checkpoint: str | None = None  # the draft's directory or hub id, once prepared

    # ---- loading ------------------------------------------------------------------------------------

    def _spec_for(self, target) -> dict:
        spec = chosen_or_listed(self.model_spec, self.drafts_by_family, target.family)
        if spec is None:
            known = ", ".join(sorted(self.drafts_by_family)) or "none"
            raise SpecbenchError(
                f"drafter={self.name} knows no draft model for {target.name} (family {target.family!r}; it knows "
                f"{known}); pass drafter.model.hub_id=... or drafter.model.path=..."
            )
        return spec

    def prepare(self, target, sampling: Sampling | None = None) -> None:
        from specbench.targets.kernels import use_linear_backend

        spec = self._spec_for(target)
        draft, draft_name, checkpoint = self._load(target, spec)
        if self._built(spec):
            use_linear_backend(draft, "auto")
        self.draft_checkpoint = checkpoint  # where another engine (vLLM) reads the same draft
        draft_size = parameter_count(draft)
        target_size = target.parameter_count
        if draft_size >= target_size:
            log.warning("draft model %s (%d parameters) is not smaller than target %s (%d): it cannot speed decoding up",
                        draft_name, draft_size, target.name, target_size)
        self.draft = draft
        self.draft_name = draft_name
        self.num_layers = draft.config.get_text_config().num_hidden_layers
        self._cache_keyword = cache_keyword(draft)
        self.vocab_size = target.vocab_size
        self.sampling = sampling or Sampling()
        self.generator = torch.Generator(device=target.device)  # seeded by every decode (seed_draws)
        self.generator.manual_seed(self.sampling.seed)
        self.device = target.device
        self.cache = None

    @staticmethod
    def _built(spec: dict) -> bool:
        """Whether ``spec`` names a draft specbench builds (a pruned or fine-tuned copy) rather than a checkpoint."""
        return "pruned" in spec or "finetuned" in spec

    def _load(self, target, spec: dict, trainable: bool = False) -> tuple[torch.nn.Module, str, str | None]:
        """(the draft's module on the target's device in eval mode, its name in records, its directory or hub id)
        for ``spec``: a pruned or translation-tuned copy is found whole (its files' checksums) or built first,
        through the artefact layer (a damaged one in the cache is rebuilt, a damaged one at the user's path refused
        in one line); a GGUF file or a hub id or local checkpoint is loaded, its tokenizer checked against the
        target's. A built draft comes with its linear layers as trained (``prepare`` packs them); ``trainable``: a
        checkpoint's too (the base of a fine-tuned draft), never oneDNN's packed ones."""
        from specbench.models import load_gguf, load_pretrained

        dtype = DTYPE_NAMES.get(target.dtype, "float32")
        backend = {"linear_backend": "aten"} if trainable else {}
        if self._built(spec):
            from specbench.artefacts.base import fetch

            kind = "pruned" if "pruned" in spec else "finetuned"
            if spec.get("path") and kind == "pruned":
                from specbench.artefacts.pruned_draft import PrunedDraft

                directory = Path(spec["path"]).expanduser()
                draft = PrunedDraft(target, directory, spec["pruned"], given=True).get()
            else:
                cached = self._cached_for(target, spec)
                directory = cached["draft"].directory
                draft = fetch(cached)["draft"]
            draft.to(target.device).eval()
            return draft, f"{'pruned' if kind == 'pruned' else 'translation-tuned'} {directory.name}", str(directory)
        if spec.get("gguf"):
            loaded = load_gguf(name=f"{target.family}-{self.name}-draft", gguf_path=spec["gguf"],
                               device=str(target.device), dtype=dtype, prompt_format="plain",
                               missing_hint=spec.get("missing_hint"), **backend)
        else:
            loaded = load_pretrained(name=f"{self.name} draft", hub_id=spec.get("hub_id"), path=spec.get("path"),
                                     revision=spec.get("revision"), device=str(target.device), dtype=dtype,
                                     prompt_format="plain", **backend)
        if loaded.tokenizer_fingerprint != target.tokenizer_fingerprint:
            raise SpecbenchError(
                f"draft model {loaded.source} does not share the tokenizer of target {target.name} "
                f"({target.source}): their vocabularies differ, so its tokens would mean other words"
            )
        # the drafter runs the draft's transformers module itself, with a KV cache of its own
        return loaded.weights.module, loaded.source, loaded.checkpoint

    def seed_draws(self, decode_seed: int) -> None:
        if self.draft is not None:
            self.generator.manual_seed(decode_seed)

    def _cached(self, target) -> dict:
        return self._cached_for(target, self._spec_for(target))

    def _cached_for(self, target, spec: dict) -> dict:
        """The draft built in the cache, when ``spec`` names one (a pruned copy of the target, or a draft fine-tuned
        on the target's translations); a hub or local checkpoint is downloaded or read, not built, and a pruned
        draft at the user's own path is the user's."""
        from specbench.artefacts.base import prepare_command

        command = prepare_command(target.name, self.name)
        if "finetuned" in spec:
            from specbench.artefacts.fine_tuned_draft import FineTunedDraft

            settings = dict(spec["finetuned"])
            base = settings.pop("base", None)
            if not isinstance(base, dict) or not base or self._built(base) and "finetuned" in base:
                raise SpecbenchError(f"drafter={self.name}: a finetuned draft needs base: {{hub_id|path|gguf|pruned: "
                                     f"...}} (a draft that is not itself fine-tuned), got {base!r}")
            base_inputs = list(self._cached_for(target, base).values())
            return {"draft": FineTunedDraft(target, base, lambda: self._load(target, base, trainable=True)[0], settings,
                                            self.cache_dir, command, base_inputs)}
        if "pruned" not in spec or spec.get("path"):
            return {}
        from specbench.artefacts.pruned_draft import PrunedDraft, pruned_draft_directory

        directory = pruned_draft_directory(target, spec["pruned"], self.cache_dir)
        return {"draft": PrunedDraft(target, directory, spec["pruned"], command=command)}

    def artefacts(self, target) -> list:
        return list(self._cached(target).values())

    # ---- drafting -----------------------------------------------------------------------------------

    def begin(self, prompt_ids: np.ndarray) -> None:
        self.cache = TreeKVCache(self.num_layers, 2 * prompt_ids.size + 64)
        self.processed = 0  # context tokens whose keys/values are in the draft's cache
        self.gamma = self.initial_gamma
        self._last_draft = None

    def shared_weights(self) -> SharedWeights | None:
        """The draft's directory (or hub id), where another engine reads the same draft; None for a draft that
        exists only in memory (converted from GGUF)."""
        return None if self.draft_checkpoint is None else SharedWeights("draft_model", self.draft_checkpoint)

    def release_weights(self) -> None:
        self.draft = None

    def draft_weights_fingerprint(self) -> str | None:
        return weights_fingerprint(self.draft) if isinstance(self.draft, torch.nn.Module) else None

    def release(self) -> None:
        self.cache = None
        self._last_draft = None

    def _next_logits(self, tokens: np.ndarray) -> torch.Tensor:
        input_ids = torch.from_numpy(np.ascontiguousarray(tokens)).to(self.device).unsqueeze(0)
        logits = forward_with_cache(self.draft, self.cache, self._cache_keyword, input_ids=input_ids,
                                    logits_to_keep=1).logits[0, -1]
        # Align with the target's vocabulary (embedding tables are often padded to different sizes).
        if logits.shape[0] < self.vocab_size:
            logits = torch.nn.functional.pad(logits, (0, self.vocab_size - logits.shape[0]), value=float("-inf"))
        return logits[: self.vocab_size].unsqueeze(0)

    @torch.inference_mode()
    def propose(self, context_ids: np.ndarray) -> Draft:
        logits = self._next_logits(context_ids[self.processed :])
        tokens, probs = [], []
        for index in range(self.gamma):
            if self.sampling.greedy:
                token = int(logits[0].argmax())
            else:
                distribution = target_distribution(logits, self.sampling)[0]
                token = int(torch.multinomial(distribution, 1, generator=self.generator))
                probs.append(distribution)
            tokens.append(token)
            if index + 1 < self.gamma:
                logits = self._next_logits(np.array([token]))
        self.processed = context_ids.size + self.gamma - 1
        self._proposed_at = context_ids.size
        self._last_draft = Draft(torch.tensor(tokens, dtype=torch.long), probs=torch.stack(probs) if probs else None)
        return self._last_draft

    def accept(self, accepted_ids: np.ndarray, outcome: StepOutcome) -> None:
        if outcome.draft is not self._last_draft:
            return
        accepted = len(outcome.accepted_nodes)
        # Keys/values of the accepted draft tokens are valid context; the rest are forgotten.
        self.processed = self._proposed_at + min(accepted, self.gamma - 1)
        self.cache.truncate(self.processed)
        if self.adaptive_gamma:  # transformers' assisted-generation heuristic
            self.gamma = int(min(self.max_gamma, self.gamma + 2)) if accepted == self.gamma else max(1, self.gamma - 1)
