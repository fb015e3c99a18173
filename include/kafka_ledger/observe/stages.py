"""Where an attempt's time went: the seconds of each stage of its data path, for the task log and the benchmark."""

from __future__ import annotations

import time

# The stages of an attempt in the connect runtime, in order (for an Iceberg sink, `snapshot` instead of the stream's).
# `waiting_for_spark` and `copying` split `stream`: the stream ran while Spark read, decoded and sent rows and
# Postgres copied them, so those overlap; waiting_for_spark is the time COPY had nothing to take, copying the rest
# (Postgres taking rows, the client's handling of them).
STAGES = {
    "begin": "the attempt recorded in the ledger, the ranges checked against retention",
    "session": "the Spark Connect session opened and an earlier attempt's query stopped",
    "to_first_rows": "the query planned and started on the server, until its first rows reached the task",
    "stream": "from the first rows to the last one copied into Postgres",
    "waiting_for_spark": "part of `stream`: COPY waiting for Spark's next rows",
    "copying": "part of `stream`: Postgres taking rows, and the task's handling of them",
    "snapshot": "an Iceberg sink: Spark reading, decoding and writing the batch's rows as one snapshot",
    "commit": "dead letters, coverage and topic-id checks, positions advanced, the transaction committed",
}


def _known(stage: str) -> None:
    if stage not in STAGES:
        raise ValueError(f"unknown stage {stage!r}: one of {', '.join(STAGES)}")


class Stopwatch:
    """Laps of one attempt: `lap(stage)` ends a stage at the time of the call (or `at`), the next starts there."""

    def __init__(self) -> None:
        self.started = self._last = time.monotonic()
        self.stages: dict[str, float] = {}

    def lap(self, stage: str, at: float | None = None) -> None:
        _known(stage)
        now = time.monotonic() if at is None else at
        self.stages[stage] = round(now - self._last, 3)
        self._last = now

    def record(self, stage: str, seconds: float) -> None:
        """A stage inside another one (waiting_for_spark, copying), measured by its owner."""
        _known(stage)
        self.stages[stage] = round(seconds, 3)


def until_first_rows(stages: dict[str, float]) -> float | None:
    """The gap between the attempt's start and its first rows, if it had rows."""
    parts = [stages.get(s) for s in ("begin", "session", "to_first_rows")]
    return None if None in parts else round(sum(parts), 3)  # type: ignore[arg-type]


def describe(stages: dict[str, float]) -> str:
    """One line for the task log: 'begin 0.04 s, session 0.10 s, ...', nested parts in brackets."""
    inner = ("waiting_for_spark", "copying")
    gap = until_first_rows(stages)
    parts = []
    for stage in STAGES:
        if stage in inner or stage not in stages:
            continue
        text = f"{stage.replace('_', ' ')} {stages[stage]:.2f} s"
        if stage == "stream" and all(s in stages for s in inner):
            text += f" (waiting for Spark {stages['waiting_for_spark']:.2f} s, copying {stages['copying']:.2f} s)"
        parts.append(text)
    line = ", ".join(parts)
    return line if gap is None else f"first rows after {gap:.2f} s: {line}"
