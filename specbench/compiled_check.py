"""Row 6 of the GPU check (scripts/gpu_check.py --rows 6, docs/gpu.md): the compiled regime on the 7B-shaped model
(``device_check.build_big``; on a CPU its small stand-in), beside the eager target over the same weights.

- capture: every bucket captured as a CUDA graph of the eager kernels (``run.compile_mode=none``), and the first
  buckets with torch.compile inside (``default``; on a CPU this is the compiled regime itself): seconds and the
  memory the graphs took;
- tokens: AR, PLD and Token Recycling's tree decoded compiled against the same drafter decoded eagerly, classified
  by ``specbench.measure.mismatch`` (identical, near-tie, violation; a violation FAILs);
- the verify curve t(q) eager and compiled (``Decoder.measure_verify_latency``, what a run's calibration measures),
  and AR's one-token pass against the weights' read floor (want within 2x on a GPU);
- no synchronisation inside a pass: each captured graph replayed under ``torch.cuda.set_sync_debug_mode("error")``;
- step-time variation: AR decodes alternated between the two targets, the spread of each one's median step time
  over the repeats (want at most 5% compiled on a GPU).

The curves are returned in the rows' ``data`` (gpu_check's --out JSON), which ``python -m analysis project``
reads to put a CPU run's steps through this GPU's curve.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from specbench import device_check as dc

CONTEXT = 1000  # tokens in the cache under the measured passes (250 quick), as row 3
GRAPH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)  # Token Recycling's 80-node tree needs 128
COMPILED_BUCKETS = (1, 2, 4, 8)  # torch.compile inside: a minute or more a shape for a 7B model
CURVE_SIZES = (1, 2, 4, 8, 16, 32, 64, 128)
VARIATION_LIMIT = 0.05
FLOOR_LIMIT = 2.0


def compiled_rows(check) -> list[dc.Row]:
    """Row 6 (see the module's docstring): one Row per finding, each guarded on its own."""
    from specbench.targets.compiled import FIRST_COMPILABLE, compilable_transformers

    if not compilable_transformers():
        import transformers

        return [dc.Row("6 compiled regime", "SKIP", f"transformers {transformers.__version__} is before "
                       f"{'.'.join(map(str, FIRST_COMPILABLE))}, which the compiled regime needs: install the bundle's "
                       "transformers wheel (scripts/gpu_bundle.sh)")]
    if check.cuda:
        torch.cuda.empty_cache()
    model, label = dc.build_big(check)
    context = CONTEXT if not check.quick else 250
    rows, targets = [], {"eager": model.target}
    modes = ({"none": GRAPH_BUCKETS, "default": COMPILED_BUCKETS} if check.cuda else
             {"default": (1, 2, 4) if check.quick else COMPILED_BUCKETS})
    if check.quick and check.cuda:
        modes = {"none": GRAPH_BUCKETS}
    for mode, buckets in modes.items():
        began = time.perf_counter()
        try:
            targets[mode] = captured_target(check, model, mode, buckets, context)
            rows.append(dc.Row(f"6 {label} compiled {mode}: prepare", "PASS", prepare_detail(targets[mode]),
                               time.perf_counter() - began))
        except Exception as error:  # noqa: BLE001 - the other mode and rows still run
            rows.append(dc.Row(f"6 {label} compiled {mode}: prepare", "FAIL", dc.first_line(error),
                               time.perf_counter() - began))
    compiled = {mode: target for mode, target in targets.items() if mode != "eager"}
    for name, measure in (("6 compiled tokens vs eager (AR, PLD, recycling)", tokens_verdict),
                          (f"6 verify ms eager vs compiled at {context} ctx, AR pass vs floor", curve_verdict),
                          ("6 no synchronisation inside a captured pass", sync_verdict),
                          ("6 AR step-time spread over alternated repeats", variation_verdict)):
        began = time.perf_counter()
        if not compiled:
            rows.append(dc.Row(name, "SKIP", "no compiled target was prepared"))
            continue
        try:
            status, detail, data = measure(check, model, targets, context)
        except Exception as error:  # noqa: BLE001
            status, detail, data = "FAIL", dc.first_line(error), {}
        rows.append(dc.Row(name, status, detail, time.perf_counter() - began, data))
    del model, targets, compiled
    if check.cuda:
        torch.cuda.empty_cache()
    return rows


def captured_target(check, model, mode: str, buckets: tuple[int, ...], context: int):
    from specbench.targets.compiled import CompiledTarget

    target = CompiledTarget(model.weights.module, buckets=buckets, mode=mode)
    with torch.inference_mode():
        target.prepare(longest_sequence=context + 3 * 96 + buckets[-1], largest_pass=buckets[-1],
                       hidden_layers=[()])
    return target


def prepare_detail(target) -> str:
    seconds = target.compile_seconds
    slowest = max(seconds, key=seconds.get)
    memory = ("" if target.graph_memory_bytes is None else
              f", the device's allocator holds {target.graph_memory_bytes / 2**30:.1f} GiB after it")
    return (f"{len(seconds)} shapes ({','.join(map(str, target.buckets))} tokens) in {sum(seconds.values()):.0f} s "
            f"(slowest {slowest}: {seconds[slowest]:.0f} s), cache {target.capacity} tokens{memory}")


def tokens_verdict(check, model, targets, context) -> tuple[str, str, dict]:
    """Each compiled target's decodes of AR, PLD and Token Recycling (when its buckets hold the tree) against the
    eager target's decode of the same drafter: a compiled pass may round a near-tie the other way; anything else
    is a violation."""
    from specbench.measure.mismatch import DEFAULT_TOLERANCE, diagnose

    dtype = str(model.dtype).removeprefix("torch.")
    tolerance = DEFAULT_TOLERANCE.get(dtype, DEFAULT_TOLERANCE["float16"])
    prompt = dc.random_prompt(96, 4) * 3  # repeats give PLD something to match
    new_tokens = 32 if check.quick else 64
    found, violations = [], []
    made = {"ar": dc.no_draft, "pld": dc.make_pld, "recycling": lambda: dc.make_recycling(model)}
    for mode, target in targets.items():
        if mode == "eager":
            continue
        largest = target.buckets[-1]
        names = ["ar", "pld"] + (["recycling"] if largest > 80 else [])
        kinds = {"identical": 0, "near_tie": 0, "violation": 0}
        for name in names:
            eager = dc.decoder(model.target).generate(prompt, made[name](), new_tokens)
            compiled = dc.decoder(target, max_draft_tokens=min(96, largest - 1)).generate(prompt, made[name](),
                                                                                        new_tokens)
            mismatch = diagnose([compiled.token_ids], [eager.token_ids], [(compiled.top_ids, compiled.top_logits)],
                                [(eager.top_ids, eager.top_logits)], tolerance, exact=True)
            kind = "identical" if mismatch is None else mismatch.kind
            kinds[kind] += 1
            if kind == "violation":
                violations.append(f"{mode} {name}@{mismatch.index}")
        found.append(f"{mode}: {', '.join(names)}: {kinds['identical']} identical, {kinds['near_tie']} near-tie, "
                     f"{kinds['violation']} violation")
    detail = f"{new_tokens} tokens each (tolerance {tolerance}): " + "; ".join(found)
    if violations:
        detail += ": " + ", ".join(violations)
    return ("FAIL" if violations else "PASS"), detail, {}


def curve_verdict(check, model, targets, context) -> tuple[str, str, dict]:
    """t(q) per target over the same prompt, interleaved repeats; AR's one-token pass against the floor (the
    weights read once at the device's measured bandwidth). FAIL on a GPU when the graphs' one-token pass is over
    FLOOR_LIMIT x the floor or slower than the eager pass."""
    from specbench.measure.floor import bytes_read_per_pass, probe_bandwidth, probe_size

    prompt = dc.random_prompt(context, 2)
    repeats = 2 if check.quick else 5
    curves = {}
    for mode, target in targets.items():
        sizes = [size for size in CURVE_SIZES if mode == "eager" or size <= target.buckets[-1]]
        curves[mode] = dc.decoder(target).measure_verify_latency(prompt, sizes, repeats=repeats)
    weights = model.weights
    output = getattr(weights.output_layer(), "weight", None)
    read = bytes_read_per_pass(weights.parameter_count, weights.dtype.itemsize, weights.input_embeddings(),
                               output if isinstance(output, torch.Tensor) else None)
    floor = read / probe_bandwidth(check.device, probe_size(read))
    sizes = sorted(curves["eager"])
    text = " ".join(f"{q}:" + "/".join(f"{curves[mode][q] * 1e3:.1f}" if q in curves[mode] else "-" for mode in curves)
                    for q in sizes)
    best = min((mode for mode in curves if mode != "eager"), key=lambda mode: curves[mode][1])
    ratio = curves[best][1] / floor
    detail = (f"q: {'/'.join(curves)} ms {text}; floor {floor * 1e3:.2f} ms ({read / 1e9:.2f} GB read); AR pass "
              f"{best} {ratio:.2f}x floor, eager {curves['eager'][1] / floor:.2f}x")
    slower = [f"{mode} q={q}" for mode in curves if mode != "eager" for q in curves[mode]
              if curves[mode][q] > curves["eager"][q] * 1.05]
    if slower:
        detail += f"; slower than eager: {', '.join(slower)}"
    status = "PASS"
    if check.cuda and (ratio > FLOOR_LIMIT or slower):
        status = "FAIL"
    if not check.cuda:
        detail += " (not judged on a CPU)"
    data = {"curves": {mode: {str(q): seconds for q, seconds in curve.items()} for mode, curve in curves.items()},
            "floor_s": floor, "bytes_per_pass": read, "device": str(check.device),
            "device_name": torch.cuda.get_device_name(check.device) if check.cuda else "cpu",
            "dtype": str(model.dtype).removeprefix("torch."), "context": context}
    return status, detail, data


def sync_verdict(check, model, targets, context) -> tuple[str, str, dict]:
    """Every captured graph replayed with torch's sync debug mode set to raise: a pass that waited for the host
    (an .item(), a copy to the host) inside it would raise here."""
    if not check.cuda:
        return "SKIP", "CPU: no CUDA graphs (inductor's C++ runs as it is called)", {}
    replays = 0
    for mode, target in targets.items():
        for captured in target.captured_passes() if mode != "eager" else ():
            torch.cuda.synchronize(check.device)
            torch.cuda.set_sync_debug_mode("error")
            try:
                captured.replay(*captured.inputs)
            finally:
                torch.cuda.set_sync_debug_mode("default")
            replays += 1
    if not replays:
        return "FAIL", "no captured graph to replay", {}
    return "PASS", f"{replays} graphs replayed with no synchronisation", {}


def variation_verdict(check, model, targets, context) -> tuple[str, str, dict]:
    """AR decodes alternated between the targets, ``repeats`` each: per target the spread (max - min) of the
    repeats' median step times over their median. FAIL on a GPU when a compiled target's is over
    VARIATION_LIMIT."""
    prompt = dc.random_prompt(context, 5)
    repeats = 3 if check.quick else 6
    new_tokens = 32 if check.quick else 64
    medians = {mode: [] for mode in targets}
    for _ in range(repeats):
        for mode, target in targets.items():
            generation = dc.decoder(target, max_draft_tokens=1).generate(prompt, dc.no_draft(), new_tokens)
            steps = generation.steps[1:]
            medians[mode].append(float(np.median([step.verify_s + step.draft_s + step.overhead_s for step in steps])))
    spread = {mode: (max(values) - min(values)) / float(np.median(values)) for mode, values in medians.items()}
    detail = "; ".join(f"{mode} {np.median(values) * 1e3:.2f} ms/step, spread {spread[mode]:.1%}"
                       for mode, values in medians.items())
    detail += f" ({repeats} alternated repeats x {new_tokens} tokens)"
    over = [mode for mode in spread if mode != "eager" and spread[mode] > VARIATION_LIMIT]
    if not check.cuda:
        return "PASS", detail + " (not judged on a CPU)", {}
    return ("FAIL" if over else "PASS"), detail, {}
