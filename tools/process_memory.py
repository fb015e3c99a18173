"""Memory of a benchmark's long-lived processes while its load runs: sampled, and whether it stayed flat."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import psutil

SAMPLE_SECONDS = 5.0
# Flat: the last third's peak at most this much above the first third's (issue 42's item 2).
FLAT_WITHIN = 0.10


def private_bytes(pids: list[int]) -> int:
    """The processes' private memory (USS: what each holds alone, shared libraries and Postgres's shared buffers
    left out, so that many processes of one service are not counted many times over), summed; ended ones count 0."""
    total = 0
    for pid in pids:
        try:
            total += psutil.Process(pid).memory_full_info().uss
        except psutil.Error:
            continue
    return total


def with_children(pid: int) -> list[int]:
    """The process and every process under it (none if it ended)."""
    try:
        process = psutil.Process(pid)
        return [pid] + [child.pid for child in process.children(recursive=True)]
    except psutil.Error:
        return []


def flat_report(samples: list[tuple[float, dict[str, int]]]) -> dict[str, object]:
    """Per process group, its peak in the first and in the last third of the sampled time (MB) and their ratio; flat
    when every group's last third peaks within FLAT_WITHIN of its first third."""
    if len(samples) < 3:
        return {"samples": len(samples), "flat": None}
    start, end = samples[0][0], samples[-1][0]
    third = (end - start) / 3
    first = [s for t, s in samples if t <= start + third]
    last = [s for t, s in samples if t >= end - third]
    groups: dict[str, object] = {}
    flat = True
    for name in sorted({name for _, sample in samples for name in sample}):
        early = max(s.get(name, 0) for s in first)
        late = max(s.get(name, 0) for s in last)
        ratio = round(late / early, 3) if early else None
        flat = flat and ratio is not None and ratio <= 1 + FLAT_WITHIN
        groups[name] = {"first_third_peak_mb": round(early / 2**20), "last_third_peak_mb": round(late / 2**20),
                        "ratio": ratio}
    return {"samples": len(samples), "every_s": round((end - start) / (len(samples) - 1), 1), "groups": groups,
            "flat": flat}


class MemoryWatch:
    """Samples the private memory of named process groups every SAMPLE_SECONDS, from a thread, between `start()` and
    `stop()`; `groups()` is asked again at every sample (a group's processes may come and go: task processes)."""

    def __init__(self, groups: Callable[[], dict[str, list[int]]], every: float = SAMPLE_SECONDS):
        self.groups, self.every = groups, every
        self.samples: list[tuple[float, dict[str, int]]] = []
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="memory-watch", daemon=True)

    def _run(self) -> None:
        while True:
            self.samples.append((time.monotonic(), {name: private_bytes(pids) for name, pids in self.groups().items()}))
            if self._stopped.wait(self.every):
                return

    def start(self) -> MemoryWatch:
        self._thread.start()
        return self

    def stop(self) -> dict[str, object]:
        self._stopped.set()
        self._thread.join()
        return flat_report(self.samples)
