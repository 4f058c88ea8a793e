"""The rows of the GPU check (scripts/gpu_check.py, docs/gpu.md): each a library function that checks specbench on
the machine at hand and returns PASS/FAIL/SKIP rows; the script parses its arguments, calls ``run_rows`` and prints
the table.

Rows: (1) float32 losslessness of every drafter config on tiny-random against transformers' greedy generate();
(2) float16 / bfloat16 runs of every drafter against the AR decode of the same model, differences classified by
``specbench.measure.mismatch`` (near-tie or violation); (3) a 7B-shaped random Llama in float16 built on the
device: memory after load, after a 2,000-token prefill and after an 80-node verify, verify latency for q=1..80 at
a 1k context, device round trips per step, draft/verify/overhead shares of PLD and Token Recycling's 80-node tree,
the loop's verify against the pass inside it (the measurements: ``specbench.measure.passes``); (4) accelerate's
device_map and transformers' tensor parallelism (``torchrun``) against one device; (5) each kind of trained head
trained on the device against the same training on the host (``specbench.training.device_check``), and one whole
build; (6) the compiled regime beside the eager one on the 7B shape (``specbench.compiled_check``: CUDA graphs per
bucket, tokens, the verify curve and the floor, synchronisations, step-time spread). On a CPU the 7B shape is
replaced by a small one. Every row is guarded: an exception is a FAIL with its
first line and the next row runs.

Rows 1-2 compose the drafter configs with Hydra; the rest need neither Hydra nor OmegaConf (a bare GPU machine
without scripts/gpu_bundle.sh's wheels): tiny-random's config is read with PyYAML (``specbench.testing``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from specbench import testing
from specbench.measure.passes import (
    PassTimes,
    TorchSyncs,
    device_memory_gib,
    loop_verify_ratio,
    own_pass_seconds,
    pass_bound,
    ratio_verdict,
    round_trip_verdict,
    step_shares,
)

BIG_SHAPE = dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
                 num_key_value_heads=32, vocab_size=32000)  # Llama-2-7B / Vicuna-7B
SMALL_SHAPE = dict(hidden_size=256, intermediate_size=688, num_hidden_layers=4, num_attention_heads=4,
                   num_key_value_heads=4, vocab_size=32000)  # the CPU's stand-in
LATENCY_SIZES = [1, 2, 4, 8, 16, 32, 48, 64, 80]
ROW_GROUPS = ("1", "2", "3", "4", "tp", "5", "6")
# HD's auto model database, kept small: a check, not a study
MODEL_DB_BUILD = testing.small_model_db(max_prompts=8, max_new_tokens=64)


@dataclass
class Row:
    name: str
    status: str  # PASS, FAIL, SKIP
    detail: str
    seconds: float = 0.0
    data: dict = field(default_factory=dict)  # measurements a later step reads from --out (row 6's curves)


def first_line(error: BaseException) -> str:
    """An exception as a row's detail: its type and the first line of its message."""
    return f"{type(error).__name__}: {(str(error).strip().splitlines() or [''])[0][:160]}"


@dataclass
class Check:
    """One run of the check: the device, ``quick`` (smaller sizes, fewer repeats), the rows so far, and the
    script torchrun starts for the tensor-parallel row (``worker``: scripts/gpu_check.py, run with --tp-worker)."""

    device: torch.device
    quick: bool
    worker: Path | None = None
    rows: list[Row] = field(default_factory=list)

    def __post_init__(self):
        self.cuda = self.device.type == "cuda"

    def guarded(self, name: str, function, *args) -> None:
        """Run one row (or a group: ``function`` may return a list of rows); an exception is a FAIL row."""
        began = time.perf_counter()
        try:
            result = function(*args)
        except Exception as error:  # noqa: BLE001 - every row reports, none stops the check
            result = [Row(name, "FAIL", first_line(error))]
        rows = result if isinstance(result, list) else [Row(name, *result)]
        elapsed = time.perf_counter() - began
        for row in rows:
            row.seconds = row.seconds or elapsed / len(rows)
            self.rows.append(row)
            print(f"  {row.status:4}  {row.name}: {row.detail}", flush=True)

    def skip(self, name: str, reason: str) -> None:
        self.rows.append(Row(name, "SKIP", reason))
        print(f"  SKIP  {name}: {reason}", flush=True)


def run_rows(check: Check, groups: list[str]) -> None:
    """The rows of ``groups`` (ROW_GROUPS), in the table's order, appended to ``check.rows`` and printed as they
    finish."""
    if "1" in groups:
        check.guarded("1 lossless float32", lossless_rows, check)
    if "2" in groups:
        for dtype in ["float16", "bfloat16"] if check.cuda else ["bfloat16"]:
            check.guarded(f"2 {dtype} vs AR (mismatch classes)", half_precision_row, check, dtype)
        if not check.cuda:
            check.skip("2 float16 vs AR (mismatch classes)", "CPU: float16 matmuls are slow there")
    if "3" in groups:
        check.guarded("3 7B-shaped model", big_model_rows, check)
    if "4" in groups:
        gpus = torch.cuda.device_count() if check.cuda else 0
        if gpus >= 2:
            check.guarded("4 device_map=auto", device_map_row, check, "auto")
        else:
            check.skip("4 device_map=auto over GPUs", f"{max(gpus, 1)} device")
        check.guarded("4 device_map=cpu wiring", device_map_row, check, "cpu")
    if "tp" in groups:
        check.guarded("4 tensor parallel", tensor_parallel_row, check)
    if "5" in groups:
        check.guarded("5 head training", training_rows, check)
    if "6" in groups:
        from specbench.compiled_check import compiled_rows

        check.guarded("6 compiled regime", compiled_rows, check)


# ---- shared pieces ---------------------------------------------------------------------------------------


def drafter_names() -> list[str]:
    """The drafter configs, which rows 1-2 compose with hydra: without it those rows fail at once with this
    reason (the other rows need no config and still run)."""
    try:
        from specbench.config import group_options
    except ImportError as error:
        raise RuntimeError(f"composing the drafter configs needs hydra-core and omegaconf ({error}); install the "
                           "wheels of scripts/gpu_bundle.sh (docs/gpu.md)") from None
    return group_options("drafter")


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


def make_pld():
    from specbench.drafters.pld import PromptLookup

    return PromptLookup(max_ngram_size=3, min_ngram_size=1, num_draft_tokens=10, prefer="earliest",
                        full_continuation=True, no_match_token=100)


def make_recycling(model):
    from specbench.drafters.recycling import TokenRecycling

    drafter = TokenRecycling(template="2.2.2", top_k=8, hot_start=True, learn_from_prompt=False, update_on_eos=False)
    drafter.prepare(model)
    return drafter


def random_prompt(length: int, seed: int, vocab: int = 256) -> list[int]:
    return np.random.default_rng(seed).integers(3, vocab, size=length).tolist()


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
            row = Row(f"1 lossless float32 {name}", "FAIL", first_line(error))
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


def half_precision_row(check: Check, dtype: str) -> tuple[str, str]:
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
            mismatch = diagnose([generation.token_ids], [baseline.token_ids],
                                [(generation.top_ids, generation.top_logits)],
                                [(baseline.top_ids, baseline.top_logits)], tolerance, exact=True)
            kind = "identical" if mismatch is None else mismatch.kind
            counts[kind] = counts.get(kind, 0) + 1
            if kind == "violation":
                violations.append(f"{name}@{mismatch.index}")
    detail = (f"{sum(counts.values())} decodes x {new_tokens} tokens vs AR: {counts['identical']} identical, "
              f"{counts['near_tie']} near-tie, {counts['violation']} violation (tolerance {tolerance})")
    if violations:
        detail += ": " + ", ".join(violations[:6])
    return ("FAIL" if violations else "PASS"), detail


# ---- row 3: a 7B-shaped model ------------------------------------------------------------------------------


def build_big(check: Check):
    """A random Llama of the 7B shape built directly on the device in float16 (the CPU: a small shape in float32),
    wrapped as every loader wraps its model; and its label in the rows."""
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


def big_model_rows(check: Check) -> list[Row]:
    """Row 3 on the 7B-shaped model: memory, the verify latency curve, round trips per step, step shares and the
    loop's verify against its own pass, each a row of its own."""
    if check.cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(check.device)
    began = time.perf_counter()
    model, label = build_big(check)
    rows = [Row(f"3 {label} memory GiB (allocated/peak)", *memory_verdict(check, model), time.perf_counter() - began)]
    for name, measure in (("3 verify latency ms at {context} ctx", latency_verdict),
                          ("3 round trips per greedy step (want 1 sync, 1 read)", round_trip_row),
                          ("3 step shares", step_share_verdict),
                          ("3 loop verify vs its own pass (want <= 1.5x)", loop_verify_verdict)):
        began = time.perf_counter()
        try:  # each its own FAIL: the rows measured before are kept whatever happens here
            status, detail = measure(check, model)
        except Exception as error:  # noqa: BLE001
            status, detail = "FAIL", first_line(error)
        context = 1000 if not check.quick else 250
        rows.append(Row(name.format(context=context), status, detail, time.perf_counter() - began))
    del model
    if check.cuda:
        torch.cuda.empty_cache()
    return rows


def memory_verdict(check: Check, model) -> tuple[str, str]:
    """Memory allocated and peak after load, after a 2,000-token prefill (500 quick) and after an 80-node verify
    (CUDA only: n/a elsewhere); FAIL when the target does not end empty."""
    from specbench.decoding.contract import Draft
    from specbench.decoding.plan import plan_verification, verification_inputs

    loaded = device_memory_gib(check.device)
    target = model.target
    prefill_length = 2000 if not check.quick else 500
    prompt = np.asarray(random_prompt(prefill_length, 1), dtype=np.int64)
    with torch.inference_mode():
        target.start(prefill_length + 80)
        target.request_hidden_states(())
        if check.cuda:
            torch.cuda.reset_peak_memory_stats(check.device)
        target.prefill(prompt, False, 8)
        prefilled = device_memory_gib(check.device)
        start = target.length
        tokens = np.resize(prompt, 80)
        plan = plan_verification(Draft.chain(torch.as_tensor(tokens[1:])), int(tokens[0]), 80, 80)
        choices = target.verify(verification_inputs(plan, start, 80), plan.n_nodes, 8)
        verified = device_memory_gib(check.device)
        target.truncate(0)
    del choices
    return ("PASS" if target.length == 0 else "FAIL",
            f"load {loaded[0]}/{loaded[1]}, {prefill_length}-token prefill {prefilled[0]}/{prefilled[1]}, "
            f"80-node verify {verified[0]}/{verified[1]}")


def latency_verdict(check: Check, model) -> tuple[str, str]:
    """The verify latency curve at a 1k context (250 quick), ``Decoder.measure_verify_latency``; FAIL when the
    largest size is under half the smallest (a curve that cannot be)."""
    context = 1000 if not check.quick else 250
    sizes = LATENCY_SIZES if not check.quick else [1, 8, 32, 80]
    latency = decoder(model.target).measure_verify_latency(random_prompt(context, 2), sizes,
                                                           repeats=1 if check.quick else 5)
    curve = " ".join(f"{q}:{seconds * 1e3:.1f}" for q, seconds in latency.items())
    return ("PASS" if latency[sizes[-1]] >= 0.5 * latency[sizes[0]] else "FAIL"), f"q={curve}"


def round_trip_row(check: Check, model) -> tuple[str, str]:
    """Device round trips per greedy step of AR and PLD (``count_round_trips``), judged by ``round_trip_verdict``."""
    trips = []
    for name, drafter in (("ar", no_draft()), ("pld", make_pld())):
        per_step = count_round_trips(model.target, drafter, random_prompt(64, 3) * 2, 16, TorchSyncs(check.cuda))
        trips.append((name, per_step[1:-1]))
    return round_trip_verdict(trips)


def count_round_trips(target, drafter, ids, max_new_tokens, torch_syncs: TorchSyncs | None = None) -> list[dict]:
    """Per step of greedy decoding on ``target``: fence synchronisations, blocking reads of the choices and uploads
    (counted by the test kit's CountingTarget around it; the clock fences through it), and with ``torch_syncs``
    on CUDA every synchronisation torch made (``torch_syncs``; None where not counted) and how many the counted
    operations account for (``torch_expected``)."""
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


def step_share_verdict(check: Check, model) -> tuple[str, str]:
    """Draft / verify / overhead shares of PLD and Token Recycling's 80-node tree (``step_shares``); FAIL when
    recycling verified fewer than 80 tokens in a step."""
    shares = []
    new_tokens = 64 if not check.quick else 16
    status = "PASS"
    for name, drafter in (("pld", make_pld()), ("recycling", make_recycling(model))):
        repeated = random_prompt(96, 4) * 3  # repeats give PLD something to match
        generation = decoder(model.target).generate(repeated, drafter, new_tokens)
        share = step_shares(generation.steps[1:])
        shares.append(f"{name} draft {share['draft']:.0%} verify {share['verify']:.0%} overhead "
                      f"{share['overhead']:.0%} ({share['steps']} steps, {share['verify_s'] * 1e3:.1f} ms/verify, "
                      f"max {share['max_tokens']} tokens)")
        if name == "recycling" and share["max_tokens"] < 80:
            shares.append("recycling verified fewer than 80 tokens")
            status = "FAIL"
    return status, "; ".join(shares)


def loop_verify_verdict(check: Check, model) -> tuple[str, str]:
    """The verify_s that the loop records per step against the pass inside it: every report divides by verify_s,
    so it must be the pass's cost, not the pass plus something the loop does around it. Greedy AR and PLD over a
    repeated random prompt; each step's verify_s is set beside that same pass's own time (``PassTimes``,
    ``loop_verify_ratio``), so the host's speed drifting between two measurements cannot move the ratio. The
    first H200 run compared the loop with a pass timed alone afterwards and saw ratios of 2.13x (AR) and 0.48x
    (PLD) in one run: a 7B eager forward at these sizes is bound by the host's kernel launches, whose speed moved
    2-3x within seconds. The lone pass is still reported, and whether the pass is host- or device-bound. Judged on
    a GPU only (``ratio_verdict``); a FAIL prints torch's profile of a short PLD decode."""
    prompt = random_prompt(96, 4) * 3
    new_tokens = 32 if check.quick else 64
    medians, found = {}, []
    for name, drafter in (("ar", no_draft()), ("pld", make_pld())):
        with PassTimes(model.target, check.cuda) as passes:
            generation = decoder(model.target).generate(prompt, drafter, new_tokens)
        steps = generation.steps[1:]
        launch, device = passes.launch_s[1:], passes.device_s[1:]  # [0] is the prefill's
        try:
            medians[name] = loop_verify_ratio([step.verify_s for step in steps], launch, device)
        except ValueError as error:
            raise RuntimeError(f"{name}: {error}") from None
        own = own_pass_seconds(launch, device)
        context = int(np.median([step.context_len for step in steps]))
        alone = decoder(model.target).measure_verify_latency(
            (prompt * 2)[:context], sorted({step.verify_tokens for step in steps}), repeats=2 if check.quick else 5)
        text = (f"{name}: {len(steps)} steps at ~{context} ctx, loop verify "
                f"{np.median([step.verify_s for step in steps]) * 1e3:.1f} ms vs its pass "
                f"{np.median(own) * 1e3:.1f} ms (median ratio {medians[name]:.2f}x); the pass: host queues it in "
                f"{np.median(launch) * 1e3:.1f} ms")
        if device:
            text += f", device span {np.median(device) * 1e3:.1f} ms ({pass_bound(launch, device)})"
        lone = np.median([alone[step.verify_tokens] for step in steps])
        text += f"; the same size alone afterwards {lone * 1e3:.1f} ms"
        found.append(text)
    status = ratio_verdict(medians, judged=check.cuda)
    if status == "FAIL":
        try:
            print_profile(model, prompt)
        except Exception as error:  # noqa: BLE001 - the profile explains a FAIL, it does not replace it
            print(f"  (no profile: {first_line(error)})", flush=True)
    suffix = "" if check.cuda else " (not judged on a CPU: another job's load moves single passes)"
    return status, "; ".join(found) + suffix


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


# ---- row 4: placements ---------------------------------------------------------------------------------------


def decode_all(model, names=("ar", "pld", "recycling"), max_new_tokens=32) -> dict[str, list[list[int]]]:
    """The greedy tokens of AR, PLD and Token Recycling over the test kit's prompts, per drafter."""
    ids = testing.prompt_ids(model)
    found = {}
    for name in names:
        drafter = {"ar": no_draft, "pld": make_pld}.get(name, lambda: make_recycling(model))()
        found[name] = [decoder(model.target).generate(prompt, drafter, max_new_tokens).token_ids for prompt in ids]
    return found


def device_map_row(check: Check, device_map: str) -> tuple[str, str]:
    """tiny-random placed by accelerate (``auto`` over the GPUs, or ``cpu``: the wiring) against one device."""
    device = torch.device("cuda:0" if device_map == "auto" else "cpu")
    single = decode_all(testing.tiny_random(device, linear_backend="aten"))
    placed_model = testing.tiny_random(device, linear_backend="aten", device_map=device_map)
    devices = sorted({str(device) for device in placed_model.devices})
    placed = decode_all(placed_model)
    differ = [name for name in single if single[name] != placed[name]]
    return ("FAIL" if differ else "PASS",
            f"device_map={device_map} over {devices} ({placed_model.placement}): "
            + (f"{differ} differ from one device" if differ else f"{', '.join(single)} tokens == one device"))


def tensor_parallel_launch(check: Check, out: Path) -> tuple[int, str, list[str], dict]:
    """The torchrun command of the tensor-parallel row and its environment: one process per GPU with two or more,
    else 2 CPU processes with CUDA hidden from them (transformers binds each process to the GPU of its LOCAL_RANK
    whenever torch sees one, and a one-GPU machine has no second). Each process runs ``check.worker`` with
    ``--tp-worker`` (``tensor_parallel_worker``)."""
    gpus = torch.cuda.device_count() if check.cuda else 0
    processes, where = (gpus, "cuda") if gpus >= 2 else (2, "cpu")
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(processes),
               str(check.worker), "--tp-worker", "--device", where, "--out", str(out)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if where == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""
    return processes, where, command, env


def tensor_parallel_row(check: Check) -> tuple[str, str]:
    """tiny-random sharded by transformers' tensor parallelism under torchrun against one process."""
    if check.worker is None:
        raise RuntimeError("no worker script to run under torchrun (Check.worker)")
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "tp.json"
        processes, where, command, env = tensor_parallel_launch(check, out)
        done = subprocess.run(command, capture_output=True, text=True, timeout=240, env=env)
        if done.returncode != 0 or not out.exists():
            tail = [line for line in (done.stderr or done.stdout).splitlines() if line.strip()][-1:] or ["no output"]
            return "FAIL", f"torchrun x{processes} exited {done.returncode}: {tail[0][:160]}"
        sharded = json.loads(out.read_text())
    one_process = torch.device("cuda:0" if where == "cuda" else "cpu")
    single = decode_all(testing.tiny_random(one_process, linear_backend="aten"))
    differ = [name for name in single if single[name] != sharded["tokens"][name]]
    label = f"tp_plan=auto, torchrun x{processes} ({where}{', gloo' if where == 'cpu' else ', nccl'})"
    return ("FAIL" if differ else "PASS",
            f"{label}: " + (f"{differ} differ from one process" if differ else
                            f"{', '.join(single)} tokens == one process"))


def tensor_parallel_worker(device: str, out: str) -> int:
    """One process of the tensor-parallel row (under torchrun): rank 0 writes the tokens to ``out``."""
    from specbench.models.placement import rank

    where = torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}") if device == "cuda" else torch.device("cpu")
    if where.type == "cuda":
        torch.cuda.set_device(where)
    model = testing.tiny_random(where, linear_backend="aten", tp_plan="auto")
    tokens = decode_all(model)
    if rank() == 0:
        Path(out).write_text(json.dumps({"tokens": tokens, "placement": model.placement}))
    if torch.distributed.is_initialized():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()
    return 0


# ---- row 5: head training on the device -----------------------------------------------------------------------


def training_rows(check: Check) -> list[Row]:
    """Row 5: each kind's head trained on the device and on the host from the same start and the same data (the
    device target's features), judged by ``training.device_check.training_verdict`` (on a CPU both runs are the
    host's: the row checks the path still runs); then one whole build (``build_trained_head``) for a bfloat16
    target on the device."""
    from specbench.training import methods
    from specbench.training.device_check import (
        TRAINING_KINDS,
        train_on,
        training_conversations,
        training_recipe,
        training_verdict,
    )
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
                rows.append(Row(label, "FAIL", first_line(error)))
            rows[-1].seconds = time.perf_counter() - began
        began = time.perf_counter()
        label = f"5 build of an eagle3 head for a bfloat16 target on {check.device.type}"
        try:
            rows.append(Row(label, *half_precision_build(check, Path(scratch))))
        except Exception as error:  # noqa: BLE001
            rows.append(Row(label, "FAIL", first_line(error)))
        rows[-1].seconds = time.perf_counter() - began
    return rows


# The prompts of the whole build: few and short, answered by the bfloat16 target itself at BUILD_ANSWER_TOKENS.
BUILD_PROMPTS = [f"Question {index}: what comes after {index}?" for index in range(8)]
BUILD_ANSWER_TOKENS = 24


def half_precision_build(check: Check, scratch: Path) -> tuple[str, str]:
    """One whole build by ``build_trained_head`` (the target's answers generated, the draft vocabulary counted, the
    head placed, trained, measured, published, its manifest) of an eagle3 head for tiny-random in bfloat16 on the
    device, over a prompt file of its own (BUILD_PROMPTS; the answers are cached in the check's throw-away cache):
    the features come from a half-precision target, the head trains in float32 beside it. Judged by
    ``training.device_check.build_verdict``."""
    from specbench.artefacts.trained_head import build_trained_head, load_trained_head
    from specbench.training.device_check import TRAINING_KINDS, TRAINING_STEPS, build_verdict

    model = testing.tiny_random(check.device, "bfloat16")
    prompts = scratch / "build-prompts.txt"
    prompts.write_text("\n".join(BUILD_PROMPTS) + "\n")
    directory = scratch / "eagle3-bfloat16"
    manifest = build_trained_head(model, directory, "eagle3", train_steps=TRAINING_STEPS, batch_sequences=2,
                                  held_out=2, warmup_steps=1, prompts=str(prompts),
                                  max_new_tokens=BUILD_ANSWER_TOKENS, **TRAINING_KINDS["eagle3"])
    load_trained_head(model, directory, "eagle3", "a check: nothing to rebuild")
    return build_verdict(manifest, check.device)
