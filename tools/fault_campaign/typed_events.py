"""The typed change-event campaign's records (--envelope debezium --typed): Debezium's events of the wide typed table
(tools/cdc.py's columns) as its PostgreSQL connector writes them without the JsonConverter's schemas, updates among
them that leave the TOASTed note (and jsonb) unchanged, and the values the entity table must hold for each."""

from __future__ import annotations

import json
from typing import Any

from kafka_ledger.model.debezium import UNAVAILABLE_PLACEHOLDER
from tools.cdc import TYPED_DECLARED, typed_image

# The entity is event_id (as the other entity campaigns'), its sequence number in amount; then the typed table's
# columns, declared as the source's.
TYPED_CAMPAIGN_COLUMNS: list[dict[str, Any]] = [
    {"name": "event_id", "type": "string", "required": True}, {"name": "amount", "type": "long"},
    *(c for c in TYPED_DECLARED if c["name"] != "id")]
TYPED_CAMPAIGN_NAMES = tuple(c["name"] for c in TYPED_CAMPAIGN_COLUMNS[2:])
# The columns an update may leave unchanged and TOASTed: Debezium writes the placeholder in their place.
KEEP_NOTE, KEEP_NOTE_AND_DOC = "keep note", "keep note and doc"
TOASTED = {KEEP_NOTE: ("note",), KEEP_NOTE_AND_DOC: ("jb", "note")}

def _document(seq: int) -> tuple[Any, Any]:
    """The jsonb column's value of row image `seq` (its sequence number in it: the one a kept value came from)."""
    if seq % 13 == 4:
        return None, None
    held = {"seq": seq, "nested": {"list": [seq % 2 == 0, "é"]}}
    return json.dumps(held), held


def _note(seq: int) -> str | None:
    """The TOASTed text of row image `seq` (kept short: what makes it a placeholder is the event, not its size)."""
    return None if seq % 17 == 3 else f"note {seq}: ünïcode"


def typed_after(seq: int, toasted: tuple[str, ...] = ()) -> dict[str, Any]:
    """Row image `seq` as Debezium's event carries it; the `toasted` columns hold the placeholder."""
    after = {name: wire for name, (wire, _) in typed_image(seq).items()}
    after["jb"], after["note"] = _document(seq)[0], _note(seq)
    for name in toasted:
        after[name] = UNAVAILABLE_PLACEHOLDER
    return after


def typed_held(seq: int, note_seq: int, doc_seq: int) -> tuple[Any, ...]:
    """What the entity table holds for row image `seq` whose note is row image `note_seq`'s and whose jsonb is
    `doc_seq`'s (a kept value), in TYPED_CAMPAIGN_NAMES' order."""
    held = {name: value for name, (_, value) in typed_image(seq).items()}
    held["jb"], held["note"] = _document(doc_seq)[1], _note(note_seq)
    return tuple(held[name] for name in TYPED_CAMPAIGN_NAMES)


def unavailable_reason(toasted: tuple[str, ...]) -> str:
    """The dead letter of an event whose `toasted` columns hold the placeholder when the entity has no row."""
    fields = ", ".join(f"field 'after.{name}'" for name in sorted(toasted))
    return (f"{fields} holds Debezium's unavailable-value placeholder (a value the source did not log: unchanged and "
            "TOASTed), and no earlier value of the entity is known to keep: the entity table has no row of it (with "
            "REPLICA IDENTITY FULL on the source table, Debezium sends such values)")
