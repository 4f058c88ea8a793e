"""What a drafter that carries state across questions (Token Recycling's matrix, SAM-Decoding's and Suffix
Decoding's trees) had learned when an interrupted session of its run stopped: saved in the run directory after
every question (``RunDirectory.save_drafter_state``) and given back on resuming, so that the resumed questions
decode as an uninterrupted run's would."""

from __future__ import annotations

import logging

from specbench.decoding.contract import Drafter
from specbench.distributed import Processes
from specbench.errors import SpecbenchError, damage_reason
from specbench.results.run_directory import RunDirectory

log = logging.getLogger(__name__)


def saved_drafter_state(drafter: Drafter, run_dir: RunDirectory, finished: set, processes: Processes):
    """(state, ids of the questions it has seen) that an interrupted session of this run saved, when resuming a
    drafter that carries state across questions; None otherwise (then a missing save is warned about)."""
    if not finished or drafter.state() is None:
        return None
    saved = processes.share(run_dir.drafter_state())
    if saved is None:
        log.warning("%s: no saved drafter state; %s starts the resumed questions from its warm-up alone, so they "
                    "may differ from an uninterrupted run's", run_dir.path, drafter.name)
    return saved


def restore_drafter_state(drafter: Drafter, run_dir: RunDirectory, finished: set, saved) -> None:
    """On resuming, give a drafter that carries state across questions the state it had after the finished
    ones (which the interrupted run's warm-up also taught, before its first question)."""
    if saved is None:
        return
    state, seen = saved
    try:
        drafter.restore(state)
    except Exception as error:  # the drafter's own refusal, or arrays missing or misshapen in a file numpy read
        reason = str(error) if isinstance(error, SpecbenchError) else f"{type(error).__name__}: {damage_reason(error)}"
        raise SpecbenchError(f"{run_dir.drafter_state_file} is damaged ({reason}); remove it to start the drafter's "
                             "state afresh") from None
    if seen != {str(question) for question in finished}:
        log.warning("%s: the saved drafter state has seen %d of the %d finished questions (the run was stopped "
                    "while saving); the resumed questions may differ slightly from an uninterrupted run's",
                    run_dir.path, len(seen & {str(q) for q in finished}), len(finished))


def save_drafter_state(drafter: Drafter, run_dir: RunDirectory) -> None:
    """After a recorded question: the drafter's state, for a drafter that carries one."""
    state = drafter.state()
    if state is not None:
        run_dir.save_drafter_state(state)
