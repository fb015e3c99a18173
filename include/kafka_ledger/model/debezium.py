"""Debezium's change events: which field of an event a column's path names, and what each `op` means."""

from __future__ import annotations

# The fields of a change event's envelope (Debezium's `Envelope.FieldName`): a column path that starts with one of
# them reads the event itself (`op`, `source.lsn`); any other path reads the row image (`after`).
EVENT_FIELDS = frozenset({"op", "before", "after", "source", "transaction", "ts_ms", "ts_us", "ts_ns"})
ROW_IMAGE = "after"
OLD_ROW_IMAGE = "before"  # a delete's: its key columns at least (REPLICA IDENTITY DEFAULT), every column when FULL
OP_FIELD = "op"
# op: c (create), r (a snapshot's read) and u (update) upsert the row image; d (delete) deletes the entity.
UPSERT_OPS = ("c", "r", "u")
DELETE_OP = "d"
TRUNCATE_OP = "t"


def event_path(path: tuple[str, ...]) -> tuple[str, ...]:
    """Where a value column's field lives in a change event: the row image's field, unless the path names one of
    the event's own fields."""
    return path if path and path[0] in EVENT_FIELDS else (ROW_IMAGE, *path)


def old_row_path(path: tuple[str, ...]) -> tuple[str, ...]:
    """Where a row-image field lives in the event's old row image (`before`)."""
    return (OLD_ROW_IMAGE, *path)
