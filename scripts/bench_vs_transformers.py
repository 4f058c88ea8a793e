"""Side-by-side speed of specbench's loop and transformers' ``generate()`` on the same model and questions.

For every question, in one process and back to back (order rotated per question so drift hits all alike):
  transformers greedy  generate(do_sample=False)
  specbench ar         the decoding loop with no drafter
  transformers PLD     generate(prompt_lookup_num_tokens=N, max_matching_ngram_size=M)
  specbench pld        the decoding loop with the PLD drafter, same N and M
All four must produce the same tokens (greedy decoding is deterministic) when both sides run on the same
model object (--hf-linear-backend same); with different kernels a near-tie may legitimately resolve
differently, so then only each side's PLD is checked against its own greedy output.
Prints tokens/s per task and the ratios ours/theirs (Spec-Bench style: per-question tokens/s, averaged),
the share of each step spent outside the target's forward pass, and the target's verify-latency curve.

    python scripts/bench_vs_transformers.py --limit-per-task 2 --max-new-tokens 128
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict

from specbench.reporting import reporting_user_errors  # standard library only
from specbench.interrupts import Interrupts

# Ctrl-C is one line and exit status 130 from here on, during the imports below (seconds) too.
_interrupts = Interrupts("bench_vs_transformers: interrupted before it started",
                         "bench_vs_transformers: interrupted; it saves nothing: re-running the same command starts "
                         "again")
if __name__ == "__main__":
    _interrupts.arm()

import numpy as np  # noqa: E402  (after the interrupt handler, on purpose)
import torch  # noqa: E402
from hydra.utils import instantiate  # noqa: E402

from specbench.config import compose  # noqa: E402
from specbench.questions import TASKS, read_questions, select_questions  # noqa: E402
from specbench.decoding.loop import Decoder  # noqa: E402
from specbench.drafters.ar import NoDraft  # noqa: E402
from specbench.drafters.pld import PromptLookup  # noqa: E402
from specbench.engines.calibration import calibrate  # noqa: E402
from specbench.settings import RunSettings  # noqa: E402

METHODS = ("hf-greedy", "ours-ar", "hf-pld", "ours-pld")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m", help="a config in conf/model/")
    parser.add_argument("--questions", default=None, help="Spec-Bench question.jsonl (default: built-in sample set)")
    parser.add_argument("--limit-per-task", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--num-draft-tokens", type=int, default=10, help="PLD draft length (both sides)")
    parser.add_argument("--max-ngram", type=int, default=3, help="PLD longest matched n-gram (both sides)")
    parser.add_argument("--verify-padding", choices=("auto", "off"), default="auto", help="run.verify_padding")
    parser.add_argument("--draft-budget", choices=("auto", "off"), default="auto",
                        help="run.draft_budget for specbench's PLD (off: verify every draft token, as transformers does)")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--linear-backend", choices=("auto", "aten", "onednn"), default="auto",
                        help="kernels of specbench's model (run.linear_backend)")
    parser.add_argument("--hf-linear-backend", choices=("same", "aten", "onednn"), default="same",
                        help="kernels of the model transformers runs on: 'same' shares specbench's model object "
                             "(compares the loops alone); 'aten' loads a second copy with PyTorch's default "
                             "kernels (transformers as users run it)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    cfg = compose([f"model={args.model}", f"run.verify_padding={args.verify_padding}",
                   f"run.draft_budget={args.draft_budget}", f"run.max_draft_tokens={args.num_draft_tokens}"])
    target = instantiate(cfg.model, device=cfg.run.device, linear_backend=args.linear_backend)
    model = target.weights.module  # transformers' own generate runs on the same module
    hf_model = model
    if args.hf_linear_backend != "same":
        hf_model = instantiate(cfg.model, device=cfg.run.device, linear_backend=args.hf_linear_backend).weights.module
    eos = sorted(target.eos_token_ids)
    questions = select_questions(read_questions(args.questions), list(TASKS), args.limit_per_task)
    decoder = Decoder(target.target, target.eos_token_ids, max_draft_tokens=cfg.run.max_draft_tokens)
    pld = PromptLookup(max_ngram_size=args.max_ngram, num_draft_tokens=args.num_draft_tokens)
    ar = NoDraft()

    def hf_generate(ids, **extra):
        input_ids = torch.tensor([ids], device=target.weights.input_device)
        output = hf_model.generate(input_ids, attention_mask=torch.ones_like(input_ids), do_sample=False,
                                max_new_tokens=args.max_new_tokens, eos_token_id=eos, pad_token_id=eos[0], **extra)
        return output[0, len(ids):].tolist()

    def run(method, ids):
        began = time.perf_counter()
        if method == "hf-greedy":
            return hf_generate(ids), time.perf_counter() - began, None
        if method == "hf-pld":
            tokens = hf_generate(ids, prompt_lookup_num_tokens=args.num_draft_tokens,
                                 max_matching_ngram_size=args.max_ngram)
            return tokens, time.perf_counter() - began, None
        generation = decoder.generate(ids, ar if method == "ours-ar" else pld, args.max_new_tokens)
        return generation.token_ids, generation.wall_s, generation.steps

    first_prompt = target.encode_conversation([questions[0].turns[0]], [])
    for method in METHODS:  # warm-up, untimed
        run(method, first_prompt[: min(len(first_prompt), 256)])
    latencies, policy = calibrate(RunSettings.from_config(cfg.run), target, decoder, first_prompt)
    if latencies:
        decoder.use_policy(policy)
        print("verify latency (ms) by tokens verified:",
              ", ".join(f"{size}:{seconds * 1e3:.1f}" for size, seconds in latencies.items()))
        print("padding:", {s: decoder.verify_shapes.padded(s) for s in latencies if decoder.verify_shapes.padded(s) != s})

    speeds = defaultdict(lambda: defaultdict(list))  # task -> method -> tokens/s per question
    outside_forward = defaultdict(lambda: [0.0, 0.0])  # method -> [seconds outside forwards, step seconds]
    mismatches = []
    for index, prompt in enumerate(questions):
        ids = target.encode_conversation([prompt.turns[0]], [])
        order = METHODS[index % len(METHODS):] + METHODS[: index % len(METHODS)]
        outputs = {}
        for method in order:
            tokens, seconds, steps = run(method, ids)
            outputs[method] = tokens
            speeds[prompt.task][method].append(len(tokens) / seconds)
            speeds["overall"][method].append(len(tokens) / seconds)
            if steps:
                for step in steps[1:]:
                    outside_forward[method][0] += step.draft_s + step.overhead_s
                    outside_forward[method][1] += step.draft_s + step.verify_s + step.overhead_s
        if outputs["ours-pld"] != outputs["ours-ar"] or outputs["hf-pld"] != outputs["hf-greedy"] or (
                args.hf_linear_backend == "same" and outputs["ours-ar"] != outputs["hf-greedy"]):
            mismatches.append(prompt.question_id)
        print(f"q{prompt.question_id} ({prompt.task}): " + ", ".join(
            f"{m} {speeds[prompt.task][m][-1]:.1f} tok/s" for m in METHODS), flush=True)

    print()
    print(f"{'task':16}{'hf greedy':>10}{'ours ar':>10}{'ar ratio':>10}{'hf pld':>10}{'ours pld':>10}{'pld ratio':>10}")
    for task, by_method in speeds.items():
        mean = {m: float(np.mean(by_method[m])) for m in METHODS}
        print(f"{task:16}{mean['hf-greedy']:10.2f}{mean['ours-ar']:10.2f}{mean['ours-ar'] / mean['hf-greedy']:9.3f}x"
              f"{mean['hf-pld']:10.2f}{mean['ours-pld']:10.2f}{mean['ours-pld'] / mean['hf-pld']:9.3f}x")
    for method, (outside, total) in outside_forward.items():
        print(f"{method}: time outside the target's forward pass = {100 * outside / total:.2f}% of step time")
    print(f"linear kernels: specbench {args.linear_backend}, transformers {args.hf_linear_backend}")
    print("outputs identical (each PLD to its greedy" + (", and across tools" if args.hf_linear_backend == "same" else "")
          + "):", "yes" if not mismatches else f"NO, questions {mismatches}")


if __name__ == "__main__":
    _interrupts.run(reporting_user_errors("bench_vs_transformers", main))
