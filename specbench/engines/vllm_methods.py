"""What ``engine=vllm`` runs: its settings (``conf/engine/vllm.yaml``) and how a drafter config maps onto vLLM's
``speculative_config``. Pure: imports neither vLLM nor torch, so the checks run before anything loads, in any
environment.

The mapping goes by the drafter's class (its ``_target_``), so a renamed or derived config (``drafter=sps``
derives from ``draft_model``) maps as its class does:

    drafter class            vLLM method    settings read from the drafter config
    ar (NoDraft)             none           -
    pld, pld-hd (PromptLookup)
                             ngram          num_draft_tokens, max_ngram_size, min_ngram_size
    suffix (SuffixDecoding)  suffix         max_tree_depth, max_cached_requests, max_spec_tokens, max_spec_factor,
                                            min_token_prob (needs the arctic-inference package)
    eagle/eagle2 (Eagle)     eagle          the head's directory, depth (tokens drafted per step)
    eagle3 (Eagle)           eagle3         the head's directory, depth
    sps, draft_model, opt-small, wide-pruned, qwen-0.5b (DraftModel)
                             draft_model    the draft's directory, gamma (tokens drafted per step)

vLLM's methods are not line for line the specbench drafters of the same config (docs/fidelity.md, "engine=vllm"):
its ngram drafts nothing when no n-gram matches (PLD verifies a dummy token), its EAGLE drafts a chain of
``depth`` tokens (EAGLE-2/3 verify a tree of 60), its draft model drafts a fixed ``gamma`` (sps adapts it). A run
records the exact ``speculative_config`` it gave vLLM in run.json.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from specbench.errors import SpecbenchError

ENGINES = ("specbench", "vllm")

# drafter class -> vLLM's method (None: no speculation, the AR baseline)
VLLM_METHODS = {
    "specbench.drafters.ar.NoDraft": None,
    "specbench.drafters.pld.PromptLookup": "ngram",
    "specbench.drafters.suffix.SuffixDecoding": "suffix",
    "specbench.drafters.eagle.Eagle": "eagle",  # or eagle3, by the head's kind
    "specbench.drafters.draft_model.DraftModel": "draft_model",
}
# The drafter configs (conf/drafter/) engine=vllm runs, for the refusal of the others (pinned by a test against
# the configs' classes).
VLLM_DRAFTERS = ("ar", "draft_model", "eagle", "eagle2", "eagle3", "opt-small", "pld", "pld-hd", "qwen-0.5b", "sps",
                 "suffix", "wide-pruned")
# Run settings that tune specbench's own loop; vLLM has nothing that honours them.
LOOP_ONLY_RUN_SETTINGS = {"draft_budget": "off", "verify_padding": "off"}


@dataclass
class VllmSettings:
    """``conf/engine/vllm.yaml``, checked (see that file for what each key does)."""

    name: str = "vllm"
    paired: bool = True
    concurrency: list[int] = field(default_factory=list)
    request_timeout_s: float = 600.0
    max_model_len: int = 4096
    max_num_seqs: int = 256
    gpu_memory_utilization: float = 0.85
    cpu_kv_cache_gib: int = 2
    tensor_parallel_size: int = 1
    enforce_eager: bool = False

    @staticmethod
    def from_config(node: dict) -> VllmSettings:
        known = {item.name for item in fields(VllmSettings)}
        unknown = sorted(set(node) - known)
        if unknown:
            raise SpecbenchError(f"engine.{unknown[0]} is not a setting of engine=vllm; its settings: "
                                 f"{', '.join(sorted(known))}")
        settings = VllmSettings(**node)
        settings.check()
        return settings

    def check(self) -> None:
        for key in ("paired", "enforce_eager"):
            if not isinstance(getattr(self, key), bool):
                raise SpecbenchError(f"engine.{key} must be true or false, got {getattr(self, key)!r}")
        levels = self.concurrency
        if isinstance(levels, int) and not isinstance(levels, bool):
            levels = self.concurrency = [levels]
        if not isinstance(levels, (list, tuple)) or not all(_positive_int(level) for level in levels):
            raise SpecbenchError(f"engine.concurrency must be a list of positive request counts such as [1,4,16,64] "
                                 f"(or [] for none), got {levels!r}")
        if len(set(levels)) != len(levels):
            raise SpecbenchError(f"engine.concurrency lists a level twice: {list(levels)}")
        self.concurrency = [int(level) for level in levels]
        # cpu_kv_cache_gib: vLLM reads VLLM_CPU_KVCACHE_SPACE as a whole number of GiB
        for key in ("max_model_len", "max_num_seqs", "tensor_parallel_size", "cpu_kv_cache_gib"):
            if not _positive_int(getattr(self, key)):
                raise SpecbenchError(f"engine.{key} must be a positive integer, got {getattr(self, key)!r}")
        for key in ("request_timeout_s",):
            if not _positive_number(getattr(self, key)):
                raise SpecbenchError(f"engine.{key} must be a positive number, got {getattr(self, key)!r}")
        if not _positive_number(self.gpu_memory_utilization) or self.gpu_memory_utilization > 1:
            raise SpecbenchError(f"engine.gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization!r}")
        too_many = [level for level in self.concurrency if level > self.max_num_seqs]
        if too_many:
            raise SpecbenchError(f"engine.concurrency={too_many[0]} exceeds engine.max_num_seqs={self.max_num_seqs}, "
                                 "the most requests vLLM batches; raise engine.max_num_seqs")
        if not self.paired and not self.concurrency:
            raise SpecbenchError("engine.paired=false with engine.concurrency=[] measures nothing; give levels such "
                                 "as engine.concurrency=[1,4] or keep engine.paired=true")


def _positive_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _positive_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0


def vllm_method(drafter: dict) -> str | None:
    """vLLM's method for a drafter config (a plain dict of the resolved node); a drafter vLLM cannot run is
    refused in one line naming the drafters it can."""
    target = drafter.get("_target_")
    if target not in VLLM_METHODS:
        raise SpecbenchError(
            f"drafter={drafter.get('name', target)} runs on engine=specbench only: vLLM has no such method; "
            f"engine=vllm runs drafter={', '.join(VLLM_DRAFTERS)}")
    method = VLLM_METHODS[target]
    if method == "eagle" and drafter.get("kind") == "eagle3":
        return "eagle3"
    return method


def speculative_config(drafter: dict, checkpoint: str | None) -> dict | None:
    """The ``speculative_config`` vLLM is given for ``drafter`` (None for AR); ``checkpoint``: the directory (or
    hub id) of the head or draft model, for the methods that load one."""
    method = vllm_method(drafter)
    if method is None:
        return None
    if method == "ngram":
        return {"method": "ngram", "num_speculative_tokens": int(drafter["num_draft_tokens"]),
                "prompt_lookup_max": int(drafter["max_ngram_size"]), "prompt_lookup_min": int(drafter["min_ngram_size"])}
    if method == "suffix":
        depth = int(drafter["max_tree_depth"])
        spec_tokens = drafter.get("max_spec_tokens")
        return {"method": "suffix", "num_speculative_tokens": int(spec_tokens) if spec_tokens else depth,
                "suffix_decoding_max_tree_depth": depth,
                "suffix_decoding_max_cached_requests": int(drafter["max_cached_requests"]),
                "suffix_decoding_max_spec_factor": float(drafter["max_spec_factor"]),
                "suffix_decoding_min_token_prob": float(drafter["min_token_prob"])}
    if checkpoint is None:
        raise SpecbenchError(f"drafter={drafter.get('name')} on engine=vllm needs its {method} checkpoint's directory")
    steps = drafter["depth"] if method in ("eagle", "eagle3") else drafter["gamma"]
    return {"method": method, "model": str(checkpoint), "num_speculative_tokens": int(steps)}


def check_engine_config(engine: dict, drafter: dict, run: dict) -> VllmSettings | None:
    """Every check of ``engine=`` before anything loads: its name, its settings, whether vLLM runs the drafter,
    and the run settings that only specbench's loop honours. Returns the vLLM settings (None for the specbench
    loop)."""
    name = engine.get("name")
    if name not in ENGINES:
        raise SpecbenchError(f"engine.name={name!r} is not an engine; choose engine={' or engine='.join(ENGINES)}")
    if name == "specbench":
        extra = sorted(set(engine) - {"name"})
        if extra:
            raise SpecbenchError(f"engine.{extra[0]} is not a setting of engine=specbench (it has none besides "
                                 "its name); settings such as engine.concurrency belong to engine=vllm")
        return None
    settings = VllmSettings.from_config(dict(engine))
    vllm_method(drafter)
    for key, value in LOOP_ONLY_RUN_SETTINGS.items():
        if str(run.get(key, value)) != value:
            raise SpecbenchError(f"run.{key}={run[key]} tunes specbench's own loop; engine=vllm runs vLLM's "
                                 f"scheduler, which has no such setting: use run.{key}={value} or engine=specbench")
    return settings
