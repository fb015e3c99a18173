"""What happens to a pipeline's batches, as typed events: planned, an attempt started, a stage timed, read,
committed, failed; and a verify finished. Observers (observer.py) receive them: the log, metrics, traces."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Event:
    """Something that happened to a pipeline."""

    pipeline: str


@dataclass(frozen=True)
class BatchPlanned(Event):
    """A run's batch was recorded (or an unfinished one found to resume), before anything was read.

    `ranges`: one line per partition (its range described); `detail`: what the plan decided in words (the window, the
    batch replayed, the last error of a resumed batch)."""

    batch_id: int
    kind: str
    resumed: bool
    partitions: int
    offsets: int
    backlog_after: int
    ranges: tuple[str, ...] = ()
    detail: str = ""
    seconds: float = 0.0  # the plan's own time: Kafka's offsets asked, the ranges decided and recorded


@dataclass(frozen=True)
class AttemptStarted(Event):
    """An attempt at reading a batch began (only the newest attempt of a batch may publish)."""

    batch_id: int
    attempt: int
    partitions: int
    offsets: int
    removed_staged: int = 0


@dataclass(frozen=True)
class StageTimed(Event):
    """One stage of an attempt's data path took `seconds` (observe/stages.py names the stages)."""

    batch_id: int
    attempt: int
    stage: str
    seconds: float


@dataclass(frozen=True)
class BatchRead(Event):
    """An attempt read its batch: records, dead letters among them, and offsets with no record (gaps)."""

    batch_id: int
    attempt: int
    records: int
    dead_letters: int
    offset_gaps: int
    seconds: float


@dataclass(frozen=True)
class BatchCommitted(Event):
    """A batch's rows, dead letters and offsets were committed in one transaction (or had been already)."""

    batch_id: int
    kind: str
    target: str
    records_written: int
    records_dead_lettered: int
    replaced: int
    positions_advanced: int | None  # None: a rewrite, which moves no position
    seconds: float
    already_committed: bool = False
    attempt: int | None = None
    # The attempt's stages (observe/stages.py), where its runtime measured them, and what it published into.
    stages: dict[str, float] = field(default_factory=dict)
    attempt_seconds: float | None = None
    artifact: str = ""


@dataclass(frozen=True)
class BatchFailed(Event):
    """A batch's Spark work failed for good this run: it stays open, and the next run resumes its ranges."""

    batch_id: int
    error: str


@dataclass(frozen=True)
class VerifyFinished(Event):
    """`kafka-ledger verify` compared the ledger and the output with Kafka."""

    ok: bool
    mode: str
    partitions: int
    records_compared: int
    problems: int
    seconds: float
