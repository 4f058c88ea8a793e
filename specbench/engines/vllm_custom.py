"""``engine=vllm-custom`` (``conf/engine/vllm-custom.yaml``): specbench's own drafters inside vLLM's step, through vLLM
0.32's ``custom_class`` proposer, beside the same vLLM engine without speculation as the baseline. Everything else is
``engine=vllm``'s (``specbench.engines.vllm``): batch 1 paired, the load levels, the answers, summary, steps and load
files, vLLM's per-request acceptance counts.

What differs from ``engine=vllm``:

- the method is the run's drafter config itself (``vllm_custom_drafters``: which run, as what, and why the others
  cannot), built in vLLM's worker from the resolved config and loading the artefacts this process built or found in
  the cache (``vllm_proposer``); vLLM verifies its chain with its own rejection sampler;
- its label is ``<drafter>@vllm-custom``, ``<drafter>+chain@vllm-custom`` where the drafter's trees are cut to their
  best chain; the baseline's ``ar@vllm-custom``;
- each load level records what drafting cost inside vLLM's steps (``load.jsonl``'s ``proposer``: calls, seconds,
  milliseconds per call), read from counters the worker keeps;
- a drafter that fails in the worker stops the run with its own one line (the fault file), nothing of the question
  in flight written.
"""

from __future__ import annotations

import importlib.util
import shutil
import tempfile
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from specbench.distributed import Processes
from specbench.engines.base import BASELINE, METHOD
from specbench.engines.vllm import (VllmEngine, build_for_vllm, check_head_size, engine_arguments, release,
                                    save_for_vllm, start_engines, start_vllm_load, vllm_run_settings)
from specbench.engines.vllm_custom_drafters import custom_drafter
from specbench.engines.vllm_methods import VllmSettings, check_run_for_vllm
from specbench.errors import SpecbenchError
from specbench.run.environment import environment
from specbench.settings import RunSettings

SUFFIX = "@vllm-custom"
# vLLM's module that instantiates a custom proposer class (vLLM 0.32); a release without it has no custom_class.
CUSTOM_CLASS_MODULE = "vllm.v1.spec_decode.custom_class_proposer"


def check_custom_class(version: str) -> None:
    """Refuse, in one line, a vLLM whose speculative decoding has no ``custom_class`` method."""
    try:
        found = importlib.util.find_spec(CUSTOM_CLASS_MODULE) is not None
    except ModuleNotFoundError:
        found = False
    if not found:
        raise SpecbenchError(f"engine=vllm-custom needs vLLM's custom_class proposer ({CUSTOM_CLASS_MODULE}, in vLLM "
                             f"0.32), which this {version} lacks; build the environment of scripts/vllm_env.sh (vLLM "
                             "0.32) or run engine=vllm")


class VllmCustomEngine(VllmEngine):
    """vLLM with specbench's drafter as its proposer (see the module docstring)."""

    name = "vllm-custom"

    def __init__(self, *args, label: str, proposer_dir: Path, **kwargs):
        super().__init__(*args, **kwargs)
        self.decoded_by = {METHOD: f"{label}{SUFFIX}", BASELINE: f"ar{SUFFIX}"}
        self.drafter_name = label  # the method's name: "+chain" where the drafter's trees are cut
        self.method_suffix = SUFFIX
        self.proposer_dir = proposer_dir

    @classmethod
    def check_config(cls, engine: dict, drafter: dict, run: dict) -> VllmSettings:
        settings = VllmSettings.from_config(dict(engine), engine_name=cls.name)
        custom_drafter(drafter)
        check_run_for_vllm(run, cls.name)
        return settings

    @classmethod
    def load(cls, engine: VllmSettings, model_node: DictConfig, drafter_node: DictConfig, settings: RunSettings,
             processes: Processes) -> VllmCustomEngine:
        from specbench.engines.vllm_proposer import (CONFIG_KEY, PROPOSER_CLASS, ProposerCounters, ProposerSpec,
                                                     TargetIdentity, fault_line)
        from specbench.storage.cache import cache_root

        version, platform = start_vllm_load(cls.name, model_node, engine, settings, processes)
        check_custom_class(version)
        drafter_values = OmegaConf.to_container(drafter_node, resolve=True)
        shape = custom_drafter(drafter_values)

        drafter, model, sampling = build_for_vllm(drafter_node, model_node, platform, engine, settings)
        # Here, before vLLM starts, every artefact the drafter loads is built or found (HD's model database needs the
        # target's weights); vLLM's worker then loads the same ones and builds none.
        drafter.prepare(model, sampling)
        proposer_dir = Path(tempfile.mkdtemp(prefix="specbench-proposer-"))
        counters_path, fault_path = proposer_dir / "counters.f64", proposer_dir / "fault.json"
        ProposerCounters(counters_path, create=True)
        proposer = ProposerSpec(drafter_values, shape.label, shape.max_chain, shape.cut_to_chain,
                                TargetIdentity.of(model), str(counters_path), str(fault_path), str(cache_root(None)))
        spec = {"method": "custom_class", "model": PROPOSER_CLASS, "num_speculative_tokens": shape.max_chain}
        target_dir = model.checkpoint or save_for_vllm(model, model_node)
        run_settings = vllm_run_settings(model, drafter, spec, target_dir, engine, version, platform)
        run_settings["vllm"]["proposer"] = {"label": shape.label, "cut_to_chain": shape.cut_to_chain,
                                            "max_chain": shape.max_chain}
        env = {**environment(model), "engine": version, "vllm_platform": platform}
        sources = drafter.sources()
        args = engine_arguments(target_dir, model, engine, settings, platform)
        check_head_size(model, platform)
        release(model, drafter)
        drafter = None  # its databases too: vLLM's worker loads its own copy
        try:
            served = start_engines(args, spec, settings.baseline or bool(engine.concurrency), None, shape.label,
                                   method_args={"additional_config": {CONFIG_KEY: proposer.to_config()}},
                                   explain=lambda: fault_line(fault_path))
        except BaseException:
            shutil.rmtree(proposer_dir, ignore_errors=True)
            raise
        return cls(model, shape.label, settings, engine, served, run_settings, env, sources, greedy=sampling.greedy,
                   label=shape.label, proposer_dir=proposer_dir)

    def proposer_counters(self) -> dict | None:
        from specbench.engines.vllm_proposer import ProposerCounters

        return ProposerCounters(self.proposer_dir / "counters.f64").read()

    def close(self) -> None:
        try:
            super().close()
        finally:
            shutil.rmtree(self.proposer_dir, ignore_errors=True)
