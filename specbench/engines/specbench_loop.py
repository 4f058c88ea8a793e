"""The first engine: specbench's own decoding loop (``specbench.decoding.loop.Decoder``) over the model's
``Target``, the method being its drafter and the baseline the loop with no draft (``NoDraft``). Its warm-up,
calibration and drafter state are its own (``warm_up``, ``calibration``, ``drafter_state`` beside this file).
``conf/engine/specbench.yaml`` names it; it has no setting but its name, and runs every drafter config."""

from __future__ import annotations

import functools
import logging
import sys
from dataclasses import dataclass

import torch
from omegaconf import DictConfig
from tqdm import tqdm

from specbench.decoding.contract import Drafter
from specbench.decoding.loop import Decoder
from specbench.decoding.sampling import Sampling
from specbench.distributed import Processes
from specbench.drafters.ar import NoDraft
from specbench.engines.base import BASELINE, METHOD, Engine, EngineSettings, OnStep, Skip, SkipQuestion
from specbench.engines.conversation import TurnTooLong, answer_question, first_turn_ids, first_turn_tokens
from specbench.engines.drafter_state import restore_drafter_state, save_drafter_state, saved_drafter_state
from specbench.engines.warm_up import out_of_memory_skip, warm_up_on_one_that_fits
from specbench.errors import SpecbenchError
from specbench.measure import gpu_memory
from specbench.measure.floor import bytes_read_per_pass, machine_bandwidth
from specbench.models import LoadedModel
from specbench.questions import Prompt
from specbench.results.run_directory import RunDirectory
from specbench.results.schema import Answer
from specbench.run.environment import environment
from specbench.run.instantiate import build
from specbench.settings import RunSettings
from specbench.storage.cache import cache_root
from specbench.targets.choice import regime_target

log = logging.getLogger(__name__)


@dataclass
class LoopSettings(EngineSettings):
    """``engine=specbench``: its name alone."""

    def identity(self) -> None:
        """None: the specbench loop's run.json records no "engine", as no run directory written before engines
        were a config group does, so that those resume."""
        return None


class SpecbenchLoop(Engine):
    """The specbench loop over a loaded model, for one drafter and the AR baseline."""

    name = "specbench"

    def __init__(self, model: LoadedModel, drafter: Drafter, settings: RunSettings, sampling: Sampling,
                 processes: Processes):
        self.model = model
        self.drafters = {METHOD: drafter, BASELINE: NoDraft()}
        self.settings = settings
        self.processes = processes
        self.decoder = Decoder(model.target, model.eos_token_ids, settings.max_draft_tokens, sampling=sampling,
                               target_top_k=settings.target_top_k, diagnostic_top_k=settings.mismatch_top_k)
        self.model_name = model.name
        self.drafter_name = drafter.name
        self.dtype = str(model.dtype).removeprefix("torch.")
        self.decoded_by = {role: which.name for role, which in self.drafters.items()}
        self.greedy = sampling.greedy

    @classmethod
    def check_config(cls, engine: dict, drafter: dict, run: dict) -> LoopSettings:
        """The loop runs every drafter config and honours every run setting; it has no setting but its name."""
        extra = sorted(set(engine) - {"name"})
        if extra:
            raise SpecbenchError(f"engine.{extra[0]} is not a setting of engine=specbench, which has none besides its "
                                 "name; the other engines and their settings are in conf/engine/ (docs/engines.md)")
        return LoopSettings(name=engine["name"])

    @classmethod
    def load(cls, engine: EngineSettings, model_node: DictConfig, drafter_node: DictConfig, settings: RunSettings,
             processes: Processes) -> SpecbenchLoop:
        """Build the drafter and the model their config groups name, and prepare the drafter for the model."""
        drafter: Drafter = build(drafter_node)
        # The loader builds the target of the run's regime (the compiled one in place of the transformers one).
        regime = regime_target(model_node, settings.regime, settings.compile_buckets, settings.compile_mode)
        model: LoadedModel = build(model_node, device=settings.device,
                                   linear_backend=settings.resolved_linear_backend(), **regime)
        # A hub or GGUF model tells its context only once loaded; check the token counts before the drafter's
        # databases are built.
        settings.check_context(model.max_context, f"{model.name}'s context of {model.max_context} tokens")
        sampling = Sampling(temperature=float(settings.temperature), top_p=float(settings.top_p), seed=settings.seed)
        drafter.prepare(model, sampling)
        return cls(model, drafter, settings, sampling, processes)

    @property
    def drafter(self) -> Drafter:
        return self.drafters[METHOD]

    def run_settings(self) -> dict:
        # every process: the weights' fingerprint gathers shards
        return {**loaded_settings(self.model, self.drafter), **loaded_placement(self.model)}

    def environment(self) -> dict:
        return environment(self.model)

    def sources(self) -> dict[str, dict]:
        return self.drafter.sources()

    def pass_floor(self) -> dict | None:
        # Several processes or devices each read their part over their own bus: no one machine's floor.
        if self.processes.world_size > 1 or len(self.model.devices) > 1:
            return None
        weights = self.model.weights
        output_weight = getattr(weights.output_layer(), "weight", None)
        read = bytes_read_per_pass(weights.parameter_count, weights.dtype.itemsize, weights.input_embeddings(),
                                   output_weight if isinstance(output_weight, torch.Tensor) else None)
        bandwidth = machine_bandwidth(cache_root(None) / "machine", self.model.device, torch.get_num_threads(), read)
        return {"bytes_per_pass": read, "bandwidth": bandwidth}

    def prompt_tokens(self, prompt: Prompt) -> int:
        return first_turn_tokens(self.model, prompt)

    def check_fits(self, prompt: Prompt) -> None:
        try:
            first_turn_ids(self.model, prompt)
        except TurnTooLong as reason:
            raise SkipQuestion(str(reason)) from None

    def regime(self) -> dict:
        target = self.model.target
        if target.regime == "eager":
            return {"name": "eager"}
        eager_parts = ["prefill (its length differs per question)"]
        if self.drafter.draft_weights_fingerprint() is not None:
            eager_parts.append(f"{self.drafter_name}'s own model")
        from specbench.decoding.contract import Drafter

        if type(self.drafter).decodes_with is not Drafter.decodes_with:  # self-speculative: Target.skipping_pass
            eager_parts.append(f"{self.drafter_name}'s draft passes (the target with sublayers skipped)")
        return {"name": target.regime, "buckets": list(target.buckets), "mode": target.mode,
                "cache_tokens": target.capacity, "compile_s": dict(target.compile_seconds),
                "from_cache": sorted(target.shapes_from_cache, key=list(target.compile_seconds).index),
                "graphs": None if target.graphs is None else target.graphs.kind,
                "graph_memory_bytes": target.graph_memory_bytes, "eager_parts": eager_parts}

    def target_shapes(self, pending: list[Prompt]) -> tuple[int, int, list[tuple[int, ...]]]:
        """What the target is prepared for before ``pending`` are decoded: the longest sequence (the longest turn
        plus the largest draft), the largest pass, and the hidden-state layer sets asked of its passes (() for none).
        ``python -m specbench.prepare`` compiles these same shapes ahead of a run."""
        longest = min(longest_sequence(self.model, pending, self.settings.max_new_tokens), self.model.max_context)
        largest_pass = self.settings.max_draft_tokens + 1
        return longest + largest_pass, largest_pass, list(dict.fromkeys([(), tuple(self.drafter.hidden_state_layers)]))

    def prepare_target(self, pending: list[Prompt]) -> None:
        """Before the first decode: the target ready for the run's longest sequence and largest pass (a compiled
        target compiles its passes here, untimed, with a progress bar)."""
        target = self.model.target
        if target.regime == "eager":
            return
        target.prepare(*self.target_shapes(pending),
                       progress=functools.partial(tqdm, file=sys.stderr, dynamic_ncols=True,
                                                  disable=not self.processes.primary))
        eager = self.regime()["eager_parts"]
        log.info("run.regime=%s: the target's verification passes run compiled; eager: %s", target.regime,
                 "; ".join(eager))

    def warm_up(self, pending: list[Prompt], run_dir: RunDirectory, finished: set, skip: Skip) -> list[Prompt]:
        self.prepare_target(pending)
        saved_state = saved_drafter_state(self.drafter, run_dir, finished, self.processes)
        pending = warm_up_on_one_that_fits(self.settings, self.model, self.decoder, self.drafter,
                                           self.drafters[BASELINE], pending, run_dir.path, self.processes,
                                           teach_state=saved_state is None, skip=skip)
        restore_drafter_state(self.drafter, run_dir, finished, saved_state)
        return pending

    def answer(self, prompt: Prompt, role: str, on_step: OnStep | None = None) -> Answer:
        which, devices = self.drafters[role], self.model.devices
        try:
            gpu_memory.reset_peak(devices)
            answer = answer_question(self.model, self.decoder, which, prompt, self.settings.max_new_tokens, on_step)
            answer.peak_gpu_memory_bytes = gpu_memory.peak_bytes(devices)
            return answer
        except TurnTooLong as reason:  # a later turn outgrew the context: the question cannot be answered whole
            raise SkipQuestion(str(reason)) from None
        except gpu_memory.OUT_OF_MEMORY_ERRORS as error:  # read the figures while the failed step's tensors live
            out_of_memory = gpu_memory.out_of_memory_record(error, devices, prompt.question_id, which.name,
                                                            len(first_turn_ids(self.model, prompt)))
        raise out_of_memory_skip(self.model, out_of_memory)  # the traceback is gone: what it held can be freed

    def save_state(self, run_dir: RunDirectory) -> None:
        save_drafter_state(self.drafter, run_dir)


# Tokens a chat template may add around an answer when a later turn's prompt holds it again.
ANSWER_MARGIN = 16


def longest_sequence(model: LoadedModel, prompts: list[Prompt], max_new_tokens: int) -> int:
    """The most tokens any turn of ``prompts`` can hold before its answer's draft: every user turn with the
    earlier answers at their longest (``max_new_tokens`` each, plus ANSWER_MARGIN for the template), and the
    last answer. An estimate from above: a compiled target sizes its cache by it (a longer turn grows it)."""
    longest = 0
    for prompt in prompts:
        turns = list(prompt.turns)
        ids = model.encode_conversation(turns, [""] * (len(turns) - 1))
        longest = max(longest, len(ids) + len(turns) * (max_new_tokens + ANSWER_MARGIN))
    return longest


def loaded_settings(model: LoadedModel, drafter: Drafter) -> dict:
    """The part of run.json known once the model and the drafter are loaded: the target's source and weights
    (and a draft model's, ``Drafter.draft_weights_fingerprint``), how it runs, and the software that runs it."""
    env = environment(model)
    return {
        "model_source": model.source,
        "weights_fingerprint": model.weights_fingerprint,
        "draft_weights_fingerprint": drafter.draft_weights_fingerprint(),
        "dtype": env["dtype"],
        "device": str(model.device),
        "threads": torch.get_num_threads(),
        # The driver, the device count and CUDA_VISIBLE_DEVICES stay in the summary's environment only: a job
        # requeued onto another node of the same GPUs resumes.
        "environment": {key: env[key] for key in ("python", "torch", "transformers", "specbench", "device", "git_sha",
                                                  "cuda", "gpus")},
    }


def loaded_placement(model: LoadedModel) -> dict:
    """The placement settings of a loaded model (``specbench.run.identity``: ``LOADED_KEYS``)."""
    return {"placement": model.placement, "devices": ",".join(str(device) for device in model.devices),
            "linear_backend_used": model.weights.linear_backend_used}
