"""``python -m specbench.prepare``: build, ahead of time, every cached artefact the runs of a model look up on
first use (model databases and the target answers they are counted from, statistics datastores, suffix automata,
pruned drafts, trained EAGLE, Medusa and Hydra heads), so that the first ``python -m specbench drafter=...`` starts at
once.

    python -m specbench.prepare                               # the embedded model, every drafter that needs one
    python -m specbench.prepare --model smollm2-135m --drafters hd,rest
    python -m specbench.prepare --dry-run                     # the plan only: what, how long, cached or not
    python -m specbench.prepare --drafters hd drafter.statistics_corpus=/data/corpus.txt run.device=cuda
    python -m specbench.prepare --drafters pld,suffix run.regime=compiled   # also the target's compiled passes

With ``run.regime=compiled`` the target's verification passes are compiled too, after the artefacts, for the very
shapes each drafter's run compiles in its warm-up (the task's longest sequence, the buckets up to the largest
draft, the hidden states the drafter asks for), into the compiled regime's cache; the run then reads them.

Each drafter's configuration is composed as ``python -m specbench model=M drafter=D OVERRIDES`` composes it, and
what is built is the drafter's own ``artefacts(target)``, the objects its ``prepare`` loads, so what is built here
is exactly what those runs look up. The plan comes
first; then each build with its progress bar. Builds resume where an interrupted one stopped.

Exit status: 0 done, 2 a user error (one line), 130 interrupted (one line).
"""

from __future__ import annotations

import argparse
import logging
import sys

from specbench.reporting import reporting_user_errors  # standard library only
from specbench.interrupts import Interrupts

USER_ERROR = 2

_interrupts = Interrupts("prepare: interrupted before it started",
                         "prepare: interrupted; what was built is kept, and the build under way resumes from what it "
                         "had done: run the same command again")
if __name__ == "__main__":
    _interrupts.arm()  # before the imports below, which take seconds

from specbench.artefacts.base import PlannedArtefact, duration_text, fetch, plan_entries  # noqa: E402  (after the
# interrupt handler, on purpose)
from specbench.config import check_config, compose, group_options  # noqa: E402
from specbench.errors import SpecbenchError  # noqa: E402

log = logging.getLogger("specbench.prepare")
DEFAULT_MODEL = "smollm2-135m"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m specbench.prepare", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=DEFAULT_MODEL, help="a config in conf/model/ (default: %(default)s)")
    parser.add_argument("--drafters", default=None,
                        help="comma-separated configs of conf/drafter/ (default: every one that needs a built artefact)")
    parser.add_argument("--dry-run", action="store_true", help="print the plan and build nothing")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides as for python -m specbench, e.g. run.device=cuda")
    return parser.parse_args(argv)


def chosen_drafters(spec: str | None) -> tuple[list[str], bool]:
    """The drafter configs to prepare, and whether the user named them (then one that does not apply to the model
    is an error, rather than skipped)."""
    options = group_options("drafter")
    if spec is None:
        return options, False
    names = [name.strip() for name in spec.split(",") if name.strip()]
    unknown = [name for name in names if name not in options]
    if unknown or not names:
        raise SpecbenchError(f"--drafters {spec!r}: {', '.join(unknown) or 'no drafter named'} is not a drafter "
                             f"config; choose among {', '.join(options)}")
    return names, True


def composed(model: str, drafter: str, overrides: list[str]):
    """The configuration ``python -m specbench model=<model> drafter=<drafter> <overrides>`` runs, checked as the
    runner checks it, and its run settings."""
    cfg = compose([f"model={model}", f"drafter={drafter}", *overrides])
    return cfg, check_config(cfg)


def plan_lines(plan: list[tuple[str, PlannedArtefact]]) -> list[str]:
    """The plan as printed: one line per artefact (the drafter needing it first, what, its state, where), then the
    total build time.

    Example: "  hd: the datastore of python-docs for smollm2-135m: to build, about 15 s ...  [~/.cache/...]"."""
    lines = [f"  {drafter}: {planned.what}: {planned.state()}  [{planned.directory}]" for drafter, planned in plan]
    # what a run would build: not cached whole (a damaged copy is rebuilt) and not installable from the package
    pending = [planned for _, planned in plan if planned.needs_build()]
    known = [planned.seconds for planned in pending if planned.seconds is not None]
    total = (f"{len(pending)} to build, {duration_text(sum(known))} in all (an estimate)" if pending else
             "nothing to build")
    if len(known) < len(pending):
        total += f", plus {len(pending) - len(known)} of unknown length"
    return lines + [f"  {total}"]


def unique(plan: list[tuple[str, PlannedArtefact]]) -> list[tuple[str, PlannedArtefact]]:
    """Each artefact once (drafters share answers and datastores), under the first drafter that needs it."""
    seen, kept = set(), []
    for drafter, planned in plan:
        if planned.directory not in seen:
            seen.add(planned.directory)
            kept.append((drafter, planned))
    return kept


def prepare(args: argparse.Namespace) -> int:
    from specbench.run.instantiate import build

    names, named = chosen_drafters(args.drafters)
    configs = {name: composed(args.model, name, args.overrides) for name in names}
    cfg, settings = configs[names[0]]
    target = build(cfg.model, device=settings.device, linear_backend=settings.linear_backend)
    needed, plan, skipped = {}, [], []
    for name in names:
        cfg, settings = configs[name]
        drafter = build(cfg.drafter)
        try:
            artefacts = drafter.artefacts(target)
        except SpecbenchError:
            if named:
                raise
            skipped.append(name)  # a drafter with nothing it can use for this model: its run says so, in one line
            continue
        if artefacts:
            needed[name] = artefacts
            plan += [(name, entry) for entry in plan_entries(artefacts)]
        elif named:
            print(f"prepare: drafter={name} needs nothing built for {target.name}")
    plan = unique(plan)
    print(f"prepare: what the runs of {target.name} look up on first use (estimates for a 2-core CPU):")
    print("\n".join(plan_lines(plan)))
    if skipped:
        print(f"  not prepared, having no draft for {target.name} without settings of your own: {', '.join(skipped)}")
    for name, artefacts in ({} if args.dry_run else needed).items():
        if all(planned.ready() for drafter_name, planned in plan if drafter_name == name):
            continue
        print(f"prepare: building what drafter={name} needs", flush=True)
        # The very objects the drafter's prepare loads in a run: built (and checked by loading) here.
        fetch(dict(enumerate(artefacts)))
    compiled = [name for name in names if configs[name][1].regime == "compiled" and name not in skipped]
    if compiled:
        compile_passes({name: configs[name] for name in compiled}, args.dry_run)
    if args.dry_run:
        return 0
    print(f"prepare: done; every artefact above is in the cache, so python -m specbench model={args.model} "
          "drafter=... starts at once")
    return 0


def compile_passes(configs: dict, dry_run: bool) -> None:
    """Compile the target's passes for each drafter config of ``configs`` (all run.regime=compiled) as its run's
    warm-up would: the engine loaded as the run loads it, the task's questions that fit, the same shapes
    (``SpecbenchLoop.target_shapes``), once per distinct set of shapes."""
    import torch
    from omegaconf import OmegaConf

    from specbench.config import choose_engine
    from specbench.distributed import Processes
    from specbench.engines.base import SkipQuestion
    from specbench.run.selection import TaskSelection
    from specbench.run.threads import choose_threads
    from specbench.targets.compiled import compiled_cache_location

    print(f"prepare: the target's compiled passes (run.regime=compiled) of drafter={','.join(configs)}, each set of "
          "shapes once: the first time about half a minute a shape on 2 CPU cores for the embedded model, seconds "
          f"once cached  [{compiled_cache_location()}]")
    if dry_run:
        return
    done: dict[tuple, str] = {}
    for name, (cfg, settings) in configs.items():
        engine_class, engine_settings = choose_engine(cfg)
        processes = Processes.from_environment(cfg.model.get("tp_plan"), settings.device)
        torch.set_num_threads(choose_threads(settings, None, processes.world_size)[0])  # as the run will
        engine = engine_class.load(engine_settings, cfg.model, cfg.drafter, settings, processes)
        try:
            selection = TaskSelection.of(cfg.task)
            questions = selection.fit(selection.read(), engine.prompt_tokens)  # as the run selects them
            pending = []
            for prompt in questions:
                try:
                    engine.check_fits(prompt)
                    pending.append(prompt)
                except SkipQuestion:  # the run skips it too, and sizes nothing for it
                    pass
            shapes = engine.target_shapes(pending)
            key = (OmegaConf.to_yaml(cfg.model), settings.device, tuple(settings.compile_buckets),
                   settings.compile_mode, torch.get_num_threads(), repr(shapes))
            if key in done:
                print(f"prepare: drafter={name} runs the shapes compiled for drafter={done[key]}")
                continue
            print(f"prepare: compiling the target's passes for drafter={name}", flush=True)
            engine.prepare_target(pending)
            regime = engine.regime()
            seconds, cached = regime["compile_s"], len(regime["from_cache"])
            print(f"prepare: drafter={name}: {len(seconds)} pass shape(s) ready in {duration_text(sum(seconds.values()))}"
                  f" ({cached} read from the cache, {len(seconds) - cached} compiled)")
            done[key] = name
        finally:
            engine.close()


def main(argv: list[str] | None = None) -> None:
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        sys.exit(prepare(args))
    except SpecbenchError as error:
        print(f"prepare: error: {error}", file=sys.stderr)
        sys.exit(USER_ERROR)
    except (HydraException, OmegaConfBaseException) as error:  # a bad override, as python -m specbench reports it
        reason = " ".join(str(error).split())
        print(f"prepare: error: {reason} (overrides apply to every drafter prepared: name those that have the key "
              "with --drafters)", file=sys.stderr)
        sys.exit(USER_ERROR)


if __name__ == "__main__":
    _interrupts.run(reporting_user_errors("prepare", main))
