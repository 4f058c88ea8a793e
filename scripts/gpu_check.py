#!/usr/bin/env python
"""One command that checks specbench on the machine at hand and prints a PASS/FAIL table (docs/gpu.md).

    python3 scripts/gpu_check.py                   # the GPU if torch sees one, else the CPU (smaller sizes)
    python3 scripts/gpu_check.py --device cpu --quick --out check.json
    python3 scripts/gpu_check.py --out "$OUT/gpu_check.json"   # on the device tool's machine: $OUT comes back

Rows: (1) float32 losslessness of every drafter config on tiny-random against transformers' greedy generate();
(2) float16 / bfloat16 runs of every drafter against the AR decode of the same model, differences classified by
``specbench.measure.mismatch`` (near-tie or violation); (3) a 7B-shaped random Llama in float16 built on the device: memory
after load, after a 2,000-token prefill and after an 80-node verify, verify latency for q=1..80 at a 1k context,
device round trips per step, draft/verify/overhead shares of PLD and Token Recycling's 80-node tree; (4) accelerate's
device_map and transformers' tensor parallelism (``torchrun``) against one device; (5) each kind of trained head
(eagle, eagle3, medusa, hydra) trained on the device against the same training on the host. On a CPU the 7B shape
is replaced by a small one. Every row is guarded: an exception is a FAIL with its first line and the next row runs. Exit status 0
iff no row FAILs.

Drafter configs are composed with hydra as the tests compose them: on a bare GPU machine install the wheels that
``scripts/gpu_bundle.sh`` prepares (hydra-core, omegaconf, antlr4, pydivsufsort, gguf; the command it prints installs
them). Without hydra, rows 1-2 are FAIL with the reason and the rest still runs.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from specbench.reporting import reporting_user_errors  # noqa: E402  # standard library only
from specbench.interrupts import Interrupts  # noqa: E402

# Ctrl-C is one line and exit status 130 from here on, during the imports below (seconds) too.
_interrupts = Interrupts("gpu_check: interrupted before it started",
                         "gpu_check: interrupted; no table was printed, and no --out file written")
if __name__ == "__main__":
    _interrupts.arm()

import numpy as np  # noqa: E402
import torch  # noqa: E402

from specbench import testing  # noqa: E402  # the tests' kit: tiny model, greedy reference, cache, counting target
BIG_SHAPE = dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
                 num_key_value_heads=32, vocab_size=32000)  # Llama-2-7B / Vicuna-7B
SMALL_SHAPE = dict(hidden_size=256, intermediate_size=688, num_hidden_layers=4, num_attention_heads=4,
                   num_key_value_heads=4, vocab_size=32000)  # the CPU's stand-in
LATENCY_SIZES = [1, 2, 4, 8, 16, 32, 48, 64, 80]


@dataclass
class Row:
    name: str
    status: str  # PASS, FAIL, SKIP
    detail: str
    seconds: float = 0.0


class Check:
    def __init__(self, device: torch.device, quick: bool):
        self.device = device
        self.quick = quick
        self.cuda = device.type == "cuda"
        self.rows: list[Row] = []

    def guarded(self, name: str, function, *args) -> None:
        """Run one row (or a group: ``function`` may return a list of rows); an exception is a FAIL row."""
        began = time.perf_counter()
        try:
            result = function(*args)
        except Exception as error:  # noqa: BLE001 - every row reports, none stops the check
            message = (str(error).strip().splitlines() or [""])[0][:160]
            result = [Row(name, "FAIL", f"{type(error).__name__}: {message}")]
        rows = result if isinstance(result, list) else [Row(name, *result)]
        elapsed = time.perf_counter() - began
        for row in rows:
            row.seconds = row.seconds or elapsed / len(rows)
            self.rows.append(row)
            print(f"  {row.status:4}  {row.name}: {row.detail}", flush=True)


# ---- shared pieces ---------------------------------------------------------------------------------------


MADE_CACHES: list[Path] = []  # removed by main's finally


def isolated_cache() -> Path:
    """Databases the drafters build go to a throw-away cache, their corpus replaced by the tests' small text
    (as tests/conftest.py does), so no row downloads anything or reads the user's cache; recorded in MADE_CACHES
    the moment it exists (with Ctrl-C held back), since main's finally removes only those."""
    return testing.isolated_cache("specbench-gpu-check-", share_models=False, on_made=MADE_CACHES.append)


def drafter_names() -> list[str]:
    """The drafter configs, which rows 1-2 compose with hydra: without it those rows fail at once with this
    reason (the other rows need no config and still run)."""
    try:
        from specbench.config import group_options
    except ImportError as error:
        raise RuntimeError(f"composing the drafter configs needs hydra-core and omegaconf ({error}); install the "
                           "wheels of scripts/gpu_bundle.sh (docs/gpu.md)") from None
    return group_options("drafter")


# HD's auto model database, kept small: a check, not a study
MODEL_DB_BUILD = testing.small_model_db(max_prompts=8, max_new_tokens=64)


def make_drafter(name: str, model):
    return testing.configured_drafter(name, model, model_db=MODEL_DB_BUILD)


def decoder(target, max_draft_tokens: int = 96, clock=None):
    """The greedy decoder of ``target`` (a model's, or a wrapper of it)."""
    from specbench.decoding.loop import Decoder
    from specbench.decoding.sampling import Sampling

    return Decoder(target, frozenset(), max_draft_tokens, sampling=Sampling(temperature=0.0), clock=clock)


def no_draft():
    from specbench.drafters.ar import NoDraft

    return NoDraft()


# ---- row 1: float32 losslessness ----------------------------------------------------------------------------


def lossless_rows(check: Check) -> list[Row]:
    names = drafter_names()
    model = testing.tiny_random(check.device, "float32")
    ids = testing.prompt_ids(model)[:1] if check.quick else testing.prompt_ids(model)
    references = [testing.greedy_reference_with_top(model.weights.module, prompt, 64) for prompt in ids]
    rows = []
    for name in names:
        began = time.perf_counter()
        try:
            drafter = make_drafter(name, model)
            decodes = [decoder(model.target).generate(prompt, drafter, 64) for prompt in ids]
            row = lossless_verdict(name, decodes, references)
        except Exception as error:  # noqa: BLE001
            row = Row(f"1 lossless float32 {name}", "FAIL", f"{type(error).__name__}: {str(error).splitlines()[0][:160]}")
        row.seconds = time.perf_counter() - began
        rows.append(row)
    return rows


def lossless_verdict(name: str, decodes: list, references: list[tuple[list[int], tuple]]) -> Row:
    """Row 1 for one drafter: each decode (a ``Generation``) against generate()'s tokens and top logits. A
    difference is classified as row 2 classifies them: a near-tie (both passes preferred their own token by at
    most float32's tolerance, as a GPU's kernels for a different number of query tokens may order them) is
    reported as such and passes; anything else is a violation and fails."""
    from specbench.measure.mismatch import DEFAULT_TOLERANCE, diagnose

    tolerance = DEFAULT_TOLERANCE["float32"]
    near_ties, violations = [], []
    steps = tokens = 0
    for index, (generation, (reference, reference_top)) in enumerate(zip(decodes, references)):
        steps += len(generation.steps)
        tokens += len(generation.token_ids)
        mismatch = diagnose([generation.token_ids], [reference], [(generation.top_ids, generation.top_logits)],
                            [reference_top], tolerance, exact=True)
        if mismatch is not None:
            found = (f"prompt {index} at token {mismatch.index} "
                     f"(margins {mismatch.method_margin}, {mismatch.baseline_margin})")
            (near_ties if mismatch.kind == "near_tie" else violations).append(found)
    label = f"1 lossless float32 {name}"
    if violations:
        return Row(label, "FAIL", f"differs from generate() beyond a near-tie: {'; '.join(violations)}")
    detail = f"{len(decodes)} prompts x 64 tokens == generate(), {tokens / max(steps - len(decodes), 1):.2f} tok/step"
    if near_ties:
        detail = (f"{len(decodes) - len(near_ties)} of {len(decodes)} prompts x 64 tokens == generate(); near-tie "
                  f"(tolerance {tolerance}): {'; '.join(near_ties)}")
    return Row(label, "PASS", detail)


# ---- row 2: half precisions, classified ---------------------------------------------------------------------


def half_precision_row(check: Check, dtype: str):
    from specbench.measure.mismatch import DEFAULT_TOLERANCE, diagnose

    names = drafter_names()
    model = testing.tiny_random(check.device, dtype)
    ids = testing.prompt_ids(model)[:1] if check.quick else testing.prompt_ids(model)
    new_tokens = 32 if check.quick else 64
    tolerance = DEFAULT_TOLERANCE.get(dtype, DEFAULT_TOLERANCE["float16"])
    baselines = [decoder(model.target).generate(prompt, no_draft(), new_tokens) for prompt in ids]
    counts = {"identical": 0, "near_tie": 0, "violation": 0}
    violations = []
    for name in names:
        drafter = make_drafter(name, model)
        for prompt, baseline in zip(ids, baselines):
            generation = decoder(model.target).generate(prompt, drafter, new_tokens)
            mismatch = diagnose([generation.token_ids], [baseline.token_ids], [(generation.top_ids, generation.top_logits)],
                                [(baseline.top_ids, baseline.top_logits)], tolerance, exact=True)
            kind = "identical" if mismatch is None else mismatch.kind
            counts[kind] = counts.get(kind, 0) + 1
            if kind == "violation":
                violations.append(f"{name}@{mismatch.index}")
    detail = (f"{sum(counts.values())} decodes x {new_tokens} tokens vs AR: {counts['identical']} identical, {counts['near_tie']} near-tie, "
              f"{counts['violation']} violation (tolerance {tolerance})")
    if violations:
        detail += ": " + ", ".join(violations[:6])
    return ("FAIL" if violations else "PASS"), detail


# ---- row 3: a 7B-shaped model ------------------------------------------------------------------------------


def gib(value: int) -> str:
    return f"{value / 2**30:.2f}"


def build_big(check: Check):
    """A random Llama of the 7B shape built directly on the device in float16 (the CPU: a small shape in float32),
    wrapped as every loader wraps its model."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from specbench.models.loaded import finish_loading
    from specbench.models.prompt_format import ByteTokenizer

    shape = BIG_SHAPE if check.cuda else SMALL_SHAPE
    dtype = torch.float16 if check.cuda else torch.float32
    tokenizer = ByteTokenizer()  # random weights: ids past its 258 tokens are fine, text is never decoded
    config = LlamaConfig(**shape, max_position_embeddings=4096, initializer_range=0.02, tie_word_embeddings=False,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.eos_token_id)
    config._attn_implementation = "sdpa"
    previous = torch.get_default_dtype()
    torch.manual_seed(0)
    try:
        try:
            torch.set_default_dtype(dtype)  # weights initialised in float16 on the device: seconds for 7B
        except TypeError:  # a torch that refuses half default dtypes: float32 on the device, then converted
            pass
        with torch.device(check.device):
            model = LlamaForCausalLM(config).to(dtype)
    finally:
        torch.set_default_dtype(previous)
    label = "7B-shape float16" if check.cuda else f"small-shape (hidden {shape['hidden_size']}, " \
                                                  f"{shape['num_hidden_layers']} layers) float32"
    return finish_loading("random-7b-shape", model, tokenizer, "plain", None, check.device,
                          "random:seed=0", "aten", None, "single"), label


def memory(check: Check) -> tuple[str, str]:
    if not check.cuda:
        return "n/a", "n/a"
    torch.cuda.synchronize(check.device)
    return gib(torch.cuda.memory_allocated(check.device)), gib(torch.cuda.max_memory_allocated(check.device))


def random_prompt(length: int, seed: int, vocab: int = 256) -> list[int]:
    return np.random.default_rng(seed).integers(3, vocab, size=length).tolist()


def big_model_rows(check: Check) -> list[Row]:
    from specbench.decoding.contract import Draft
    from specbench.decoding.plan import plan_verification, verification_inputs

    rows = []
    began = time.perf_counter()
    if check.cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(check.device)
    model, label = build_big(check)
    loaded = memory(check)
    target = model.target
    prefill_length = 2000 if not check.quick else 500
    prompt = np.asarray(random_prompt(prefill_length, 1), dtype=np.int64)
    with torch.inference_mode():
        target.start(prefill_length + 80)
        target.request_hidden_states(())
        if check.cuda:
            torch.cuda.reset_peak_memory_stats(check.device)
        target.prefill(prompt, False, 8)
        prefilled = memory(check)
        start = target.length
        tokens = np.resize(prompt, 80)
        plan = plan_verification(Draft.chain(torch.as_tensor(tokens[1:])), int(tokens[0]), 80, 80)
        choices = target.verify(verification_inputs(plan, start, 80), plan.n_nodes, 8)
        verified = memory(check)
        target.truncate(0)
    del choices
    build_s = time.perf_counter() - began
    ok = target.length == 0
    rows.append(Row(f"3 {label} memory GiB (allocated/peak)", "PASS" if ok else "FAIL",
                    f"load {loaded[0]}/{loaded[1]}, {prefill_length}-token prefill {prefilled[0]}/{prefilled[1]}, "
                    f"80-node verify {verified[0]}/{verified[1]}", build_s))

    # verify latency curve at a 1k context (500 tokens in quick mode)
    began = time.perf_counter()
    context = 1000 if not check.quick else 250
    sizes = LATENCY_SIZES if not check.quick else [1, 8, 32, 80]
    latency = decoder(model.target).measure_verify_latency(random_prompt(context, 2), sizes, repeats=1 if check.quick else 5)
    curve = " ".join(f"{q}:{seconds * 1e3:.1f}" for q, seconds in latency.items())
    monotone_ish = latency[sizes[-1]] >= 0.5 * latency[sizes[0]]
    rows.append(Row(f"3 verify latency ms at {context} ctx", "PASS" if monotone_ish else "FAIL", f"q={curve}",
                    time.perf_counter() - began))

    # device round trips per step: greedy AR and PLD, counted as tests/test_loop_phases.py (RoundTrips) counts them,
    # and on CUDA every synchronisation torch itself makes (TorchSyncs), which those wrappers cannot see
    began = time.perf_counter()
    trips = []
    for name, drafter in (("ar", no_draft()), ("pld", make_pld())):
        per_step = count_round_trips(target, drafter, random_prompt(64, 3) * 2, 16, TorchSyncs(check.cuda))
        trips.append((name, per_step[1:-1]))
    rows.append(Row("3 round trips per greedy step (want 1 sync, 1 read)", *round_trip_verdict(trips),
                    time.perf_counter() - began))

    # draft / verify / overhead shares for PLD and Token Recycling's 80-node tree
    began = time.perf_counter()
    shares = []
    new_tokens = 64 if not check.quick else 16
    for name, drafter in (("pld", make_pld()), ("recycling", make_recycling(model))):
        repeated = random_prompt(96, 4) * 3  # repeats give PLD something to match
        generation = decoder(model.target).generate(repeated, drafter, new_tokens)
        steps = generation.steps[1:]
        draft, verify, overhead = (sum(getattr(step, field) for step in steps)
                                   for field in ("draft_s", "verify_s", "overhead_s"))
        total = draft + verify + overhead or 1.0
        nodes = max(step.verify_tokens for step in steps)
        shares.append(f"{name} draft {draft / total:.0%} verify {verify / total:.0%} overhead {overhead / total:.0%} "
                      f"({len(steps)} steps, {verify / len(steps) * 1e3:.1f} ms/verify, max {nodes} tokens)")
        if name == "recycling" and nodes < 80:
            shares.append("recycling verified fewer than 80 tokens")
    status = "FAIL" if any(text.startswith("recycling verified") for text in shares) else "PASS"
    rows.append(Row("3 step shares", status, "; ".join(shares), time.perf_counter() - began))

    began = time.perf_counter()
    try:  # its own FAIL: the rows measured above are kept whatever happens here
        verdict = loop_verify_verdict(check, model)
    except Exception as error:  # noqa: BLE001
        verdict = ("FAIL", f"{type(error).__name__}: {(str(error).strip().splitlines() or [''])[0][:160]}")
    rows.append(Row("3 loop verify vs its own pass (want <= 1.5x)", *verdict, time.perf_counter() - began))
    del model, target
    if check.cuda:
        torch.cuda.empty_cache()
    return rows


LOOP_VERIFY_LIMIT = 1.5  # the loop's verify_s may exceed the pass inside it by this factor (fence, read, uploads)


class PassTimes:
    """Inside ``target``'s verify passes while active: how long the host spends queuing the forward pass
    (``launch_s``, its return on the host) and the device's span of it (``device_s``, CUDA events recorded before
    and after the call: from the first kernel's queuing to the last one's end; empty on a CPU, where the pass runs
    as it is launched). A device span far over the host's queuing says the kernels are slow; a span close to it
    says the host is (the device then waits for each launch), and torch's profile tells which kernels."""

    def __init__(self, target, cuda: bool):
        self.target, self.cuda = target, cuda
        self.launch_s: list[float] = []
        self.device_s: list[float] = []
        self._events: list = []

    def __enter__(self):
        original = self.target._forward

        def timed(**inputs):
            if self.cuda:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
            began = time.perf_counter()
            output = original(**inputs)
            self.launch_s.append(time.perf_counter() - began)
            if self.cuda:
                end.record()
                self._events.append((start, end))
            return output

        self.target._forward = timed
        return self

    def __exit__(self, *exc):
        del self.target._forward  # the class's method again
        if self.cuda:
            torch.cuda.synchronize()
            self.device_s = [start.elapsed_time(end) / 1e3 for start, end in self._events]
        return False


def loop_verify_verdict(check: Check, model) -> tuple[str, str]:
    """The verify_s that the loop records per step against the pass inside it: every report divides by verify_s,
    so it must be the pass's cost, not the pass plus something the loop does around it. Greedy AR and PLD over a
    repeated random prompt; each step's verify_s is set beside that same pass's own time (``PassTimes``: the
    host's queuing of it and, on a GPU, the device's span of it, whichever is longer), so the host's speed drifting
    between two measurements cannot move the ratio. The first H200 run compared the loop with a pass timed alone
    afterwards and saw ratios of 2.13x (AR) and 0.48x (PLD) in one run: a 7B eager forward at these sizes is bound
    by the host's kernel launches, whose speed moved 2-3x within seconds. The lone pass is still reported, and a
    pass whose device span is no longer than its queuing is named host-bound (the device waited for the launches).
    Judged on a GPU only (``ratio_verdict``)."""
    prompt = random_prompt(96, 4) * 3
    new_tokens = 32 if check.quick else 64
    medians, found = {}, []
    for name, drafter in (("ar", no_draft()), ("pld", make_pld())):
        with PassTimes(model.target, check.cuda) as passes:
            generation = decoder(model.target).generate(prompt, drafter, new_tokens)
        steps = generation.steps[1:]
        launch, device = passes.launch_s[1:], passes.device_s[1:]  # [0] is the prefill's
        if len(launch) != len(steps):
            raise RuntimeError(f"{name}: {len(launch)} verify passes for {len(steps)} steps: one pass a step expected")
        own = [max(queued, spanned) for queued, spanned in zip(launch, device or [0.0] * len(launch))]
        medians[name] = float(np.median([step.verify_s / seconds for step, seconds in zip(steps, own)]))
        context = int(np.median([step.context_len for step in steps]))
        alone = decoder(model.target).measure_verify_latency(
            (prompt * 2)[:context], sorted({step.verify_tokens for step in steps}), repeats=2 if check.quick else 5)
        text = (f"{name}: {len(steps)} steps at ~{context} ctx, loop verify "
                f"{np.median([step.verify_s for step in steps]) * 1e3:.1f} ms vs its pass "
                f"{np.median(own) * 1e3:.1f} ms (median ratio {medians[name]:.2f}x); the pass: host queues it in "
                f"{np.median(launch) * 1e3:.1f} ms")
        if device:
            bound = "host-bound" if np.median(device) <= 1.05 * np.median(launch) else "device-bound"
            text += f", device span {np.median(device) * 1e3:.1f} ms ({bound})"
        text += f"; the same size alone afterwards {np.median([alone[step.verify_tokens] for step in steps]) * 1e3:.1f} ms"
        found.append(text)
    status = ratio_verdict(medians, judged=check.cuda)
    if status == "FAIL":
        try:
            print_profile(model, prompt)
        except Exception as error:  # noqa: BLE001 - the profile explains a FAIL, it does not replace it
            print(f"  (no profile: {type(error).__name__}: {str(error).splitlines()[0][:160]})", flush=True)
    suffix = "" if check.cuda else " (not judged on a CPU: another job's load moves single passes)"
    return status, "; ".join(found) + suffix


def ratio_verdict(medians: dict[str, float], judged: bool, limit: float = LOOP_VERIFY_LIMIT) -> str:
    """FAIL when a drafter's median ratio of the loop's verify to its own pass is over ``limit`` and the row is
    ``judged`` (on a GPU; a CPU shared with other jobs times single passes too loosely to judge).

    Example: {"ar": 1.1, "pld": 3.1} judged -> FAIL; not judged -> PASS."""
    return "FAIL" if judged and any(ratio > limit for ratio in medians.values()) else "PASS"


def print_profile(model, prompt: list[int], new_tokens: int = 16) -> None:
    """Where a slow loop's time goes: torch's profiler over a short PLD decode, its busiest operators by host time
    and by device time, printed above the table (the check's output is what comes back from a GPU machine)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as profiled:
        decoder(model.target).generate(prompt, make_pld(), new_tokens)
    averages = profiled.key_averages()
    print(f"profile of a {new_tokens}-token PLD decode, by host time:", flush=True)
    print(averages.table(sort_by="cpu_time_total", row_limit=14, max_name_column_width=48), flush=True)
    print("by device time:", flush=True)
    print(averages.table(sort_by="self_cuda_time_total", row_limit=10, max_name_column_width=48), flush=True)


def make_pld():
    from specbench.drafters.pld import PromptLookup

    return PromptLookup(max_ngram_size=3, min_ngram_size=1, num_draft_tokens=10, prefer="earliest",
                        full_continuation=True, no_match_token=100)


def make_recycling(model):
    from specbench.drafters.recycling import TokenRecycling

    drafter = TokenRecycling(template="2.2.2", top_k=8, hot_start=True, learn_from_prompt=False, update_on_eos=False)
    drafter.prepare(model)
    return drafter


class TorchSyncs:
    """Every synchronisation between host and device that torch makes while it is active, counted on CUDA by
    ``torch.cuda.set_sync_debug_mode("warn")`` (a warning for each: a ``.item()``, a blocking copy to the host, a
    fence); on a CPU there is none to count (``count`` stays None)."""

    def __init__(self, cuda: bool):
        self.cuda = cuda
        self.count = None if not cuda else 0
        self._seen = None

    def __enter__(self):
        if self.cuda:
            self._catcher = warnings.catch_warnings(record=True)
            self._seen = self._catcher.__enter__()
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
        return self

    def update(self) -> None:
        if self._seen is not None:
            self.count += sum("synchroniz" in str(warning.message) for warning in self._seen)
            self._seen.clear()

    def __exit__(self, *exc):
        if self.cuda:
            torch.cuda.set_sync_debug_mode("default")
            self.update()
            self._catcher.__exit__(*exc)
            self._seen = None
        return False


def round_trip_verdict(trips: list[tuple[str, list[dict]]]) -> tuple[str, str]:
    """Row 3's round trips from each decoder's full steps: PASS when every step made 1 fence and 1 blocking read
    and, where torch's own synchronisations were counted, no more of those than the wrapped fences, reads and
    uploads account for (``torch_expected``): a sync inside torch that the wrappers do not see, an ``.item()`` in
    the loop, costs a round trip they miss."""
    bad = [(name, step) for name, full in trips for step in full if (step["syncs"], step["reads"]) != (1, 1)]
    hidden = [(name, step) for name, full in trips for step in full
              if step.get("torch_syncs") is not None and step["torch_syncs"] > step["torch_expected"]]
    parts = []
    for name, full in trips:
        text = (f"{name}: syncs {sorted({s['syncs'] for s in full})} reads {sorted({s['reads'] for s in full})} "
                f"uploads {sorted({s['uploads'] for s in full})}")
        counted = sorted({s["torch_syncs"] for s in full if s.get("torch_syncs") is not None})
        text += f" torch syncs {counted}" if counted else " torch syncs n/a (CPU)"
        parts.append(f"{text} over {len(full)} steps")
    empty = any(not full for _, full in trips)
    summary = ", ".join(parts)
    if hidden:
        name, step = hidden[0]
        summary += f"; {len(hidden)} step(s) with syncs inside torch, e.g. {name} {step}"
    return ("FAIL" if bad or hidden or empty else "PASS"), summary


def count_round_trips(target, drafter, ids, max_new_tokens, torch_syncs: TorchSyncs | None = None) -> list[dict]:
    """Per step of greedy decoding on ``target``: fence synchronisations, blocking reads of the choices and uploads
    (counted by the test kit's CountingTarget around it; the clock fences through it), and with ``torch_syncs``
    on CUDA every synchronisation torch made (``torch_syncs``; None where not counted)."""
    from specbench.decoding.loop import FencedClock

    torch_syncs = torch_syncs or TorchSyncs(False)
    counted = testing.CountingTarget(target)
    kinds = ("syncs", "reads", "uploads")
    per_step, last, last_torch = [], dict(counted.counts), 0

    def on_step(generated, elapsed):
        nonlocal last, last_torch
        made = counted.since(last)
        step = {kind: made[kind] for kind in kinds}
        torch_syncs.update()
        step["torch_syncs"] = None if torch_syncs.count is None else torch_syncs.count - last_torch
        step["torch_expected"] = sum(step[kind] * cost for kind, cost in costs.items())
        last_torch = torch_syncs.count or 0
        per_step.append(step)
        last = dict(counted.counts)

    def cost(operation) -> int:
        """How many synchronisations torch reports for one ``operation`` on its own."""
        torch_syncs.update()
        before = torch_syncs.count or 0
        operation()
        torch_syncs.update()
        return (torch_syncs.count or 0) - before

    with torch_syncs:
        # What one fence, one read and one upload cost in torch's count on this machine, each alone (on the
        # target itself, uncounted): a step may make that many and no more.
        costs = {"syncs": cost(target.synchronize),
                 "reads": cost(lambda: target._download(torch.zeros(2, dtype=torch.long, device=target.device))),
                 "uploads": cost(lambda: target._upload_to(np.zeros(2, dtype=np.int64), target.device, "offsets"))}
        last_torch = torch_syncs.count or 0
        last = dict(counted.counts)
        clock = FencedClock(counted.synchronize)
        decoder(counted, clock=clock).generate(ids, drafter, max_new_tokens, on_step=on_step)
    return per_step


# ---- row 4: placements ---------------------------------------------------------------------------------------


def decode_all(model, names=("ar", "pld", "recycling"), max_new_tokens=32) -> dict[str, list[list[int]]]:
    ids = testing.prompt_ids(model)
    found = {}
    for name in names:
        drafter = {"ar": no_draft, "pld": make_pld}.get(name, lambda: make_recycling(model))()
        found[name] = [decoder(model.target).generate(prompt, drafter, max_new_tokens).token_ids for prompt in ids]
    return found


def device_map_row(check: Check, device_map: str):
    if device_map == "auto":
        single = decode_all(testing.tiny_random(torch.device("cuda:0"), linear_backend="aten"))
        placed_model = testing.tiny_random(torch.device("cuda:0"), linear_backend="aten", device_map="auto")
        devices = sorted({str(device) for device in placed_model.devices})
    else:
        single = decode_all(testing.tiny_random(torch.device("cpu"), linear_backend="aten"))
        placed_model = testing.tiny_random(torch.device("cpu"), linear_backend="aten", device_map="cpu")
        devices = ["cpu"]
    placed = decode_all(placed_model)
    differ = [name for name in single if single[name] != placed[name]]
    return ("FAIL" if differ else "PASS",
            f"device_map={device_map} over {devices} ({placed_model.placement}): "
            + (f"{differ} differ from one device" if differ else f"{', '.join(single)} tokens == one device"))


def tensor_parallel_launch(check: Check, out: Path) -> tuple[int, str, list[str], dict]:
    """The torchrun command of the tensor-parallel row and its environment: one process per GPU with two or more,
    else 2 CPU processes with CUDA hidden from them (transformers binds each process to the GPU of its LOCAL_RANK
    whenever torch sees one, and a one-GPU machine has no second)."""
    gpus = torch.cuda.device_count() if check.cuda else 0
    processes, where = (gpus, "cuda") if gpus >= 2 else (2, "cpu")
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(processes),
               str(Path(__file__).resolve()), "--tp-worker", "--device", where, "--out", str(out)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if where == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""
    return processes, where, command, env


def tensor_parallel_row(check: Check):
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "tp.json"
        processes, where, command, env = tensor_parallel_launch(check, out)
        done = subprocess.run(command, capture_output=True, text=True, timeout=240, env=env)
        if done.returncode != 0 or not out.exists():
            tail = [line for line in (done.stderr or done.stdout).splitlines() if line.strip()][-1:] or ["no output"]
            return "FAIL", f"torchrun x{processes} exited {done.returncode}: {tail[0][:160]}"
        sharded = json.loads(out.read_text())
    single = decode_all(testing.tiny_random(torch.device("cuda:0" if where == "cuda" else "cpu"), linear_backend="aten"))
    differ = [name for name in single if single[name] != sharded["tokens"][name]]
    label = f"tp_plan=auto, torchrun x{processes} ({where}{', gloo' if where == 'cpu' else ', nccl'})"
    return ("FAIL" if differ else "PASS",
            f"{label}: " + (f"{differ} differ from one process" if differ else
                            f"{', '.join(single)} tokens == one process"))


def tp_worker(args) -> int:
    """One process of the tensor-parallel row (under torchrun): rank 0 writes the tokens."""
    from specbench.models.placement import rank

    device = torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}") if args.device == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    model = testing.tiny_random(device, linear_backend="aten", tp_plan="auto")
    tokens = decode_all(model)
    if rank() == 0:
        Path(args.out).write_text(json.dumps({"tokens": tokens, "placement": model.placement}))
    if torch.distributed.is_initialized():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()
    return 0


# ---- row 5: head training on the device -----------------------------------------------------------------------

# Each kind's recipe for the row: a few steps of a small head on tiny-random (the trainer's settings otherwise), at
# learning rates that move every kind's head well away from its start in those steps.
TRAINING_KINDS = {
    "eagle": {"noise": 0.2, "lr": 3e-3},
    "eagle3": {"feature_layers": [0, 1, 2], "draft_vocab_size": 64, "ttt_steps": 2, "lr": 3e-3},
    "medusa": {"heads": 2, "lr": 3e-3},
    "hydra": {"num_heads": 2, "num_layers": 2, "dropout_rate": 0.1, "lr": 3e-3},
}
TRAINING_STEPS = 8
LOSS_TOLERANCE = 1e-3  # relative, per step: float32 on the device against float32 on the host
# The device's trained weights against the host's, relative to how far training moved them: a device whose updates
# went nowhere is 1.0 away, float32's differences between the two are orders of magnitude under this.
WEIGHT_TOLERANCE = 1e-2
CHAIN_AGREEMENT = 0.99  # the share of the trained heads' chain tokens the two runs must draft alike (near-ties aside)


def training_conversations(vocab: int, count: int = 8) -> list[tuple[list[int], list[int]]]:
    """(prompt, answer) token ids drawn at random: the trainer reads the target's features of whatever it is given,
    and the row compares two devices on the same data, not what a head learns."""
    rng = np.random.default_rng(7)
    return [(rng.integers(3, vocab, 12).tolist(), rng.integers(3, vocab, 40).tolist()) for _ in range(count)]


def training_recipe(kind: str):
    from specbench.training.heads import recipe_of

    return recipe_of(kind, {"train_steps": TRAINING_STEPS, "batch_sequences": 2, "held_out": 0, "warmup_steps": 1,
                            **TRAINING_KINDS[kind]})


def train_on(model, kind: str, sequences: list, scratch: Path) -> dict:
    """A head of ``kind`` for ``model`` trained on ``model``'s device as ``build_trained_head`` trains one (a new head
    on the host, placed on the device with its labels, ``train``), over the given ``sequences`` (the target's features
    on the host, computed once for both runs); its chains over the same sequences; saved and loaded back by the
    kind's hooks. Returns the losses, the weights before and after (on the host), the chains and where the head was."""
    from specbench.training import methods
    from specbench.training.heads import Labels, batch_depth, chain_positions, make_batch, place, train

    module = methods.module(kind)
    recipe = training_recipe(kind)
    head = module.new_head(model, kind, recipe, sequences)
    initial = {name: tensor.detach().clone() for name, tensor in head.named_parameters() if tensor.requires_grad}
    draft_ids = getattr(module, "draft_ids", None)
    labels = Labels(model, draft_ids(head, kind) if draft_ids is not None else None)
    head = place(head, module, kind, model.device)
    labels.to(model.device)
    losses, seconds = train(head, labels, sequences, kind, recipe, scratch / f"{kind}-{model.device.type}",
                            {"gpu_check": kind})
    where = {str(tensor.device) for tensor in head.parameters()}
    positions = chain_positions(module, kind, recipe)
    head.eval()
    with torch.no_grad():
        batch = make_batch(sequences, batch_depth(module, kind, recipe)).to(model.device)
        chain = module.chain_tokens(head, labels, batch, kind, positions).cpu()
    trained = {name: tensor.detach().cpu() for name, tensor in head.named_parameters() if name in initial}
    saved = scratch / f"{kind}-{model.device.type}-head"
    module.save(head, kind, saved)
    module.load(model, saved, kind)  # strict: it fits the target it was trained for
    return {"losses": losses, "seconds": seconds, "devices": where, "initial": initial, "trained": trained,
            "chain": chain}


def training_rows(check: Check) -> list[Row]:
    """Row 5: each kind's head trained on the device and on the host from the same start and the same data (the
    device target's features): its losses step by step, its weights and its chains must agree (on a CPU both runs
    are the host's: the row checks the path still runs); then one whole build (``build_trained_head``) for a
    bfloat16 target on the device."""
    from specbench.training import methods
    from specbench.training.heads import target_sequences

    rows = []
    device_model = testing.tiny_random(check.device, "float32")
    host_model = device_model if not check.cuda else testing.tiny_random(torch.device("cpu"), "float32")
    conversations = training_conversations(device_model.vocab_size)
    with tempfile.TemporaryDirectory() as scratch:
        for kind in TRAINING_KINDS:
            began = time.perf_counter()
            label = f"5 {kind} head trains on {check.device.type}"
            try:
                module = methods.module(kind)
                layers = tuple(module.feature_layers(kind, device_model.num_layers, training_recipe(kind)))
                sequences = target_sequences(device_model, conversations, layers, f"{kind} features")
                there = train_on(device_model, kind, sequences, Path(scratch))
                here = there if not check.cuda else train_on(host_model, kind, sequences, Path(scratch))
                rows.append(Row(label, *training_verdict(there, here, check.device)))
            except Exception as error:  # noqa: BLE001 - each kind reports, the next one runs
                rows.append(Row(label, "FAIL", f"{type(error).__name__}: {str(error).splitlines()[0][:160]}"))
            rows[-1].seconds = time.perf_counter() - began
        began = time.perf_counter()
        label = f"5 build of an eagle3 head for a bfloat16 target on {check.device.type}"
        try:
            rows.append(Row(label, *half_precision_build(check, conversations, Path(scratch))))
        except Exception as error:  # noqa: BLE001
            rows.append(Row(label, "FAIL", f"{type(error).__name__}: {str(error).splitlines()[0][:160]}"))
        rows[-1].seconds = time.perf_counter() - began
    return rows


def weight_distance(there: dict, here: dict) -> float:
    """||trained there - trained here|| / ||trained here - initial||: 0 for the same training, 1 for a device run that
    never moved its head; infinite when the host's training did not move it either."""
    apart = sum(float((there["trained"][name] - here["trained"][name]).float().pow(2).sum()) for name in here["trained"])
    moved = sum(float((here["trained"][name] - here["initial"][name]).float().pow(2).sum()) for name in here["trained"])
    return float("inf") if moved == 0 else (apart / moved) ** 0.5


def training_verdict(there: dict, here: dict, device: torch.device) -> tuple[str, str]:
    """PASS when the head stayed on ``device``, every loss is finite, and the device's run is the host's: each step's
    loss within LOSS_TOLERANCE (relative), the trained weights within WEIGHT_TOLERANCE of the host's (relative to
    how far training moved them) and at least CHAIN_AGREEMENT of the chain tokens alike."""
    import math

    problems = []
    if {torch.device(name).type for name in there["devices"]} != {device.type}:
        problems.append(f"the head's parameters are on {sorted(there['devices'])}")
    if not all(math.isfinite(loss) for loss in there["losses"]):
        problems.append("a loss is not finite")
    worst = max((abs(a - b) / max(abs(b), 1e-8) for a, b in zip(there["losses"], here["losses"])), default=0.0)
    if len(there["losses"]) != len(here["losses"]) or worst > LOSS_TOLERANCE:
        problems.append(f"losses differ from the host's by up to {worst:.1e} (relative)")
    distance = weight_distance(there, here)
    if not distance <= WEIGHT_TOLERANCE:
        problems.append(f"trained weights {distance:.2g} of the training's own movement away from the host's"
                        if math.isfinite(distance) else "training did not move the head on the host")
    agreement = float((there["chain"] == here["chain"]).float().mean()) if there["chain"].shape == here["chain"].shape \
        else 0.0
    if agreement < CHAIN_AGREEMENT:
        problems.append(f"{agreement:.1%} of the chain tokens alike")
    detail = (f"{len(there['losses'])} steps in {there['seconds']:.1f} s, loss {there['losses'][0]:.3f} -> "
              f"{there['losses'][-1]:.3f}; against the host's: losses within {worst:.1e}, weights {distance:.1e} of "
              f"their movement, chains {agreement:.1%} alike; saved, loads back")
    return ("FAIL", "; ".join(problems)) if problems else ("PASS", detail)


def half_precision_build(check: Check, conversations: list, scratch: Path) -> tuple[str, str]:
    """One whole build by ``build_trained_head`` (the draft vocabulary counted, the head placed, trained, measured,
    published, its manifest) for tiny-random in bfloat16 on the device, on ``conversations`` instead of the head
    prompts' answers: the features come from a half-precision target, the head trains in float32 beside it."""
    import math

    import specbench.artefacts.trained_head as trained_heads
    from specbench.artefacts.trained_head import build_trained_head, load_trained_head

    model = testing.tiny_random(check.device, "bfloat16")
    saved = (trained_heads.training_conversations, trained_heads.training_prompts)
    trained_heads.training_conversations = lambda target, recipe: conversations
    trained_heads.training_prompts = lambda recipe: [str(index) for index in range(len(conversations))]
    try:
        directory = scratch / "eagle3-bfloat16"
        manifest = build_trained_head(model, directory, "eagle3", train_steps=TRAINING_STEPS, batch_sequences=2,
                                      held_out=2, warmup_steps=1, **TRAINING_KINDS["eagle3"])
    finally:
        trained_heads.training_conversations, trained_heads.training_prompts = saved
    load_trained_head(model, directory, "eagle3", "a check: nothing to rebuild")
    losses = [manifest["loss"]["first"], manifest["loss"]["last20"]]
    problems = []
    if not str(manifest["trained_on"]).startswith(check.device.type):
        problems.append(f"the manifest says it trained on {manifest['trained_on']}")
    if not all(loss is not None and math.isfinite(loss) for loss in losses):
        problems.append(f"losses {losses}")
    detail = (f"trained on {manifest['trained_on']}, loss {losses[0]} -> {losses[1]}, held out "
              f"{manifest['held_out_acceptance']['acceptance'][:2]}..., published and loaded back")
    return ("FAIL", "; ".join(problems)) if problems else ("PASS", detail)


# ---- the command ---------------------------------------------------------------------------------------------


def resolve(device: str) -> torch.device:
    """``--device`` as ``run.device`` resolves it (one line and exit 2 when torch cannot give it)."""
    from specbench.errors import SpecbenchError
    from specbench.models.devices import resolve_device

    try:
        return resolve_device(device)
    except SpecbenchError as error:
        print(f"gpu_check: {error}", file=sys.stderr)
        raise SystemExit(2) from None


def environment(device: torch.device) -> str:
    import transformers

    parts = [f"python {sys.version.split()[0]}", f"torch {torch.__version__}", f"transformers {transformers.__version__}"]
    if device.type == "cuda":
        parts.append(f"{torch.cuda.device_count()} x {torch.cuda.get_device_name(0)} (CUDA {torch.version.cuda})")
    else:
        parts.append(f"cpu, {torch.get_num_threads()} threads")
    return ", ".join(parts)


ROW_GROUPS = ("1", "2", "3", "4", "tp", "5")


def row_groups(text: str) -> list[str]:
    chosen = [part.strip() for part in text.split(",") if part.strip()]
    unknown = [part for part in chosen if part not in ROW_GROUPS]
    if unknown or not chosen:
        raise argparse.ArgumentTypeError(f"{text!r}: choose from {', '.join(ROW_GROUPS)}, comma-separated")
    return chosen


def skip(check: Check, name: str, reason: str) -> None:
    check.rows.append(Row(name, "SKIP", reason))
    print(f"  SKIP  {name}: {reason}", flush=True)


def run_rows(check: Check, groups: list[str]) -> None:
    """The rows of ``groups`` (ROW_GROUPS), in the table's order."""
    if "1" in groups:
        check.guarded("1 lossless float32", lossless_rows, check)
    if "2" in groups:
        for dtype in ["float16", "bfloat16"] if check.cuda else ["bfloat16"]:
            check.guarded(f"2 {dtype} vs AR (mismatch classes)", half_precision_row, check, dtype)
        if not check.cuda:
            skip(check, "2 float16 vs AR (mismatch classes)", "CPU: float16 matmuls are slow there")
    if "3" in groups:
        check.guarded("3 7B-shaped model", big_model_rows, check)
    if "4" in groups:
        gpus = torch.cuda.device_count() if check.cuda else 0
        if gpus >= 2:
            check.guarded("4 device_map=auto", device_map_row, check, "auto")
        else:
            skip(check, "4 device_map=auto over GPUs", f"{max(gpus, 1)} device")
        check.guarded("4 device_map=cpu wiring", device_map_row, check, "cpu")
    if "tp" in groups:
        check.guarded("4 tensor parallel", tensor_parallel_row, check)
    if "5" in groups:
        check.guarded("5 head training", training_rows, check)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    parser.add_argument("--quick", action="store_true", help="smaller sizes and fewer repeats (the test, CI)")
    parser.add_argument("--out", help="also write the table as JSON to this file")
    parser.add_argument("--rows", default=",".join(ROW_GROUPS), type=row_groups,
                        help=f"the rows to run, a comma list of {', '.join(ROW_GROUPS)} (default: all; "
                             "tp: the tensor-parallel row of group 4)")
    parser.add_argument("--tp-worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    try:
        isolated_cache()
        if args.tp_worker:
            return tp_worker(args)
        device = resolve(args.device)
        check = Check(device, args.quick)
        began = time.perf_counter()
        print(f"gpu_check on {environment(device)}{' (quick)' if args.quick else ''}", flush=True)
        if device.type == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = False  # float32 losslessness is checked against float32 math
            torch.backends.cudnn.allow_tf32 = False
        run_rows(check, args.rows)
        wall = time.perf_counter() - began
        print_table(check.rows, wall)
        if args.out:
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            Path(args.out).write_text(json.dumps({"environment": environment(device), "quick": args.quick,
                                                  "wall_s": wall, "rows": [asdict(row) for row in check.rows]},
                                                 indent=1))
        return 1 if any(row.status == "FAIL" for row in check.rows) else 0
    finally:
        for cache in MADE_CACHES:
            shutil.rmtree(cache, ignore_errors=True)


def print_table(rows: list[Row], wall: float) -> None:
    width = max(len(row.name) for row in rows)
    print(f"\n{'check':<{width}}  result  seconds  detail")
    print(f"{'-' * width}  ------  -------  ------")
    for row in rows:
        print(f"{row.name:<{width}}  {row.status:<6}  {row.seconds:7.1f}  {row.detail}")
    counts = {status: sum(row.status == status for row in rows) for status in ("PASS", "FAIL", "SKIP")}
    print(f"\n{counts['PASS']} PASS, {counts['FAIL']} FAIL, {counts['SKIP']} SKIP in {wall:.0f} s", flush=True)


if __name__ == "__main__":
    sys.exit(_interrupts.run(reporting_user_errors("gpu_check", main)))
