"""The columns a JSON value's own schema gives: Kafka Connect's JsonConverter writes each value as `{"schema": ...,
"payload": ...}` (its default, value.converter.schemas.enable), and a Debezium change event's schema names each field
of its row image by type and semantic name (`io.debezium.time.MicroTimestamp`, a Decimal's scale and precision)."""

from __future__ import annotations

import json
import zlib
from typing import Any

from kafka_ledger.model import debezium

# Connect's semantic names (Debezium's and Kafka's own logical types) and the column type each is declared as: the
# source column's type (docs/configuration.md: Debezium's settings).
_NAMED: dict[str, str] = {
    "io.debezium.time.Date": "date", "org.apache.kafka.connect.data.Date": "date",
    "io.debezium.time.Time": "time(3)", "org.apache.kafka.connect.data.Time": "time(3)",
    "io.debezium.time.MicroTime": "time",
    "io.debezium.time.Timestamp": "local_timestamp(3)", "org.apache.kafka.connect.data.Timestamp":
        "local_timestamp(3)",
    "io.debezium.time.MicroTimestamp": "local_timestamp",
    "io.debezium.time.ZonedTimestamp": "timestamp",
    "io.debezium.time.Interval": "interval",
    "io.debezium.data.Json": "jsonb",
    "io.debezium.data.Uuid": "uuid",
}
# Semantic names no column type holds exactly, and what to do instead.
_REFUSED: dict[str, str] = {
    "io.debezium.time.MicroDuration": "an interval as microseconds, a month counted as 30.4375 days (set "
                                      "interval.handling.mode=string on the connector)",
    "io.debezium.time.NanoTime": "nanoseconds past midnight (a time column keeps microseconds)",
    "io.debezium.time.NanoTimestamp": "nanoseconds since the epoch (a timestamp column keeps microseconds)",
    "io.debezium.data.VariableScaleDecimal": "a numeric without a declared scale (declare its column "
                                             "`decimal(p,s)` with the scale its values need)",
}
# Connect's schema types as the JsonConverter names them (float: 32 bits, double: 64), without a semantic name above.
_TYPES = {"int8": "int", "int16": "int", "int32": "int", "int64": "long", "float": "double", "double": "double",
          "boolean": "boolean", "string": "string", "bytes": "bytes", "array": "jsonb", "map": "jsonb",
          "struct": "jsonb"}
_DECIMAL = "org.apache.kafka.connect.data.Decimal"
_MAX_PRECISION = 38


def value_schema(value: bytes) -> dict[str, Any] | None:
    """The JsonConverter schema a value carries, or None (not JSON, no schema: written without schemas)."""
    try:
        document = json.loads(value)
    except (ValueError, UnicodeDecodeError):
        return None
    if isinstance(document, dict) and isinstance(document.get("schema"), dict) and "payload" in document:
        return document["schema"]
    return None


def row_schema(schema: dict[str, Any], envelope: str) -> dict[str, Any]:
    """The struct whose fields become columns: a change event's row image (`after`, envelope debezium), else the
    value's own; ValueError when it is not a struct."""
    if envelope == "debezium":
        image = next((f for f in schema.get("fields", []) if f.get("field") == debezium.ROW_IMAGE), None)
        if image is None:
            raise ValueError(f"not a change event's schema: it has no field {debezium.ROW_IMAGE!r}")
        schema = image
    if schema.get("type") != "struct":
        raise ValueError(f"its schema is a {schema.get('type')}, not a struct of fields")
    return schema


def schema_hash(schema: dict[str, Any]) -> int:
    """A schema's identity (the same fields, types and parameters: the same number), as a registry's id would be."""
    return zlib.crc32(json.dumps(schema, sort_keys=True).encode()) & 0x7FFFFFFF


def column_type(field: dict[str, Any]) -> str:
    """The column type of a schema's field, or ValueError saying why none holds it exactly."""
    name, kind = field.get("name"), field.get("type")
    if name in _NAMED:
        return _NAMED[name]
    if name in _REFUSED:
        raise ValueError(_REFUSED[name])
    if name == _DECIMAL:
        parameters = field.get("parameters") or {}
        scale = int(parameters.get("scale", 0))
        precision = int(parameters.get("connect.decimal.precision", _MAX_PRECISION))
        if precision > _MAX_PRECISION or scale > precision:
            raise ValueError(f"a decimal of precision {precision} and scale {scale} (a column holds at most "
                             f"{_MAX_PRECISION} digits)")
        return f"decimal({precision},{scale})"
    if kind in _TYPES:
        return _TYPES[kind]
    raise ValueError(f"no column type holds Connect's {kind} values")


def declared_columns(schema: dict[str, Any]) -> list[dict[str, Any]]:
    """A `columns:` declaration of every field of a struct's schema (row_schema), each of the type that holds its
    values, named by the field in lower case (with the field as its `path` when that differs); a field that is not
    optional is `required`; ValueError naming each field no column type holds."""
    columns, problems = [], []
    for field in schema.get("fields", []):
        try:
            column: dict[str, Any] = {"name": field["field"].lower(), "type": column_type(field)}
        except ValueError as exc:
            problems.append(f"field {field.get('field')}: {exc}")
            continue
        if column["name"] != field["field"]:
            column["path"] = field["field"]
        if not field.get("optional", True):
            column["required"] = True
        columns.append(column)
    if problems:
        raise ValueError("; ".join(problems))
    return columns
