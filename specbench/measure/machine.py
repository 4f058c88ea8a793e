"""Is the machine quiet enough to time on? Cores this process may use, how busy other processes keep them, a
safe default thread count, and the per-question check that flags timings taken on a busy machine.

Why it matters: torch's CPU threads wait for each other at every operator. With one of two cores taken by
another process, two threads decode a small model at a fraction of a token per second (one thread keeps most
of its speed), and paired timing does not hide a collapse of that size. The numbers are kept either way; a run
whose timings are suspect says so in its summary, its printed table and the analysis tables. The summary's verdict
also counts the stalls inside each question, which the load around it does not show (``specbench.measure.stalls``).

Linux only (/proc/stat, sched_getaffinity, cgroups); elsewhere the checks report nothing and never flag.
"""

from __future__ import annotations

import math
import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

from specbench.measure import metrics
from specbench.measure.stalls import NOT_CHECKED, NOT_MEASURED, STALLED, describe, stall_verdict

# Other processes may keep this many cores busy beyond what the run's threads leave free before its timings are
# flagged: a background daemon's blips stay under it, a process spinning on a core does not.
CONTENTION_SLACK_CORES = 0.5
# A question whose AR baseline decoded at under this fraction of the run's median AR speed is flagged: decoding
# speed of one model on one machine varies with answer length by far less. The speed is taken after the prefill
# where the answer records it (``specbench.prefill_s``): a long prompt's prefill is most of a short answer's wall
# time (Spec-Bench's rag question 1022 here: 664 prompt tokens, 1.4 s of its 2.7 s for 21 tokens), which says
# nothing about the machine.
SLOW_BASELINE_FRACTION = 0.5


def cpu_model_and_flags() -> tuple[str | None, str]:
    """The first CPU's model name and flags from /proc/cpuinfo; (None, "") where there is none (not Linux)."""
    found = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            found.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    return found.get("model name") or None, found.get("flags", "")


def usable_cores() -> float:
    """Cores this process may run on: its CPU affinity, capped by a cgroup CPU quota (containers, SLURM)."""
    try:
        cores = float(len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        cores = float(os.cpu_count() or 1)
    quota = _cgroup_quota_cores()
    return min(cores, quota) if quota else cores


def _cgroup_quota_cores() -> float | None:
    """The CPU quota of this process's cgroup in cores (v2 cpu.max, or v1 cfs quota/period); None when unlimited."""
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        quota = int(Path("/sys/fs/cgroup/cpu/cpu.cfs_quota_us").read_text())
        period = int(Path("/sys/fs/cgroup/cpu/cpu.cfs_period_us").read_text())
        return quota / period if quota > 0 and period > 0 else None
    except (OSError, ValueError):
        return None


def _busy_ticks(cpus: set[int]) -> tuple[int, int] | None:
    """(busy, total) clock ticks summed over ``cpus`` from /proc/stat, or None where it cannot be read."""
    try:
        lines = Path("/proc/stat").read_text().splitlines()
    except OSError:
        return None
    busy = total = 0
    for line in lines:
        name, *fields = line.split()
        if not (name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in cpus):
            continue
        ticks = [int(value) for value in fields[:8]]  # user nice system idle iowait irq softirq steal
        idle = ticks[3] + ticks[4]
        total += sum(ticks)
        busy += sum(ticks) - idle
    return (busy, total) if total else None


class ContentionMeter:
    """Measures how many cores *other* processes kept busy between ``start`` and ``stop``: the busy time of this
    process's CPUs minus this process's own CPU time, per second of wall time. Steal time (a hypervisor giving
    the core to another guest) counts as busy, since it slows this process just the same."""

    def __init__(self):
        try:
            self.cpus = set(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            self.cpus = set(range(os.cpu_count() or 1))
        self.tick_s = 1.0 / os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 0.01
        self._start = None

    def start(self) -> None:
        self._start = (time.monotonic(), _busy_ticks(self.cpus), _own_cpu_s())

    def stop(self) -> float | None:
        """Cores kept busy by other processes since ``start`` (0 when none), None when it cannot be measured."""
        if self._start is None or self._start[1] is None:
            return None
        started, (busy0, _), own0 = self._start
        now = _busy_ticks(self.cpus)
        elapsed = time.monotonic() - started
        if now is None or elapsed <= 0:
            return None
        busy_s = (now[0] - busy0) * self.tick_s
        other = (busy_s - (_own_cpu_s() - own0)) / elapsed
        return max(0.0, round(other, 2))

    def sample(self, seconds: float = 0.5) -> float | None:
        """Cores other processes keep busy, measured over ``seconds`` of this process sleeping."""
        self.start()
        time.sleep(seconds)
        return self.stop()


_recent_load: tuple[float, float | None] | None = None  # (monotonic time, cores): one process's runs share it


def other_load(seconds: float = 0.3, reuse_for_s: float = 10.0) -> float | None:
    """``ContentionMeter().sample(seconds)``, reused for ``reuse_for_s`` seconds: scripts and sweeps that start run
    after run in one process measure once rather than sleeping before every run."""
    global _recent_load
    now = time.monotonic()
    if _recent_load is None or now - _recent_load[0] > reuse_for_s:
        _recent_load = (now, ContentionMeter().sample(seconds))
    return _recent_load[1]


def _own_cpu_s() -> float:
    """CPU seconds of this process and of its live descendants: an engine that computes in child processes
    (vLLM's engine core and workers) is this run's own load, not another's."""
    times = os.times()
    return times.user + times.system + sum(_process_cpu_s(pid) for pid in _descendants(os.getpid()))


def _descendants(pid: int) -> list[int]:
    """The live descendants of ``pid`` (Linux /proc; none elsewhere)."""
    found, frontier = [], [pid]
    while frontier:
        parent = frontier.pop()
        for children in Path(f"/proc/{parent}/task").glob("*/children"):
            try:
                pids = [int(child) for child in children.read_text().split()]
            except (OSError, ValueError):
                continue
            found.extend(pids)
            frontier.extend(pids)
    return found


def _process_cpu_s(pid: int) -> float:
    """User and system CPU seconds of process ``pid`` (0 once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def max_threads(cores: float) -> int:
    """The most torch threads ``cores`` usable cores take: more would be flagged by ``is_contended`` on an idle
    machine (its slack included), since the surplus threads make every operator wait for a core."""
    return max(1, math.floor(cores + CONTENTION_SLACK_CORES))


def available_memory_bytes() -> int | None:
    """Memory this process can still allocate: the kernel's MemAvailable, capped by the room left under a cgroup
    v2 memory limit (containers, SLURM); None where neither can be read."""
    room = []
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                room.append(int(line.split()[1]) * 1024)
    except (OSError, ValueError, IndexError):
        pass
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit != "max":
            room.append(int(limit) - int(Path("/sys/fs/cgroup/memory.current").read_text()))
    except (OSError, ValueError):
        pass
    return max(0, min(room)) if room else None


def safe_threads(cores: float, other_busy: float | None) -> int:
    """Threads for torch when the user chose none: one per usable core that other processes leave free (at
    least one). Fewer threads lose a little speed on a quiet machine; more threads than free cores lose most of
    it on a busy one."""
    free = cores - (other_busy or 0.0)
    return max(1, min(int(cores), int(math.floor(free + 0.25))))


def is_contended(other_busy: float | None, threads: int, cores: float) -> bool:
    """Whether other processes took cores that the run's threads needed."""
    return other_busy is not None and threads + other_busy > cores + CONTENTION_SLACK_CORES


@dataclass(frozen=True)
class TimingCheck:
    """What the run knows about its machine: threads used, usable cores, and how busy others kept them at start."""

    threads: int
    usable_cores: float
    other_load_at_start: float | None

    def report(self, answers: list[dict], baseline_answers: list[dict] | None) -> dict:
        """summary.json's ``timing``: trustworthy unless a question ran while other processes took the cores the
        run's threads needed (``specbench.contention`` of its answer record), its AR baseline ran at under half
        the run's median AR speed, or stalled steps lost a material share of its time (``specbench.stalls``:
        ``specbench.measure.stalls``); each such question is named in ``warnings``. ``stalls`` counts the
        questions by that last check: the stalled ones by id, those it could not judge (no per-step times) and
        those recorded before it."""
        warnings = []
        if self.threads > max_threads(self.usable_cores):
            # The run's own threads outnumber the cores: every question is slowed whatever else runs, so the
            # other processes are not to blame (run.threads refuses such counts; a resumed run may bring one).
            warnings.append(f"{self.threads} thread(s) ran on {self.usable_cores:g} usable core(s)")
        elif is_contended(self.other_load_at_start, self.threads, self.usable_cores):
            warnings.append(f"at start other processes kept {self.other_load_at_start:.1f} of {self.usable_cores:g} "
                            f"cores busy with {self.threads} thread(s) in use")
        for record in answers if self.threads <= max_threads(self.usable_cores) else ():
            other = ((record.get("specbench") or {}).get("contention") or {}).get("other_cores")
            if is_contended(other, self.threads, self.usable_cores):
                warnings.append(f"question {record['question_id']}: other processes kept {other:.1f} of "
                                f"{self.usable_cores:g} cores busy")
        warnings += slow_baseline_warnings(baseline_answers or [])
        verdicts = [stall_verdict(record.get("specbench")) for record in answers]
        stalled = [record for record, verdict in zip(answers, verdicts) if verdict == STALLED]
        warnings += [f"question {record['question_id']}: {describe(record['specbench']['stalls'])}"
                     for record in stalled]
        return {"trustworthy": not warnings, "warnings": warnings, "threads": self.threads,
                "usable_cores": self.usable_cores, "other_load": self.other_load_at_start,
                "stalls": {"stalled_questions": [record["question_id"] for record in stalled],
                           "not_measured": verdicts.count(NOT_MEASURED), "not_checked": verdicts.count(NOT_CHECKED)}}


def slow_baseline_warnings(baseline_answers: list[dict]) -> list[str]:
    """Questions whose AR baseline decoded at under SLOW_BASELINE_FRACTION of the run's median AR speed, each
    answer's speed after its prefill (``metrics.answer_decoding_rate``)."""
    rates = {}
    for record in baseline_answers:
        rate = metrics.answer_decoding_rate(record)
        if rate is not None:
            rates[record["question_id"]] = rate
    if len(rates) < 3:  # a median of fewer is no reference
        return []
    median = statistics.median(rates.values())
    return [f"question {question}: AR ran at {rate:.1f} tok/s, under {SLOW_BASELINE_FRACTION:.0%} of the run's "
            f"median {median:.1f}" for question, rate in rates.items() if rate < SLOW_BASELINE_FRACTION * median]

