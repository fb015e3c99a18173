"""The typed change-event campaign's records (--envelope debezium --typed): Debezium's events of the wide typed table
(tools/cdc.py's columns) as its PostgreSQL connector writes them without the JsonConverter's schemas, updates among
them that leave the TOASTed note (and jsonb) unchanged, and the values the entity table must hold for each."""

from __future__ import annotations

import base64
import json
import random
import uuid
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal
from typing import Any

from kafka_ledger.model.debezium import UNAVAILABLE_PLACEHOLDER
from tools.cdc import TYPED_DECLARED

# The entity is event_id (as the other entity campaigns'), its sequence number in amount; then the typed table's
# columns, declared as the source's.
TYPED_CAMPAIGN_COLUMNS: list[dict[str, Any]] = [
    {"name": "event_id", "type": "string", "required": True}, {"name": "amount", "type": "long"},
    *(c for c in TYPED_DECLARED if c["name"] != "id")]
TYPED_CAMPAIGN_NAMES = tuple(c["name"] for c in TYPED_CAMPAIGN_COLUMNS[2:])
# How the connector is declared: numerics as text (exact without a schema), no schemas (the adaptive time precision
# and bytes as base64 are Debezium's defaults).
TYPED_DEBEZIUM = {"decimal.handling.mode": "string", "value.converter.schemas.enable": False}
# The columns an update may leave unchanged and TOASTed: Debezium writes the placeholder in their place.
KEEP_NOTE, KEEP_NOTE_AND_DOC = "keep note", "keep note and doc"
TOASTED = {KEEP_NOTE: ("note",), KEEP_NOTE_AND_DOC: ("jb", "note")}

_EPOCH = datetime(1970, 1, 1)


def _fields(seq: int) -> dict[str, tuple[Any, Any]]:
    """Row image `seq`'s values, each (as Debezium writes it in JSON, as the entity table holds it): edges among
    them (the day's last microsecond, dates before 1970 and far ahead, negative and tiny numerics, NULLs, unicode)."""
    rng = random.Random(seq)

    def maybe(wire: Any, held: Any) -> tuple[Any, Any]:
        return (None, None) if rng.random() < 0.08 else (wire, held)

    day = rng.randrange(-25_000, 80_000)
    micros_of_day = rng.choice([rng.randrange(86_400_000_000), 86_399_999_999, 0])
    seconds_of_day, millis_of_day = micros_of_day // 1_000_000, micros_of_day // 1000
    instant = day * 86_400_000_000 + micros_of_day
    at = _EPOCH + timedelta(microseconds=instant)
    cents, money, big = rng.randrange(-10**11, 10**11), rng.randrange(-10**8, 10**8), rng.randrange(-10**37, 10**37)
    raw = rng.randbytes(rng.randrange(0, 40))
    document = rng.choice([{}, {"a": [1, 2.5, None, "x"]}, [1, {"b": {"c": True}}], "text", 7])
    words = rng.choice([[], ["a b", None, "ç"], ["\"quoted\""]])
    number = rng.choice([[], [1, 2, None], [-(2**31)]])
    key = str(uuid.UUID(int=rng.getrandbits(128)))
    return {
        "j": maybe(json.dumps(document), document),
        "d": maybe(day, date(1970, 1, 1) + timedelta(days=day)),
        "ts0": maybe(day * 86_400_000 + seconds_of_day * 1000, _EPOCH + timedelta(days=day, seconds=seconds_of_day)),
        "ts3": maybe(day * 86_400_000 + millis_of_day, _EPOCH + timedelta(days=day, milliseconds=millis_of_day)),
        "ts6": maybe(instant, at),
        "tstz": maybe(at.strftime("%Y-%m-%dT%H:%M:%S.%fZ"), at.replace(tzinfo=UTC)),
        "t3": maybe(millis_of_day, _time_of(millis_of_day * 1000)),
        "t6": maybe(micros_of_day, _time_of(micros_of_day)),
        "n": maybe(_decimal_text(cents, 2), Decimal(_decimal_text(cents, 2))),
        "nv": maybe(*(lambda t: (t, Decimal(t)))(rng.choice(["3.14159265358979323846", "-0.00000000000000000001",
                                                              "0", "123456789012345678"]))),
        "m": maybe(_decimal_text(money, 2), Decimal(_decimal_text(money, 2))),
        "b": maybe(base64.b64encode(raw).decode(), raw),
        "u": maybe(key, key),
        "e": maybe(*[rng.choice(["sad", "ok", "happy"])] * 2),
        "ai": maybe(number, number),
        "at": maybe(words, words),
        "r": maybe(*[rng.choice([1.5, -2.25, 0.0])] * 2),
        "dp": maybe(*[rng.choice([0.1, -1e-300, 12345.678901234])] * 2),
        "sm": maybe(*[rng.randrange(-32768, 32768)] * 2),
        "bo": maybe(*[rng.random() < 0.5] * 2),
        "vc": maybe(*[rng.choice(["héllo", "", "a\"b'c"])] * 2),
        "ch": maybe(*[rng.choice(["ab ", "xyz"])] * 2),
        "ip": maybe(*[rng.choice(["192.168.0.1/24", "::1/128"])] * 2),
        "big": maybe(_decimal_text(big, 10), Decimal(_decimal_text(big, 10))),
    }


def _time_of(micros: int) -> time:
    return (datetime.min + timedelta(microseconds=micros)).time()


def _decimal_text(unscaled: int, scale: int) -> str:
    digits = str(abs(unscaled)).rjust(scale + 1, "0")
    return ("-" if unscaled < 0 else "") + digits[:-scale] + "." + digits[-scale:]


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
    after = {name: wire for name, (wire, _) in _fields(seq).items()}
    after["jb"], after["note"] = _document(seq)[0], _note(seq)
    for name in toasted:
        after[name] = UNAVAILABLE_PLACEHOLDER
    return after


def typed_held(seq: int, note_seq: int, doc_seq: int) -> tuple[Any, ...]:
    """What the entity table holds for row image `seq` whose note is row image `note_seq`'s and whose jsonb is
    `doc_seq`'s (a kept value), in TYPED_CAMPAIGN_NAMES' order."""
    held = {name: value for name, (_, value) in _fields(seq).items()}
    held["jb"], held["note"] = _document(doc_seq)[1], _note(note_seq)
    return tuple(held[name] for name in TYPED_CAMPAIGN_NAMES)


def unavailable_reason(toasted: tuple[str, ...]) -> str:
    """The dead letter of an event whose `toasted` columns hold the placeholder when the entity has no row."""
    fields = ", ".join(f"field 'after.{name}'" for name in sorted(toasted))
    return (f"{fields} holds Debezium's unavailable-value placeholder (a value the source did not log: unchanged and "
            "TOASTed), and no earlier value of the entity is known to keep: the entity table has no row of it (with "
            "REPLICA IDENTITY FULL on the source table, Debezium sends such values)")
