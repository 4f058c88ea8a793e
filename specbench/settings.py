"""The ``run`` config group as a typed schema: every decoding and measurement knob, with its valid range.

``conf/run/default.yaml`` holds the defaults with a comment per key and docs/configuration.md documents each;
``RunSettings.from_config`` checks a composed ``run`` node against this schema before anything is loaded, so
a bad value fails at once with a message naming the key, the value and what is allowed.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from specbench.measure import machine
from specbench.errors import SpecbenchError
from specbench.measure.mismatch import DEFAULT_TOLERANCE

if TYPE_CHECKING:
    from omegaconf import DictConfig

CALIBRATION_SIZES = [*range(1, 17), 20, 24, 28, 32, 40, 48, 56, 64, 80, 96, 128]
# run.regime: eager, Spec-Bench's (one Python call per kernel), or compiled (specbench.targets.compiled).
REGIMES = ("eager", "compiled")
COMPILE_BUCKETS = [1, 2, 4, 8, 16, 32, 64, 128]
COMPILE_MODES = ("default", "max-autotune-no-cudagraphs", "none")
NO_COMPILE_ON_A_CPU = ("run.compile_mode=none captures the eager kernels in CUDA graphs, which a CPU has not; on a CPU "
                       "choose default or max-autotune-no-cudagraphs")
# torch's generators take seeds up to 2**64 - 1 and raise on larger ones ("Overflow when unpacking long long").
MAX_SEED = 2**64 - 1
# Sampling divides float32 logits by the temperature: below about 1e-37 the quotient overflows to inf and the
# softmax gives NaN. 1e-4 keeps even float16's largest logit (65504) far from that; 0 asks for greedy outright.
MIN_TEMPERATURE = 1e-4


@dataclass(frozen=True)
class RunSettings:
    max_new_tokens: int = 1024
    baseline: bool = True
    alternate_order: bool = True
    warmup_runs: int = 1
    warmup_max_new_tokens: int = 32
    state_warmup_runs: int = 3
    state_warmup_turns: str = "all"
    state_warmup_max_new_tokens: int | None = None
    max_draft_tokens: int = 80
    verify_padding: str = "off"
    verify_padding_max: int = 16
    verify_padding_min_gain: float = 0.1
    calibration_repeats: int = 5
    calibration_sizes: list[int] = field(default_factory=lambda: list(CALIBRATION_SIZES))
    verify_cost_smoothing: float = 0.1
    draft_budget: str = "off"
    draft_budget_prior: float = 0.5
    draft_budget_prior_weight: float = 2.0
    draft_budget_explore: float = 0.3
    draft_budget_memory: float = 50
    draft_budget_max_depth: int = 12
    draft_budget_max_rank: int = 3
    target_top_k: int = 0
    mismatch_top_k: int = 8
    near_tie_tolerance: float | str = "auto"
    linear_backend: str = "auto"
    device: str = "auto"
    threads: int | None = None
    stall_factor: float = 3.0
    stall_min_s: float = 0.02
    stall_share: float = 0.1
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0
    regime: str = "eager"
    compile_buckets: list[int] = field(default_factory=lambda: list(COMPILE_BUCKETS))
    compile_mode: str = "default"

    @staticmethod
    def from_config(node: DictConfig | dict) -> RunSettings:
        """The settings of a composed ``run`` node, checked; unknown keys are refused by name."""
        # Imported here: the models import this module's constants, and the GPU check runs them without omegaconf.
        from omegaconf import DictConfig, OmegaConf

        values = OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else dict(node)
        known = {f.name for f in dataclasses.fields(RunSettings)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise SpecbenchError(f"unknown setting(s) {', '.join('run.' + key for key in unknown)}; the run group "
                                 f"has: {', '.join(sorted(known))}")
        settings = RunSettings(**values)
        settings.check()
        return settings

    def check(self) -> None:
        """Reject settings that cannot work, naming the key."""
        # NaN passes every comparison below (nan < 0 is False) and inf passes the lower bounds, so non-finite
        # numbers are refused first, whatever the key.
        for key in (f.name for f in dataclasses.fields(self)):
            value = getattr(self, key)
            if isinstance(value, float) and not math.isfinite(value):
                raise SpecbenchError(f"run.{key} must be a finite number, got {value!r}")
        for key in ("max_new_tokens", "max_draft_tokens", "verify_padding_max", "calibration_repeats",
                    "draft_budget_max_depth", "draft_budget_max_rank"):
            _require_int(key, getattr(self, key), minimum=1)
        _require_int("mismatch_top_k", self.mismatch_top_k, minimum=2)
        for key in ("warmup_runs", "warmup_max_new_tokens", "state_warmup_runs", "target_top_k"):
            _require_int(key, getattr(self, key), minimum=0)
        _require_int("seed", self.seed, minimum=0, maximum=MAX_SEED)
        _require_choice("state_warmup_turns", self.state_warmup_turns, ("all", "first"))
        if self.state_warmup_max_new_tokens is not None:
            _require_int("state_warmup_max_new_tokens", self.state_warmup_max_new_tokens, minimum=1, extra="or null")
        for key in ("baseline", "alternate_order"):
            if not isinstance(getattr(self, key), bool):
                raise SpecbenchError(f"run.{key} must be true or false, got {getattr(self, key)!r}")
        _require_choice("verify_padding", self.verify_padding, ("auto", "off"))
        _require_choice("draft_budget", self.draft_budget, ("auto", "off"))
        _require_range("verify_padding_min_gain", self.verify_padding_min_gain, 0, 1, "[0, 1)", upper_open=True)
        _require_range("verify_cost_smoothing", self.verify_cost_smoothing, 0, 1, "(0, 1]", lower_open=True)
        _require_range("draft_budget_explore", self.draft_budget_explore, 0, 1, "[0, 1]")
        _require_range("draft_budget_prior", self.draft_budget_prior, 0, 1, "(0, 1)", lower_open=True, upper_open=True)
        if not _is_number(self.draft_budget_memory) or self.draft_budget_memory < 1:
            raise SpecbenchError(f"run.draft_budget_memory must be at least 1, got {self.draft_budget_memory!r}")
        if not _is_number(self.draft_budget_prior_weight) or self.draft_budget_prior_weight <= 0:
            raise SpecbenchError(f"run.draft_budget_prior_weight must be positive, got {self.draft_budget_prior_weight!r}")
        if not (isinstance(self.calibration_sizes, list) and self.calibration_sizes
                and all(isinstance(s, int) and not isinstance(s, bool) and s >= 1 for s in self.calibration_sizes)):
            raise SpecbenchError(f"run.calibration_sizes must be a non-empty list of positive integers, "
                                 f"got {self.calibration_sizes!r}")
        if self.near_tie_tolerance != "auto" and (not _is_number(self.near_tie_tolerance) or self.near_tie_tolerance < 0):
            raise SpecbenchError(f"run.near_tie_tolerance must be auto or a non-negative number of logits, "
                                 f"got {self.near_tie_tolerance!r}")
        if not _is_number(self.temperature) or self.temperature < 0 or 0 < self.temperature < MIN_TEMPERATURE:
            raise SpecbenchError(f"run.temperature must be 0 (greedy) or at least {MIN_TEMPERATURE:g}, "
                                 f"got {self.temperature!r}")
        _require_range("top_p", self.top_p, 0, 1, "(0, 1]", lower_open=True)
        if not _is_number(self.stall_factor) or self.stall_factor <= 1:
            raise SpecbenchError(f"run.stall_factor must be a number above 1 (times a step's usual verify time), "
                                 f"got {self.stall_factor!r}")
        if not _is_number(self.stall_min_s) or self.stall_min_s < 0:
            raise SpecbenchError(f"run.stall_min_s must be a non-negative number of seconds, got {self.stall_min_s!r}")
        _require_range("stall_share", self.stall_share, 0, 1, "(0, 1]", lower_open=True)
        if self.threads is not None:
            _require_int("threads", self.threads, minimum=1, extra="or null")
            self._check_threads()
        self._check_regime()

    def _check_regime(self) -> None:
        """run.regime and its compile settings, checked whatever the regime (a sweep switches it per job); in the
        compiled regime the largest bucket must hold the largest pass, and the linear layers must be the model's
        own (torch.compile cannot trace oneDNN's packed ones)."""
        _require_choice("regime", self.regime, REGIMES)
        _require_choice("compile_mode", self.compile_mode, COMPILE_MODES)
        buckets = check_compile_buckets(self.compile_buckets)
        if self.regime != "compiled":
            return
        if buckets[-1] < self.max_draft_tokens + 1:
            raise SpecbenchError(f"run.compile_buckets ends at {buckets[-1]} tokens, but run.max_draft_tokens="
                                 f"{self.max_draft_tokens} makes passes of up to {self.max_draft_tokens + 1}: add a "
                                 f"bucket of at least {self.max_draft_tokens + 1} or lower run.max_draft_tokens")
        if self.compile_mode == "none" and str(self.device).startswith("cpu"):
            raise SpecbenchError(NO_COMPILE_ON_A_CPU)
        if self.linear_backend == "onednn":
            raise SpecbenchError("run.linear_backend=onednn cannot run under run.regime=compiled: torch.compile "
                                 "cannot trace oneDNN's packed layers and packs the weights itself; choose auto or "
                                 "aten")

    def _check_threads(self) -> None:
        """Refuse more threads than the cores this process may use: torch's threads wait for each other at every
        operator, so the surplus ones slow every step, and the timing check would then blame other processes.
        A refusal rather than a quiet cut, since run.json records the count and an explicit one is a choice."""
        cores = machine.usable_cores()
        most = machine.max_threads(cores)
        if self.threads > most:
            raise SpecbenchError(f"run.threads={self.threads} is more than the {cores:g} core(s) this process may use "
                                 f"(CPU affinity and cgroup quota); choose 1 to {most}, or null for one per free core")

    def check_context(self, max_context: int, where: str) -> None:
        """Refuse token counts that the model's context (``max_context`` tokens, named by ``where``, e.g.
        "model.max_context=8192") cannot hold next to a prompt of at least one token: such an answer, warm-up
        or draft would be cut at the context rather than at the setting, so the setting would not mean what it
        says."""
        counts = {"max_new_tokens": self.max_new_tokens, "warmup_max_new_tokens": self.warmup_max_new_tokens,
                  "state_warmup_max_new_tokens": self.state_warmup_max_new_tokens,
                  "max_draft_tokens": self.max_draft_tokens}
        for key, count in counts.items():
            if count is not None and count >= max_context:
                raise SpecbenchError(f"run.{key}={count} must be less than {where} (the context holds the prompt, "
                                     f"at least 1 token, and what is generated): at most {max_context - 1}")

    def state_warmup_length(self) -> int:
        """Tokens per turn of a state warm-up decode: ``state_warmup_max_new_tokens``, or the measured length."""
        return self.max_new_tokens if self.state_warmup_max_new_tokens is None else self.state_warmup_max_new_tokens

    def method_name(self, drafter_name: str) -> str:
        """The name a run's results are shown under: see ``method_name``."""
        return method_name(drafter_name, self.draft_budget, self.verify_padding, self.regime)

    def resolved_linear_backend(self) -> str:
        """run.linear_backend as the loader is asked for it: ``auto`` is ``aten`` in the compiled regime, whose
        compiler packs the weights itself."""
        return "aten" if self.regime == "compiled" and self.linear_backend == "auto" else self.linear_backend

    def tolerance(self, dtype: str) -> float:
        """The near-tie tolerance in logits for a model of ``dtype`` ("float32", ...)."""
        if self.near_tie_tolerance != "auto":
            return float(self.near_tie_tolerance)
        return DEFAULT_TOLERANCE.get(dtype, DEFAULT_TOLERANCE["float16"])

    def calibration_grid(self, largest: int) -> list[int]:
        """The token counts whose verify latency is measured, up to ``largest`` (always included)."""
        sizes = sorted(size for size in set(self.calibration_sizes) if size <= largest)
        return sizes if sizes and sizes[-1] == largest else [*sizes, largest]


def check_compile_buckets(buckets) -> tuple[int, ...]:
    """run.compile_buckets as a tuple: ascending distinct positive token counts starting at 1, or a one-line
    refusal."""
    # A list from Python or YAML, or OmegaConf's ListConfig as Hydra hands the target its settings.
    values = list(buckets) if isinstance(buckets, Sequence) and not isinstance(buckets, str) else None
    if (not values or not all(isinstance(b, int) and not isinstance(b, bool) and b >= 1 for b in values)
            or sorted(set(values)) != values or values[0] != 1):
        raise SpecbenchError(f"run.compile_buckets must be ascending distinct positive token counts starting at 1 "
                             f"(such as {COMPILE_BUCKETS}), got {buckets!r}")
    return tuple(values)


TUNING_SUFFIXES = (("draft_budget", "+budget"), ("verify_padding", "+pad"))


def method_name(drafter_name: str, draft_budget: str = "off", verify_padding: str = "off",
                regime: str = "eager") -> str:
    """A drafter's name with a suffix per tuning of specbench's own that is on, so that a tuned method is never
    shown under a published method's name, and ``@compiled`` in the compiled regime, so that its numbers are
    shown beside the eager ones Spec-Bench's are comparable with, never instead of them: ``hd``, ``hd+budget``,
    ``pld+budget+pad``, ``pld@compiled``.

    >>> method_name("hd", draft_budget="auto")
    'hd+budget'
    >>> method_name("pld", regime="compiled")
    'pld@compiled'
    """
    switches = {"draft_budget": draft_budget, "verify_padding": verify_padding}
    name = drafter_name + "".join(suffix for key, suffix in TUNING_SUFFIXES if switches[key] != "off")
    return name + ("" if regime == "eager" else f"@{regime}")


def _is_number(value) -> bool:
    """A finite int or float; a bool is not a number here."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _require_int(key: str, value, minimum: int, extra: str = "", maximum: int | None = None) -> None:
    if (not isinstance(value, int) or isinstance(value, bool) or value < minimum
            or (maximum is not None and value > maximum)):
        if maximum is not None:
            kind = f"an integer in [{minimum}, {maximum}]"
        else:
            kind = {0: "a non-negative integer", 1: "a positive integer"}.get(minimum, f"an integer >= {minimum}")
        raise SpecbenchError(f"run.{key} must be {kind}{' ' + extra if extra else ''}, got {value!r}")


def _require_choice(key: str, value, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise SpecbenchError(f"run.{key} must be {' or '.join(choices)}, got {value!r}")


def _require_range(key: str, value, low: float, high: float, shown: str, lower_open: bool = False,
                   upper_open: bool = False) -> None:
    ok = _is_number(value) and (value > low if lower_open else value >= low) and (
        value < high if upper_open else value <= high)
    if not ok:
        raise SpecbenchError(f"run.{key} must be in {shown}, got {value!r}")
