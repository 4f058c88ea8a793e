"""What ``engine=vllm`` runs: its settings (``conf/engine/vllm.yaml``), the checks before anything loads
(``check_vllm_config``, which ``VllmEngine.check_config`` is) and how a drafter config maps onto vLLM's
``speculative_config``. Pure: imports neither vLLM nor torch, so the checks run before anything loads, in any
environment.

The mapping goes by the drafter's class (its ``_target_``), so a renamed or derived config (``drafter=sps``
derives from ``draft_model``) maps as its class does, and the drafter configs vLLM runs are derived from
conf/drafter/ (``vllm_drafters``): a new config of a mapped class runs on vLLM, one of another class is refused,
without an edit here.

    drafter class            vLLM method    settings read from the drafter config
    NoDraft (ar)             none           -
    PromptLookup (pld, pld-hd)
                             ngram          num_draft_tokens, max_ngram_size, min_ngram_size
    SuffixDecoding (suffix)  suffix         max_tree_depth, max_cached_requests, max_spec_tokens, max_spec_factor,
                                            min_token_prob (needs the arctic-inference package)
    Eagle (eagle, eagle2)    eagle          the head's directory, depth (tokens drafted per step); refused for a
                                            head whose fc has a bias (``fc_bias_refusal``)
    Eagle (eagle3)           eagle3         the head's directory, depth; as eagle
    Medusa (medusa)          medusa         the heads as vLLM reads them (``engines.vllm.medusa_for_vllm``), heads
    DraftModel (sps, draft_model, opt-small, wide-pruned, qwen-0.5b, ...)
                             draft_model    the draft's directory, gamma (tokens drafted per step)

vLLM's methods are not line for line the specbench drafters of the same config (docs/fidelity.md, "engine=vllm"):
its ngram drafts nothing when no n-gram matches (PLD verifies a dummy token), its EAGLE drafts a chain of
``depth`` tokens (EAGLE-2/3 verify a tree of 60), its Medusa a chain of each head's best token (Medusa-1 verifies
the 63-node tree), its draft model drafts a fixed ``gamma`` (sps adapts it). They run the same heads, or are
refused: vLLM 0.32 has no bias in the EAGLE heads' fc. vLLM has no Hydra. A run records the exact
``speculative_config`` it gave vLLM in run.json.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import ClassVar

from specbench.config import group_options, option_target
from specbench.engines.base import EngineSettings
from specbench.errors import SpecbenchError

# drafter class -> vLLM's method (None: no speculation, the AR baseline). The other classes have no method in vLLM
# 0.32 (vllm/config/speculative.py's methods): their drafters are specbench's own, Hydra's among them.
VLLM_METHODS = {
    "specbench.drafters.ar.NoDraft": None,
    "specbench.drafters.pld.PromptLookup": "ngram",
    "specbench.drafters.suffix.SuffixDecoding": "suffix",
    "specbench.drafters.eagle.Eagle": "eagle",  # or eagle3, by the head's kind
    "specbench.drafters.medusa.Medusa": "medusa",
    "specbench.drafters.draft_model.DraftModel": "draft_model",
}
# vLLM's method -> the weights it loads from the drafter (``Drafter.shared_weights``' kind); the others load none.
METHOD_WEIGHTS = {"eagle": "head", "eagle3": "head", "medusa": "head", "draft_model": "draft_model"}
# vLLM's methods whose head has an fc layer without a bias, whatever the checkpoint holds: vLLM 0.32 builds it with
# bias=False (model_executor/models/llama_eagle.py:110-118, llama_eagle3.py:242-250) and its weight loader drops
# every weight ending in .bias that the module lacks, without a word (model_executor/models/utils.py:457-458).
FC_WITHOUT_BIAS = ("eagle", "eagle3")
# Run settings that tune specbench's own loop; vLLM has nothing that honours them.
LOOP_ONLY_RUN_SETTINGS = {"draft_budget": "off", "verify_padding": "off"}


def vllm_drafters() -> list[str]:
    """The drafter configs (conf/drafter/) engine=vllm runs, in order: those whose class maps onto a vLLM method."""
    return [name for name in group_options("drafter") if option_target("drafter", name) in VLLM_METHODS]


@dataclass
class VllmSettings(EngineSettings):
    """``conf/engine/vllm.yaml``, checked (see that file for what each key does)."""

    NOT_RESULT_SETTINGS: ClassVar[dict[str, str]] = {
        "concurrency": "selects load levels: a run directory can be extended to more levels",
        "paired": "selects what is measured: a run under load can be extended by its paired questions",
        "request_timeout_s": "a limit: a request that outlives it is skipped or its level fails, never changed",
    }

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

    @property
    def load_levels(self) -> list[int]:
        return list(self.concurrency)

    @staticmethod
    def from_config(node: dict, engine_name: str = "vllm") -> VllmSettings:
        known = {item.name for item in fields(VllmSettings)}
        unknown = sorted(set(node) - known)
        if unknown:
            raise SpecbenchError(f"engine.{unknown[0]} is not a setting of engine={engine_name}; its settings: "
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
            f"engine=vllm runs drafter={', '.join(vllm_drafters())}")
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
    # medusa: one token per head, the first ``heads`` of the checkpoint (vLLM builds num_speculative_tokens heads)
    steps = {"eagle": "depth", "eagle3": "depth", "medusa": "heads"}.get(method, "gamma")
    return {"method": method, "model": str(checkpoint), "num_speculative_tokens": int(drafter[steps])}


def fc_bias_refusal(drafter_name: str, method: str, source: str, fc_bias: bool) -> str | None:
    """Why ``method`` on vLLM would not run the head at ``source`` that ``drafter_name`` runs on engine=specbench
    (None when it would): the head's fc has a bias (``fc_bias``: a non-zero ``fc.bias`` in the checkpoint, or a
    head specbench is about to train with one) and vLLM's has none (FC_WITHOUT_BIAS), so vLLM's acceptance would be
    another head's under this head's name. EAGLE-1's published heads and specbench's trained ones all have one
    (EAGLE's fc defaults to bias=True)."""
    if method not in FC_WITHOUT_BIAS or not fc_bias:
        return None
    return (f"drafter={drafter_name} on engine=vllm: its head ({source}) has an fc layer with a bias, which vLLM "
            f"0.32's {method} head lacks and its loader drops without a word, so vLLM would draft with another head "
            f"under drafter={drafter_name}'s name; run it on engine=specbench, or give a head whose fc has no bias "
            f"(config.json \"bias\": false)")


def check_vllm_config(engine: dict, drafter: dict, run: dict) -> VllmSettings:
    """Every check of ``engine=vllm`` before anything loads (``VllmEngine.check_config``): its settings, whether
    vLLM runs the drafter, and the run settings that only specbench's loop honours. Returns the settings."""
    settings = VllmSettings.from_config(dict(engine))
    vllm_method(drafter)
    check_run_for_vllm(run, "vllm")
    return settings


def check_run_for_vllm(run: dict, engine_name: str) -> None:
    """Refuse the run settings that only specbench's own loop honours (vLLM's engines, ``engine_name``)."""
    if run.get("regime", "eager") != "eager":
        raise SpecbenchError(f"run.regime={run['regime']} is a regime of specbench's own loop; engine={engine_name} "
                             f"compiles and captures its target in its own way: use run.regime=eager with "
                             f"engine={engine_name}")
    for key, value in LOOP_ONLY_RUN_SETTINGS.items():
        if str(run.get(key, value)) != value:
            raise SpecbenchError(f"run.{key}={run[key]} tunes specbench's own loop; engine={engine_name} runs vLLM's "
                                 f"scheduler, which has no such setting: use run.{key}={value} or engine=specbench")
