"""An Iceberg sink's snapshots as the ledger sees them: the stamp a batch's snapshot carries, and the snapshot found
again by it."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass

from kafka_ledger.model.ranges import OffsetRange
from kafka_ledger.model.refusals import Refusal
from kafka_ledger.sinks.base import Artifact

# The keys of a snapshot's summary that say which batch (and attempt) wrote it, and what it read.
SUMMARY = "kafka-ledger."
BATCH_KEY, ATTEMPT_KEY, PIPELINE_KEY, RANGES_KEY = (f"{SUMMARY}{k}" for k in ("batch-id", "attempt", "pipeline",
                                                                              "ranges"))


class IcebergSinkError(RuntimeError):
    """The Iceberg table cannot take the pipeline's rows (unreachable catalog, conflicting schema); nothing was
    published and no offset moved."""


class IcebergSchemaError(IcebergSinkError, Refusal):
    """The table's columns conflict with the declaration: only changing one of them can make it take the rows."""


@dataclass(frozen=True)
class BatchSnapshot(Artifact):
    """A snapshot in the table's current history that a batch committed, as its summary says."""

    snapshot_id: int
    batch_id: int
    attempt: int

    @property
    def artifact_id(self) -> int:  # type: ignore[override]
        return self.snapshot_id


def stamp(pipeline: str, batch_id: int, attempt: int, ranges: Iterable[OffsetRange]) -> dict[str, str]:
    """The summary properties of a batch's snapshot."""
    return {BATCH_KEY: str(batch_id), ATTEMPT_KEY: str(attempt), PIPELINE_KEY: pipeline,
            RANGES_KEY: json.dumps([[r.topic, r.partition, r.from_offset, r.until_offset] for r in ranges])}
