"""The JSON format: the record's value (and its key or headers, where columns read them) as JSON documents.

Lean by design: every record pays for one JSON parse of each document its columns read (Spark's `from_json` with the
declared fields' schema) and a few cheap checks; only the records that fail them get their exact reason worked out,
which parses them again. A column's `path` names its field inside the document (`user.address.city`); a column of the
key or a header without a path reads the whole key or header as text. Numbers, booleans and strings are typed by
`from_json`; the kinds read as text (timestamps, dates) take the token's text; decimals and jsonb values come from a
Spark variant of their field (parsed by the same `from_json`), which keeps a JSON number of up to 38 digits exactly
where a typed field would go through a binary float. With `framing: confluent` the value's document is what follows
Confluent's frame (framing.py), and a value without the frame is a dead letter.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kafka_ledger.formats import framing, json_schemas, sources, validate
from kafka_ledger.formats.base import ColumnSources, DeclaredPipeline, DerivedColumns, FieldRead, Reading, ValueFormat
from kafka_ledger.formats.schema_registry import SchemaNotSeen, SchemaRefused
from kafka_ledger.model import debezium
from kafka_ledger.model.kinds import ColumnKind, TimestampKind

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame
    from pyspark.sql.types import StructType

    from kafka_ledger.formats.base import DeclaredColumn, DeclaredPipeline

CORRUPT_COLUMN = "_corrupt_record"
# The value's document when it is not the value as it is: after the frame (`framing: confluent`; NULL when not
# framed), and a change event's inside the JsonConverter's wrapper (`envelope: debezium`).
VALUE_DOCUMENT = "value document"
# Kafka Connect's JsonConverter with schemas enabled wraps each value: {"schema": {...}, "payload": <the value>}.
_WRAPPED = r'^\s*\{\s*"schema"\s*:'
FRAMED_LIKE_CONFLUENT = ("malformed JSON (the value starts like Confluent's wire format, a magic byte 0 and a schema "
                         "id: declare `framing: confluent`)")
# Jackson, Spark's JSON parser, refuses documents nested deeper than this.
MAX_JSON_DEPTH = 1000
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# The types a Spark variant holds an exact JSON number in (a number in exponent notation, or of more than 38 digits,
# becomes a DOUBLE).
_EXACT_NUMBERS = ("BIGINT", "INT", "SMALLINT", "TINYINT")


def json_path(path: tuple[str, ...]) -> str:
    """A field's path as Spark's JSON path functions take it: `$.user.id`, `$['first name']`."""
    return "$" + "".join(f".{key}" if _IDENTIFIER.match(key) else f"['{key}']" for key in path)


# How a column of each kind (by its word) reads its field: `typed`, the token as from_json types it (a number, a
# boolean); `string`, a string token (an object or array refused); `text`, the token's text read by the kind
# (`from_text`); `timestamp`, the token's text parsed once as ISO-8601 and once as a number (`TimestampKind.parses`);
# `exact number`, the token's text from a Spark variant of the field (a JSON number of up to 38 digits exactly,
# where a typed field would go through a binary float); `document`, a JSON object or array from the variant, kept whole;
# `none`, no JSON token holds the kind (the declaration is refused).
JSON_READS: dict[str, str] = {
    "string": "string", "long": "typed", "int": "typed", "double": "typed", "boolean": "typed",
    "timestamp": "timestamp", "local_timestamp": "timestamp", "date": "text", "time": "text", "uuid": "text",
    "decimal": "exact number", "jsonb": "document", "bytes": "none", "interval": "text",
}
# How Debezium's change events write a row image's field of each kind, where that differs (its PostgreSQL
# connector's settings, `value.debezium`, choose among them): `json text`, a string holding JSON text (json, jsonb,
# hstore; an array is a JSON array, kept whole); `epoch days`, a date as days since 1970-01-01; `epoch millis` and
# `epoch micros`, a timestamp without time zone since the epoch, or a time of day since midnight, as its precision and
# `time.precision.mode` say; `base64`, `base64-url-safe` and `hex`, bytes as `binary.handling.mode` writes them;
# `precise`, a numeric as its unscaled value in base64, its scale in the record's schema (the JsonConverter's, with
# schemas enabled), or, for a numeric without a declared scale, an object of both.
# Debezium's time.precision.modes that keep a value's digits beyond milliseconds (its third, connect, writes only
# milliseconds).
ADAPTIVE_MODES = ("adaptive", "adaptive_time_microseconds")


def debezium_reads(settings: Any, kind: ColumnKind) -> str | None:
    """The reading of a row image's field of `kind` under the connector's `settings`, or None: as plain JSON."""
    word = kind.word
    if word == "jsonb":
        return "json text"
    if word == "date":
        return "epoch days"
    if word in ("local_timestamp", "time"):
        mode = settings.time_precision_mode
        micros = (kind.precision > 3 and mode in ADAPTIVE_MODES) or (word == "time" and mode == ADAPTIVE_MODES[1])
        return "epoch micros" if micros else "epoch millis"
    if word == "bytes":
        return "base64" if settings.binary_handling_mode == "bytes" else settings.binary_handling_mode
    if word == "decimal" and settings.decimal_handling_mode == "precise":
        return "precise"
    return None


# The readings whose field from_json parses as a variant, those it gives as text, and those it gives as a number.
_FROM_VARIANT = ("exact number", "document", "json text", "precise")
_AS_TEXT = ("text", "timestamp", "base64", "base64-url-safe", "hex")
_AS_LONG = ("epoch days", "epoch millis", "epoch micros")


def readings(pipeline: DeclaredPipeline) -> dict[str, str]:
    """Each column's reading: by its kind (JSON_READS), or, for a change event's row image, as Debezium writes it."""
    found = {}
    for column in pipeline.columns:
        reading = None
        if pipeline.value.envelope == "debezium" and column.field_path[:1] in (
                (debezium.ROW_IMAGE,), (debezium.OLD_ROW_IMAGE,)) and column.source_kind == "value":
            reading = debezium_reads(pipeline.value.debezium, column.type)
        found[column.name] = reading or JSON_READS[column.type.word]
    return found


@dataclass(frozen=True)
class _Document:
    """One JSON document the pipeline's columns read fields of: the value, the Kafka key or a header. Names its
    columns in the parsed frame (not identifiers: no declared column can take them)."""

    source: str
    columns: tuple[DeclaredColumn, ...]
    readings: Mapping[str, str]

    def reading(self, column: DeclaredColumn) -> str:
        return self.readings[column.name]

    @property
    def is_value(self) -> bool:
        return self.source == "value"

    @property
    def what(self) -> str:
        """The document in reasons (the value's problems keep their historic wording: `malformed JSON ...`)."""
        if self.source == "key":
            return "the Kafka key"
        return f"header '{self.source.partition(':')[2]}'" if self.source != "value" else "value"

    @property
    def parsed(self) -> str:
        return "parsed" if self.is_value else f"parsed {self.source}"

    @property
    def variant(self) -> str:
        return f"variant of {self.source}"

    @property
    def parses(self) -> tuple[str, ...]:
        """The frame's columns of the document's from_json parses: the one every document has, and a second one for
        the variants the first cannot hold (`layout`)."""
        return (self.parsed, self.variant) if self.layout[0][1] else (self.parsed,)

    @functools.cached_property
    def layout(self) -> tuple[tuple[dict[str, Any], ...], dict[str, _Placed]]:
        """The fields of each from_json parse as a tree (object keys to sub-trees, or a leaf's Spark type), and where
        each column's field is in them.

        A column read exactly (_FROM_VARIANT) has its field parsed as a Spark variant by the same from_json that types
        the other fields: one parse of the document, and only the fields' own variants to look into (a variant of
        the whole document cost a second parse, and it cannot hold a document with a duplicate key anywhere, which
        left every exact column NULL). A field inside another column's variant is read from that variant; one where
        the first parse holds an object or a typed value (a column reading `doc` whole beside one reading
        `doc.id`) goes to a second parse of variants only."""
        from pyspark.sql import types as T

        first: dict[str, Any] = {}
        placed: dict[str, _Placed] = {}
        for column in self.columns:
            reading = self.reading(column)
            if reading in _FROM_VARIANT:
                continue
            node = first
            for key in column.field_path[:-1]:
                node = node.setdefault(key, {})
            node[column.field_path[-1]] = (T.StringType() if reading in _AS_TEXT else T.LongType()
                                           if reading in _AS_LONG else column.type.spark_type())
            placed[column.name] = _Placed(0, column.field_path)
        second: dict[str, Any] = {}
        exact = sorted((c for c in self.columns if self.reading(c) in _FROM_VARIANT), key=lambda c: len(c.field_path))
        for column in exact:
            # The second parse holds variants only, placed shortest path first: one always has room.
            found = _place(first, 0, column.field_path) or _place(second, 1, column.field_path)
            if found is None:
                raise AssertionError(f"no place for column {column.name}'s variant")
            placed[column.name] = found
        return (first, second), placed

    def schema(self, parse: int = 0) -> StructType:
        """from_json's schema of one of the document's parses: every field a column reads there, nested along its
        path, and the corrupt-record column."""
        from pyspark.sql import types as T

        def struct(node: dict[str, Any]) -> StructType:
            return T.StructType([T.StructField(key, struct(sub) if isinstance(sub, dict) else sub)
                                 for key, sub in node.items()])

        top = struct(self.layout[0][parse])
        return T.StructType([*top.fields, T.StructField(CORRUPT_COLUMN, T.StringType())])

    def field(self, column: DeclaredColumn) -> Column:
        """The column's field as its parse holds it: a typed value, or a variant (NULL: the field is absent)."""
        from pyspark.sql import functions as F

        found = self.layout[1][column.name]
        value = F.col(self.parses[found.parse])
        for key in found.path:
            value = value.getField(key)
        return F.variant_get(value, json_path(found.inner), "variant") if found.inner else value


@dataclass(frozen=True)
class _Placed:
    """Where a column's field is: in which of its document's parses, at which path, and, for a field inside another
    column's variant, its path inside that variant."""

    parse: int
    path: tuple[str, ...]
    inner: tuple[str, ...] = ()


def _place(tree: dict[str, Any], parse: int, path: tuple[str, ...]) -> _Placed | None:
    """A variant field at `path` in a parse's tree: a leaf of its own, or inside a variant leaf on its way; None when
    the tree holds an object or a typed value there."""
    from pyspark.sql import types as T

    node = tree
    for depth, key in enumerate(path):
        sub = node.get(key)
        last = depth == len(path) - 1
        if isinstance(sub, T.VariantType):
            return _Placed(parse, path[:depth + 1], path[depth + 1:])
        if sub is None and last:
            node[key] = T.VariantType()
            return _Placed(parse, path)
        if sub is None:
            node = node.setdefault(key, {})
        elif isinstance(sub, dict) and not last:
            node = sub
        else:
            return None
    return None


# A change event's row image's fields as the JsonConverter's schema declares them (with schemas enabled): each
# field's name and parameters (a Decimal's `scale`). Not an identifier: no declared column can take the name.
ROW_SCHEMA = "debezium row schema"


def _row_schema(pipeline: DeclaredPipeline) -> Column:
    """The `after` struct's fields in the schema of the JsonConverter's wrapper; NULL for a value without one."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    field = T.StructType([T.StructField("field", T.StringType()),
                          T.StructField("parameters", T.MapType(T.StringType(), T.StringType()))])
    wrapper = T.StructType([T.StructField("schema", T.StructType([T.StructField("fields", T.ArrayType(T.StructType([
        T.StructField("field", T.StringType()), T.StructField("fields", T.ArrayType(field))])))]))])
    text = (framing.payload(F.col("value")) if _framed(pipeline) else F.col("value")).cast("string")
    fields = F.from_json(F.when(text.rlike(_WRAPPED), text), wrapper)["schema"]["fields"]
    return F.try_element_at(F.filter(fields, lambda f: f["field"] == F.lit(debezium.ROW_IMAGE)), F.lit(1))["fields"]


def _value_document(pipeline: DeclaredPipeline) -> Column:
    """The value's document: after the frame when framed; a change event's payload when the JsonConverter wrapped
    it (a document starting with a `schema` field, then holding a `payload`)."""
    from pyspark.sql import functions as F

    document = framing.payload(F.col("value")) if _framed(pipeline) else F.col("value")
    if pipeline.value.envelope != "debezium":
        return document
    text = document.cast("string")
    # get_json_object writes the payload out again: integers and strings as they were, a fractional number as the
    # double it parses to. The JsonConverter writes only doubles that way (a Connect FLOAT64; decimals are strings or
    # bytes): nothing it wrote changes.
    payload = F.when(text.rlike(_WRAPPED), F.get_json_object(text, "$.payload").cast("binary"))
    return F.coalesce(payload, document)


def _prefixed(prefix: str) -> Callable[[Column], Column]:
    """A function of a key giving `prefix` + key (for F.transform, which reads its lambda's signature)."""
    from pyspark.sql import functions as F

    return lambda key: F.concat(F.lit(prefix), key)


def _precise_column(column: DeclaredColumn, part: str) -> str:
    return f"precise {part} of {column.name}"


def _kind_part_column(column: DeclaredColumn, part: str) -> str:
    return f"{part} of the text of {column.name}"


def _text_column(column: DeclaredColumn, how: str) -> str:
    return f"parsed timestamp {how} of {column.name}"


def _framed(pipeline: DeclaredPipeline) -> bool:
    return pipeline.value.framing == "confluent"


class JsonFormat(ValueFormat):
    """JSON documents: the record's value must be a JSON object; a key or header a column reads by path too."""

    name = "json"
    description = "a JSON document whose fields the columns name (by `path`)"
    options = frozenset({"framing"})
    kind_readings = JSON_READS
    derives_when = ("only Debezium's change events written with the JsonConverter's schemas carry one (`envelope: "
                    "debezium`, value.converter.schemas.enable true)")

    # --- columns from the values' own schema (the JsonConverter's) -------------------------------------------------

    def can_derive_columns(self, pipeline: DeclaredPipeline) -> bool:
        return pipeline.value.envelope == "debezium" and pipeline.value.debezium.value_converter_schemas_enable

    def columns_subject(self, pipeline: DeclaredPipeline, topics: list[str]) -> str:
        return min(topics)

    def derived_columns(self, sources: ColumnSources, subject: str, envelope: str) -> DerivedColumns:
        """The columns of the row image's fields, as the newest change event of topic `subject` carrying the
        JsonConverter's schema declares them."""
        values = sources.newest_values(subject)
        schema = next((found for value in values if (found := json_schemas.value_schema(value)) is not None), None)
        if not values:
            raise SchemaNotSeen(f"no columns can be taken from topic {subject}: it holds no change event yet (Debezium "
                                "writes its snapshot when the connector starts); declare the pipeline's `columns:`")
        if schema is None:
            raise SchemaRefused(f"no columns can be taken from topic {subject}: its newest records carry no "
                                "JsonConverter schema (value.converter.schemas.enable false?); declare the pipeline's "
                                "`columns:`")
        try:
            row = json_schemas.row_schema(schema, envelope)
            columns = json_schemas.declared_columns(row)
        except ValueError as exc:
            raise SchemaRefused(f"no columns can be taken from topic {subject}'s newest change event: {exc}; declare "
                                "the pipeline's `columns:` (`kafka-ledger columns --topic` prints those it can take)"
                                ) from None
        return DerivedColumns(subject, json_schemas.schema_hash(row), 0, columns)

    def columns_origin(self, subject: str, schema_id: int, version: int) -> str:
        return f"the JsonConverter schema of topic {subject}'s newest change event (schema hash {schema_id})"

    def declaration_problems(self, pipeline: DeclaredPipeline) -> list[str]:
        problems = super().declaration_problems(pipeline)
        settings = pipeline.value.debezium
        in_json, imprecise, truncated, approximate, floating = [], [], [], [], []
        for c in pipeline.columns or []:
            if not c.field_path:
                continue
            in_row = (pipeline.value.envelope == "debezium" and c.source_kind == "value"
                      and debezium.event_path(c.field_path)[0] == debezium.ROW_IMAGE)
            reading = (debezium_reads(settings, c.type) if in_row else None) or JSON_READS[c.type.word]
            if reading == "none":
                in_json.append(c.name)
            if in_row and c.type.word == "decimal" and settings.decimal_handling_mode == "precise" \
                    and not settings.value_converter_schemas_enable:
                imprecise.append(f"{c.name} ({c.type})")
            if in_row and c.type.word in ("local_timestamp", "time") and c.type.precision > 3 \
                    and settings.time_precision_mode not in ADAPTIVE_MODES:
                truncated.append(f"{c.name} ({c.type})")
            if in_row and c.type.word == "interval" and settings.interval_handling_mode != "string":
                approximate.append(c.name)
            if in_row and c.type.word == "decimal" and settings.decimal_handling_mode == "double":
                floating.append(f"{c.name} ({c.type})")
        if in_json:
            problems.append(f"column(s) {', '.join(in_json)}: a bytes column reads an Avro bytes or fixed field, or a "
                            "whole Kafka key or header; a JSON document's field has no bytes (declare it as a string)")
        if imprecise:
            problems.append(
                f"column(s) {', '.join(imprecise)}: Debezium's decimal.handling.mode precise (its default) writes a "
                "numeric as its unscaled bytes, the scale in the record's schema only, and its JsonConverter writes "
                "no schema (value.converter.schemas.enable false): set decimal.handling.mode=string on the connector "
                "(every digit, as text) and declare it: `value: {envelope: debezium, debezium: "
                "{decimal.handling.mode: string, value.converter.schemas.enable: false}}`")
        if truncated:
            problems.append(
                f"column(s) {', '.join(truncated)}: Debezium's time.precision.mode connect writes milliseconds, losing "
                "the digits after them: set time.precision.mode=adaptive on the connector (its default) and declare "
                "it, or declare the columns' precision as 3")
        if floating:
            problems.append(
                f"column(s) {', '.join(floating)}: Debezium's decimal.handling.mode double writes a numeric as a "
                "binary float, its digits past about 15 already lost: set decimal.handling.mode=string on the "
                "connector (every digit, as text) and declare it, or declare the column(s) double")
        if approximate:
            problems.append(
                f"column(s) {', '.join(approximate)}: Debezium's interval.handling.mode numeric (its default) writes "
                "an interval as microseconds, a month counted as 30.4375 days (not the interval the source holds): set "
                "interval.handling.mode=string on the connector (ISO-8601 text, exact) and declare it: `value: "
                "{envelope: debezium, debezium: {interval.handling.mode: string}}`")
        return problems

    # --- hooks for a format whose values another decoder reads into the fields JSON's reading takes (protobuf.py) ---

    def column_readings(self, pipeline: DeclaredPipeline) -> dict[str, str]:
        """Each column's reading (JSON_READS' words)."""
        return readings(pipeline)

    def _has_document(self, pipeline: DeclaredPipeline) -> bool:
        """Whether the value's document is not the value as it is (VALUE_DOCUMENT holds it)."""
        return _framed(pipeline) or pipeline.value.envelope == "debezium"

    def _prepared(self, records: DataFrame, pipeline: DeclaredPipeline, keep: list[str]) -> tuple[DataFrame, list[str]]:
        """The records with what the documents' parses read beside the Kafka source's columns (the value's document
        when it is not the value itself, a change event's row schema), and the columns to keep."""
        if self._has_document(pipeline):
            records = records.withColumn(VALUE_DOCUMENT, _value_document(pipeline))
            keep = [*keep, VALUE_DOCUMENT]
        if "precise" in self.column_readings(pipeline).values():
            records = records.withColumn(ROW_SCHEMA, _row_schema(pipeline))
            keep = [*keep, ROW_SCHEMA]
        return records, keep

    def _value_checks(self, pipeline: DeclaredPipeline, raw: Column) -> tuple[list[Column], list[Column]]:
        """The value's problems before it is a document (its frame), and cheap checks proving them NULL."""
        from pyspark.sql import functions as F

        if _framed(pipeline):
            return ([F.when(~framing.is_framed(F.col("value")), F.lit(framing.NOT_FRAMED))],
                    [framing.is_framed(F.col("value"))])
        # No JSON document begins with a byte 0: such a value was framed by a serializer.
        return [F.when(framing.is_framed(raw), F.lit(FRAMED_LIKE_CONFLUENT))], []

    def _raw(self, source: str, pipeline: DeclaredPipeline) -> Column:
        """A document's bytes: the value's document (VALUE_DOCUMENT when it is not the value itself), the key, or a
        header."""
        from pyspark.sql import functions as F

        return (F.col(VALUE_DOCUMENT) if source == "value" and self._has_document(pipeline)
                else sources.source_bytes(source))

    def _documents(self, pipeline: DeclaredPipeline) -> list[_Document]:
        by_source: dict[str, list[DeclaredColumn]] = {"value": []}
        for column in pipeline.columns:
            if column.field_path:
                by_source.setdefault(column.source, []).append(column)
        found = self.column_readings(pipeline)
        return [_Document(source, tuple(columns), found) for source, columns in by_source.items()]

    def _document_parses(self, documents: list[_Document], pipeline: DeclaredPipeline) -> list[Column]:
        """Each document's parses, named as the reading refers to them (`_Document.parses`): from_json's, each field
        typed as its column reads it, and `_corrupt_record` set where one is not."""
        from pyspark.sql import functions as F

        return [F.from_json(self._raw(d.source, pipeline).cast("string"), d.schema(parse),
                            {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": CORRUPT_COLUMN}).alias(name)
                for d in documents for parse, name in enumerate(d.parses)]

    def parse(self, records: DataFrame, pipeline: DeclaredPipeline, keep: list[str]) -> DataFrame:
        from pyspark.sql import functions as F

        documents = self._documents(pipeline)
        records, keep = self._prepared(records, pipeline, keep)
        parsed = records.select(*keep, *self._document_parses(documents, pipeline))
        timestamps = [(d, c) for d in documents for c in d.columns if d.reading(c) == "timestamp"]
        if timestamps:
            parsed = parsed.select("*", *[
                parse.alias(_text_column(c, how)) for d, c in timestamps
                for parse, how in zip(TimestampKind.parses(self._token(d, c)), ("text", "number"), strict=True)])
        precise = [(d, c) for d in documents for c in d.columns if d.reading(c) == "precise"]
        if precise:
            # Two projections: the parts from the document and its schema, then the decimal's text from them (each
            # read several times, and deep enough to pass Spark Connect's nesting limit if written out each time).
            parsed = parsed.select("*", *[part.alias(_precise_column(c, name)) for d, c in precise
                                          for name, part in self._precise_parts(d, c).items()])
            parsed = parsed.select("*", *[
                part.alias(_precise_column(c, name)) for _, c in precise
                for name, part in zip(("text", "why"), c.type.unscaled_text(
                    F.col(_precise_column(c, "unscaled")), F.col(_precise_column(c, "scale"))), strict=True)])
        parted = [(c, c.type.text_parts(text)) for d in documents for c in d.columns
                  if (text := self._kind_text(d, c)) is not None]
        if any(parts for _, parts in parted):
            parsed = parsed.select("*", *[part.alias(_kind_part_column(c, name)) for c, parts in parted
                                          for name, part in parts.items()])
        return parsed

    def _precise_parts(self, document: _Document, column: DeclaredColumn) -> dict[str, Column]:
        """A precise numeric's parts: its unscaled value as written (`fixed`, a numeric with a declared scale; else
        the object's `value`), the scale (from the record's schema; else the object's), and the scale the schema
        declares."""
        from pyspark.sql import functions as F

        variant = self._variant(document, column)
        shape = F.schema_of_variant(variant)
        fixed = F.when(shape == F.lit("STRING"), F.variant_get(variant, "$", "string"))
        is_object = shape.startswith("OBJECT")
        declared = F.try_element_at(F.filter(F.col(ROW_SCHEMA), lambda f: f["field"] == F.lit(column.field_path[-1])),
                                    F.lit(1))["parameters"]["scale"].try_cast("int")
        return {"fixed": fixed, "object": is_object, "declared": declared,
                "present": self._carried(variant),
                "unscaled": F.coalesce(fixed, F.when(is_object, F.try_variant_get(variant, "$.value", "string"))),
                "scale": F.when(fixed.isNotNull(), declared).otherwise(F.try_variant_get(variant, "$.scale", "int"))}

    @staticmethod
    def _token(document: _Document, column: DeclaredColumn) -> Column:
        from pyspark.sql import functions as F

        value = F.col(document.parsed)
        for key in column.field_path:
            value = value.getField(key)
        return value

    def _document_checks(self, pipeline: DeclaredPipeline, document: _Document, raw: Column, whole: Column
                         ) -> tuple[list[Column], list[Column], list[Column]]:
        """A document's own problems (before any field's), its catch-all (after them), and cheap checks proving both
        NULL; `whole`: true where every parse of it read every field as declared."""
        from pyspark.sql import functions as F

        text = raw.cast("string")
        parsed = F.col(document.parsed)
        if not document.is_value:
            present = raw.isNotNull()
            return ([F.when(present & ~F.is_valid_utf8(text), F.lit(f"{document.what} is not valid UTF-8")),
                     F.when(present & F.json_object_keys(text).isNull(),
                            F.lit(f"{document.what} is not a JSON object"))],
                    [F.when(present & ~whole, F.lit(f"{document.what} does not match the declared schema"))],
                    [~present | (F.is_valid_utf8(raw) & parsed.isNotNull() & whole)])
        keys = F.json_object_keys(text)
        opening_brackets = F.length(text) - F.length(F.regexp_replace(text, r"[\[{]", ""))
        frame_problems, frame_ok = self._value_checks(pipeline, raw)
        first = [*frame_problems,
                 F.when(~F.is_valid_utf8(text), F.lit("value is not valid UTF-8")),
                 F.when(keys.isNull() & (opening_brackets > MAX_JSON_DEPTH),
                        F.lit(f"JSON nested too deeply to parse (over {MAX_JSON_DEPTH} levels)")),
                 F.when(keys.isNull(), F.lit("malformed JSON (not a JSON object)"))]
        # A document from_json parsed in full, every present field of its declared type, is a JSON object whose
        # declared fields are all valid.
        return (first, [F.when(~whole, F.lit("value does not match the declared schema"))],
                [*frame_ok, F.is_valid_utf8(raw), parsed.isNotNull(), whole])

    def read(self, pipeline: DeclaredPipeline) -> Reading:
        from pyspark.sql import functions as F

        documents = self._documents(pipeline)
        first: list[Column] = []
        last: list[Column] = []
        cheap: list[Column] = []
        reads: dict[str, FieldRead] = {}
        for document in documents:
            raw = self._raw(document.source, pipeline)
            text = raw.cast("string")
            # Every parse of the document whole: a field that did not parse as declared (or as a variant) marks it.
            whole = validate.every([F.col(name)[CORRUPT_COLUMN].isNull() for name in document.parses])
            problems, catch_all, proofs = self._document_checks(pipeline, document, raw, whole)
            first += problems
            last += catch_all
            cheap += proofs
            for column in document.columns:
                reads[column.name] = self._field(document, column, text)
        for column in pipeline.columns:
            if not column.field_path:
                reads[column.name] = sources.whole_source(column)
        unexpected = self._unexpected(documents[0], pipeline) if pipeline.extra_fields == "dead_letter" else None
        return Reading(first, [reads[c.name] for c in pipeline.columns], last, cheap, unexpected)

    def _field(self, document: _Document, column: DeclaredColumn, text: Column) -> FieldRead:
        """A column's field of the document, read as JSON_READS says for its kind."""
        readers = {"typed": self._typed, "string": self._typed, "text": self._text, "timestamp": self._timestamp,
                   "exact number": self._exact_number, "document": self._document, "json text": self._json_text,
                   "epoch days": self._epoch, "epoch millis": self._epoch, "epoch micros": self._epoch,
                   "base64": self._encoded, "base64-url-safe": self._encoded, "hex": self._encoded,
                   "precise": self._precise}
        return readers[document.reading(column)](document, column, text)

    def _precise(self, document: _Document, column: DeclaredColumn, text: Column) -> FieldRead:
        """A numeric as Debezium's decimal.handling.mode precise writes it: its unscaled value in base64, the scale
        from the record's schema; or, for a numeric without a declared scale (Debezium's VariableScaleDecimal), an
        object holding both (parse's projections made them)."""
        from pyspark.sql import functions as F

        label = column.label

        def part(name: str) -> Column:
            return F.col(_precise_column(column, name))

        read = column.type.from_unscaled(part("text"), part("why"), column, label, self._kind_parts(column))
        shaped = F.when(part("present") & part("fixed").isNull() & ~part("object"), F.lit(
            f"{label} is not a valid {column.type} (Debezium's decimal.handling.mode precise writes a numeric as "
            "its unscaled value in base64)"))
        unschema = F.when(part("fixed").isNotNull() & part("declared").isNull(), F.lit(
            f"{label} has no scale: Debezium's decimal.handling.mode precise writes it in the record's schema, and "
            "this value has none (set value.converter.schemas.enable=true on the connector, or "
            "decimal.handling.mode=string, and declare it)"))
        return FieldRead(column, read.value, [shaped, unschema, read.problem], raw_text=part("fixed"))

    def _json_text(self, document: _Document, column: DeclaredColumn, text: Column) -> FieldRead:
        """A jsonb column of a change event's row image: a string holding JSON text (any JSON value: json, jsonb,
        hstore), or a JSON array (an array column), kept whole."""
        from pyspark.sql import functions as F

        variant = self._variant(document, column)
        as_text = F.when(F.schema_of_variant(variant) == F.lit("STRING"), F.variant_get(variant, "$", "string"))
        parsed = F.coalesce(F.try_parse_json(as_text), F.when(as_text.isNull(), variant))
        present = self._carried(variant)
        read = column.type.from_variant(parsed, present, column.label, scalars=True)
        unparsed = F.when(as_text.isNotNull() & F.try_parse_json(as_text).isNull(), F.lit(
            f"{column.label} is not a valid jsonb (its text is not JSON)"))
        return FieldRead(column, read.value, [unparsed, read.problem], raw_text=as_text, present=present)

    def _epoch(self, document: _Document, column: DeclaredColumn, text: Column) -> FieldRead:
        """A number a change event writes a date, a time or a timestamp without time zone as."""
        from pyspark.sql import functions as F

        reading, label = document.reading(column), column.label
        number = self._token(document, column)
        present = F.get_json_object(text, json_path(column.field_path)).isNotNull()
        typed = F.when(present & number.isNull(), F.lit(f"{label} is not a valid {column.type} (a whole number, as "
                                                        f"Debezium writes it: {reading})"))
        read = column.type.from_debezium(number, reading, column, label)
        # A present field from_json could not read as a number marks the document as not matching (a cheap check of
        # the document's): `typed` needs no look at the text when the document passed.
        return FieldRead(column, read.value, [typed, read.problem], read.problem.isNull())

    def _encoded(self, document: _Document, column: DeclaredColumn, text: Column) -> FieldRead:
        """Bytes as a change event writes them: base64 (the JsonConverter's, and binary.handling.mode base64),
        base64-url-safe or hex."""
        from pyspark.sql import functions as F

        reading, label = document.reading(column), column.label
        token = self._token(document, column)
        if reading == "hex":
            value = F.try_to_binary(token, F.lit("hex"))
        else:
            standard = F.translate(token, "-_", "+/") if reading == "base64-url-safe" else token
            shaped = standard.rlike(r"^([A-Za-z0-9+/]{4})*([A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$")
            value = F.when(shaped, F.try_to_binary(standard, F.lit("base64")))
        return FieldRead(column, value, [F.when(token.isNotNull() & value.isNull(), F.lit(
            f"{label} is not valid {reading} (Debezium's binary.handling.mode)"))], present=token.isNotNull())

    @staticmethod
    def _variant(document: _Document, column: DeclaredColumn) -> Column:
        return document.field(column)

    @staticmethod
    def _carried(variant: Column) -> Column:
        """Whether a field's variant carries a value: the field present, and not JSON null."""
        from pyspark.sql import functions as F

        return variant.isNotNull() & ~F.is_variant_null(variant)

    def _document(self, document: _Document, column: DeclaredColumn, text: Column) -> FieldRead:
        from pyspark.sql import functions as F

        variant = self._variant(document, column)
        present = self._carried(variant)
        read = column.type.from_variant(variant, present, column.label)
        return FieldRead(column, read.value, [read.problem], raw_text=F.try_variant_get(variant, "$", "string"),
                         present=present)

    def _exact_number(self, document: _Document, column: DeclaredColumn, text: Column) -> FieldRead:
        from pyspark.sql import functions as F

        kind, label = column.type, column.label
        variant, shape, exact = self._exact_shape(document, column)
        read = kind.from_text_parts(self._kind_text(document, column), self._kind_parts(column), column, label)
        present = self._carried(variant)
        shaped = F.when(present & ~exact, F.when(
            shape.isin("DOUBLE", "FLOAT"), F.lit(f"{label} is not a valid {kind} (a number in exponent notation "
                                                 "or of more than 38 digits cannot be kept exactly)"))
            .otherwise(F.lit(f"{label} is not a valid {kind}")))
        return FieldRead(column, read.value, [shaped, read.problem], present=present)

    def _timestamp(self, document: _Document, column: DeclaredColumn, text: Column) -> FieldRead:
        from pyspark.sql import functions as F

        read = column.type.from_parsed(self._token(document, column), F.col(_text_column(column, "text")),
                                       F.col(_text_column(column, "number")), column, column.label)
        return FieldRead(column, read.value, [read.problem])

    def _text(self, document: _Document, column: DeclaredColumn, text: Column) -> FieldRead:
        token = self._kind_text(document, column)
        read = column.type.from_text_parts(token, self._kind_parts(column), column, column.label)
        return FieldRead(column, read.value, [read.problem],
                         present=token.isNotNull() if column.type.text_problem_nulls_value else None)

    def _exact_shape(self, document: _Document, column: DeclaredColumn) -> tuple[Column, Column, Column]:
        """An exact number's field: its variant, the variant's shape, and whether that holds the number exactly (a
        JSON string, an integer, a decimal)."""
        from pyspark.sql import functions as F

        variant = self._variant(document, column)
        shape = F.schema_of_variant(variant)
        return variant, shape, (shape == F.lit("STRING")) | shape.startswith("DECIMAL") | shape.isin(*_EXACT_NUMBERS)

    def _kind_text(self, document: _Document, column: DeclaredColumn) -> Column | None:
        """The text a column's kind reads (`from_text_parts`), where its reading gives it one: one home for the
        parts' projection in `parse` and for the readings that read it."""
        from pyspark.sql import functions as F

        reading = document.reading(column)
        if reading == "text":
            return self._token(document, column)
        if reading == "exact number":
            variant, _, exact = self._exact_shape(document, column)
            return F.when(exact, F.variant_get(variant, "$", "string"))
        return F.col(_precise_column(column, "text")) if reading == "precise" else None

    @staticmethod
    def _kind_parts(column: DeclaredColumn) -> dict[str, Column]:
        """The column's `text_parts`, as parse's projection holds them."""
        from pyspark.sql import functions as F

        # The parts' names, as the kind's text_parts gives them (of any text).
        return {name: F.col(_kind_part_column(column, name)) for name in column.type.text_parts(F.lit(None))}

    def _typed(self, document: _Document, column: DeclaredColumn, text: Column) -> FieldRead:
        from pyspark.sql import functions as F

        kind, label, path = column.type, column.label, json_path(column.field_path)
        token = self._token(document, column)
        present = F.get_json_object(text, path).isNotNull()
        problems = [F.when(present & token.isNull(), F.lit(f"{label} is not a valid {kind}"))]
        cheap_ok = F.lit(True)
        if document.reading(column) == "string":
            # from_json turns an object or array into its JSON text for a string column: refuse that. What looks
            # like JSON text may be a string holding it: only the variant tells (computed for failing records only).
            shape = F.schema_of_variant(F.variant_get(F.try_parse_json(text), path, "variant"))
            looks_nested = token.startswith("{") | token.startswith("[")
            problems.append(F.when(looks_nested, F.when(shape.startswith("OBJECT") | shape.startswith("ARRAY"),
                                                        F.lit(f"{label} is not a valid string (a JSON object or "
                                                              "array)"))))
            cheap_ok = F.coalesce(~looks_nested, F.lit(True))
        return FieldRead(column, token, problems, cheap_ok)

    def _unexpected(self, value: _Document, pipeline: DeclaredPipeline) -> Column:
        """The value's fields no column reads, as sorted paths: at its top level, and inside every object a declared
        path goes through."""
        from pyspark.sql import functions as F

        text = self._raw("value", pipeline).cast("string")
        declared: dict[tuple[str, ...], set[str]] = {(): set()}
        for column in value.columns:
            for depth in range(len(column.field_path)):
                declared.setdefault(column.field_path[:depth], set()).add(column.field_path[depth])
        found = []
        for parent, children in sorted(declared.items()):
            inside = text if not parent else F.get_json_object(text, json_path(parent))
            keys = F.json_object_keys(inside)
            extra = F.array_except(keys, F.array(*[F.lit(child) for child in sorted(children)]))
            if parent:
                prefix = ".".join(parent) + "."
                extra = F.coalesce(F.transform(extra, _prefixed(prefix)),
                                   F.array().cast("array<string>"))
            found.append(extra)
        return F.array_sort(F.concat(*found)) if len(found) > 1 else found[0]

