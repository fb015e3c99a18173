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

# What Debezium writes in place of a value it does not have: an UPDATE that leaves a TOASTed value (text, jsonb, bytea,
# an array over about 2 KB) unchanged logs no copy of it under REPLICA IDENTITY DEFAULT, and the event's row image holds
# the connector's `unavailable.value.placeholder` instead (its text; a bytea column its UTF-8 bytes; an array a
# one-element array of it). The same goes for the create event of a primary-key change, whose
# OLD_KEY_HEADER names the key it had.
UNAVAILABLE_PLACEHOLDER = "__debezium_unavailable_value"
# The headers of a primary-key change's events: the delete of the old key names the new one, the create of the new
# key names the old one (the key as the connector's header converter writes it: a JSON object of the key's fields).
NEW_KEY_HEADER = "__debezium.newkey"
OLD_KEY_HEADER = "__debezium.oldkey"


def placeholder_bytes(placeholder: str) -> bytes:
    """The placeholder's bytes, as Debezium writes it in a binary column: `hex:` followed by hexadecimal octets, else
    its UTF-8 text."""
    return bytes.fromhex(placeholder[4:]) if placeholder.startswith("hex:") else placeholder.encode()


def placeholder_texts(placeholder: str) -> tuple[str, ...]:
    """Every text a field of the row image may hold the placeholder as: the placeholder itself, a bytea column's bytes
    in base64 (the JsonConverter's; `binary.handling.mode` base64 and base64-url-safe) or hex (`hex`), and an array
    column's one-element array, as JSON."""
    import base64
    import json

    raw = placeholder_bytes(placeholder)
    text = raw.decode("utf-8", errors="replace")
    return tuple(dict.fromkeys((text, base64.b64encode(raw).decode(), base64.urlsafe_b64encode(raw).decode(),
                                raw.hex(), raw.hex().upper(), json.dumps([text], separators=(",", ":")))))
