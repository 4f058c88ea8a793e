"""How many threads torch runs a benchmark with, and what the machine looked like when it started."""

from __future__ import annotations

import logging

from specbench.measure.machine import TimingCheck, is_contended, other_load, safe_threads, usable_cores
from specbench.settings import RunSettings

log = logging.getLogger(__name__)


def choose_threads(settings: RunSettings, earlier: dict | None, processes: int = 1) -> tuple[int, TimingCheck]:
    """torch's thread count for this run and what the machine looked like at start. ``run.threads: null`` takes
    the count an earlier session of this run directory used (so the run resumes on equal terms), else one per
    usable core that other processes leave free (``specbench.measure.machine.safe_threads``). The ``processes`` of one
    tensor-parallel run on one machine split its cores between them."""
    cores = usable_cores()
    if processes > 1:
        # The other ranks are this run, not other load; CPU tensor parallelism is for checking, not timing.
        share = max(1, int(cores // processes))
        threads = settings.threads if settings.threads is not None else share
        return threads, TimingCheck(threads=threads, usable_cores=share, other_load_at_start=0.0)
    other = other_load()
    if settings.threads is not None:
        threads = settings.threads
    else:
        threads = earlier["threads"] if earlier and isinstance(earlier.get("threads"), int) else safe_threads(cores, other)
        if threads > cores:  # the earlier session ran on a machine with more cores; run.json pins the count
            log.warning("this run began with %d threads and resumes with them, but this machine has %g usable "
                        "core(s): threads will share cores and its timings will be flagged; resume it on a machine "
                        "like the first", threads, cores)
        elif other and threads > safe_threads(cores, other):
            log.warning("other processes keep %.1f of %g cores busy; this run resumes with the %d threads it began "
                        "with, so its timings will be flagged", other, cores, threads)
    if is_contended(other, threads, cores):
        fewer = safe_threads(cores, other)
        log.warning("other processes keep %.1f of %g cores busy and this run uses %d thread(s): its timings will be "
                    "flagged as untrustworthy (quiet the machine%s)", other, cores, threads,
                    f", or set run.threads={fewer}" if fewer < threads else "")
    return threads, TimingCheck(threads=threads, usable_cores=cores, other_load_at_start=other)
