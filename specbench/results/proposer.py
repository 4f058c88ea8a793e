"""What a proposer drafting inside a serving engine's steps did (engine=vllm-custom's, ``engines.vllm_proposer``):
cumulative counters in a small file the engine's worker writes and the run's process reads, and the difference of
two readings as a load level records it (load.jsonl's ``proposer``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

# ProposerCounters' fields, in the order the file holds them (float64 each).
COUNTER_FIELDS = ("calls", "requests", "proposed_tokens", "draft_s", "max_call_s", "forks_started", "rebuilt",
                  "dropped", "live_forks")


class ProposerCounters:
    """Cumulative counters of the proposer's calls in a small file of float64s (``COUNTER_FIELDS``), written by the
    worker in place (a memory map: no system call per step) and read by the run's process at any time."""

    def __init__(self, path: str | Path, create: bool = False):
        self.path = Path(path)
        if create:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            np.zeros(len(COUNTER_FIELDS), dtype=np.float64).tofile(self.path)
        self._values = np.memmap(self.path, dtype=np.float64, mode="r+", shape=(len(COUNTER_FIELDS),))

    def add(self, **amounts: float) -> None:
        for key, amount in amounts.items():
            self._values[COUNTER_FIELDS.index(key)] += amount

    def set(self, **values: float) -> None:
        for key, value in values.items():
            self._values[COUNTER_FIELDS.index(key)] = value

    def read(self) -> dict[str, float]:
        return dict(zip(COUNTER_FIELDS, np.array(self._values).tolist()))

    @staticmethod
    def between(before: dict, after: dict) -> dict:
        """What the proposer did between two readings, as a load level records it: its calls (vLLM steps that asked
        it), the requests it drafted for, the tokens it proposed, its seconds in all and per call, its longest call."""
        calls = after["calls"] - before["calls"]
        seconds = after["draft_s"] - before["draft_s"]
        return {"calls": int(calls), "requests": int(after["requests"] - before["requests"]),
                "proposed_tokens": int(after["proposed_tokens"] - before["proposed_tokens"]),
                "draft_s": seconds, "draft_ms_per_call": 1000 * seconds / calls if calls else None,
                "requests_per_call": (after["requests"] - before["requests"]) / calls if calls else None,
                "forks_started": int(after["forks_started"] - before["forks_started"]),
                "rebuilt": int(after["rebuilt"] - before["rebuilt"])}
