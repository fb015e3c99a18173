"""The Avro format: values in Confluent's wire format (framing.py), each decoded in Spark by from_avro from its writer
schema (the id in its frame) into the batch's reader schema, which its plan pinned.

A batch's schemas (`TopicSchemas`, one per topic) come from the registry on the driver: the pinned reader schema and
the writer schemas it may meet, the versions of the topic's subject. A value is a dead letter, with its reason, when
it is not framed, when its schema id is not a version of the subject, when its writer schema cannot be resolved into
the reader schema (Avro's schema resolution: found on the driver, once per id), or when its payload does not decode
(from_avro's PERMISSIVE mode gives a struct of NULLs then; a field appended to the reader schema with a default tells
that from a record whose fields are all null). Trailing bytes after a record are not detected, as in Confluent's own
deserializer. A column reads a field of the reader schema by `path`; `columns_problems` says, before anything is
read, which columns the reader schema cannot fill (a missing field, a type the column's kind cannot hold exactly).

The format's life (formats/base.py): a plan pins each topic's reader schema (`pin`: the subject's newest version, or
the replayed batch's), the read binds the format to the pins (`bound`: the reader and every version of the subject as
writers, with why the reader cannot read some of them: Avro's schema resolution, found on the driver), a warm-up to
the newest versions; a pipeline may leave its columns to the reader schema's fields (`derived_columns`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kafka_ledger.formats import framing, sources
from kafka_ledger.formats.base import (
    ColumnSources,
    DeclaredColumn,
    DeclaredPipeline,
    DerivedColumns,
    FieldRead,
    Reading,
)
from kafka_ledger.formats.schema_registry import (
    RegistryFormat,
    SchemaRefused,
    asking,
    newest,
    newest_schema,
    schema_of,
)
from kafka_ledger.model import debezium
from kafka_ledger.model.kinds import DECLARABLE, MAX_DECIMAL_PRECISION, ColumnKind, DecimalKind

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

# Appended to the reader schema with a default: true in every value that decoded, NULL in one that did not.
DECODED_FIELD = "__kafka_ledger_decoded"
SCHEMA_ID_COLUMN = "avro schema id"
_PRIMITIVES = {"null", "boolean", "int", "long", "float", "double", "bytes", "string"}

# How a column of each kind (by its word) reads a field of the reader schema, by the field's Avro type (`type_name`):
# `same`, the value as Spark decodes it; `cast`, widened without loss; `range`, narrowed, a value out of the kind's
# range a dead letter; `fit`, a decimal that must fit exactly; `json`, its JSON text; `text`, a string read by the
# kind (`from_text`). A type missing is one the kind
# cannot hold exactly (the plan refuses the reader schema).
AVRO_READS: dict[str, Mapping[str, str]] = {
    "string": {"string": "same", "enum": "same", "uuid": "same"},
    "long": {"int": "cast", "long": "same"},
    "int": {"long": "range", "int": "same"},
    "double": {"float": "cast", "int": "cast", "double": "same"},
    "boolean": {"boolean": "same"},
    "timestamp": {"timestamp-millis": "same", "timestamp-micros": "same"},
    "local_timestamp": {"local-timestamp-millis": "same", "local-timestamp-micros": "same"},
    "date": {"date": "same"},
    "time": {"time-micros": "same"},
    "uuid": {"uuid": "same"},
    "decimal": {"decimal": "fit", "int": "fit", "long": "fit"},
    "jsonb": {"record": "json", "array": "json", "map": "json"},
    "bytes": {"bytes": "same", "fixed": "same"},
    "interval": {"string": "text", "io.debezium.time.Interval": "text"},
}
# Debezium's change events as an AvroConverter writes them name their types by Connect's semantic names
# (`connect.name`) rather than Avro's logical types: how a column reads each (`json text`, a string holding any JSON;
# `epoch days`, `epoch millis`, `epoch micros`, a number since 1970-01-01 or midnight; `text`, a string read by the
# kind; `variable scale`, a numeric without a declared scale, its scale and unscaled bytes). A kind not named here reads
# such a field as its Avro type (a string column an enum's name, a long column a Timestamp's milliseconds).
DEBEZIUM_READS: dict[str, Mapping[str, str]] = {
    "jsonb": {"io.debezium.data.Json": "json text"},
    "date": {"io.debezium.time.Date": "epoch days"},
    "local_timestamp": {"io.debezium.time.Timestamp": "epoch millis", "io.debezium.time.MicroTimestamp":
                        "epoch micros"},
    "timestamp": {"io.debezium.time.ZonedTimestamp": "text"},
    "time": {"io.debezium.time.Time": "epoch millis", "io.debezium.time.MicroTime": "epoch micros"},
    "uuid": {"io.debezium.data.Uuid": "text"},
    "decimal": {"io.debezium.data.VariableScaleDecimal": "variable scale"},
    "interval": {"io.debezium.time.Interval": "text"},
}
for _word, _named in DEBEZIUM_READS.items():
    AVRO_READS[_word] = {**AVRO_READS[_word], **_named}
_CONNECT_NAMES = {name for named in DEBEZIUM_READS.values() for name in named}
# The readings of a semantic name that give the source column's own type (a derived column's): a numeric without a
# declared scale has none.
_DEBEZIUM_HOWS = ("epoch days", "epoch millis", "epoch micros", "text", "json text")


@dataclass(frozen=True)
class TopicSchemas:
    """The schemas one topic's values are decoded with in a batch: the reader schema (its registry id and JSON) of
    `subject`, and the writer schemas by id (every version of the subject: a value carries one of them), with why
    the reader cannot read some of them."""

    subject: str
    reader_id: int
    reader: str
    writers: Mapping[int, str]
    unreadable: Mapping[int, str] = field(default_factory=dict)

    def reader_with_marker(self) -> str:
        """The reader schema with DECODED_FIELD appended (a boolean, default true)."""
        schema = json.loads(self.reader)
        schema["fields"] = [*schema["fields"], {"name": DECODED_FIELD, "type": "boolean", "default": True}]
        return json.dumps(schema)


# --- the reader schema's fields and the columns' kinds ---------------------------------------------------------------


def _named_types(schema: Any, names: dict[str, Any]) -> None:
    """Every named type (record, enum, fixed) defined in `schema`, by full and short name."""
    if isinstance(schema, list):
        for member in schema:
            _named_types(member, names)
    elif isinstance(schema, dict):
        if schema.get("type") in ("record", "error", "enum", "fixed") and "name" in schema:
            name = schema["name"]
            full = f"{schema['namespace']}.{name}" if schema.get("namespace") and "." not in name else name
            names[full] = names[name] = schema
        for member in schema.get("fields", []):
            _named_types(member["type"], names)
        for key in ("items", "values"):
            if key in schema:
                _named_types(schema[key], names)


def _resolved(schema: Any, names: dict[str, Any]) -> Any:
    if isinstance(schema, str) and schema not in _PRIMITIVES:
        return names.get(schema, schema)
    if isinstance(schema, dict) and schema.get("type") in names and schema.get("type") not in _PRIMITIVES:
        return names[schema["type"]]
    return schema


def _without_null(schema: Any) -> Any:
    """A union with null as its one other branch is that branch (a nullable column); anything else as it is."""
    if isinstance(schema, list):
        others = [member for member in schema if member != "null"]
        if len(others) == 1 and len(schema) == 2:
            return others[0]
    return schema


def field_type(reader: str, path: tuple[str, ...]) -> Any:
    """The Avro type of the field at `path` of the reader schema (records only on the way), or KeyError saying
    where the path ends."""
    schema = json.loads(reader)
    names: dict[str, Any] = {}
    _named_types(schema, names)
    node = schema
    for depth, key in enumerate(path):
        node = _resolved(_without_null(node), names)
        if not isinstance(node, dict) or node.get("type") not in ("record", "error"):
            raise KeyError(f"{'.'.join(path[:depth])} is not a record")
        match = [member for member in node["fields"] if member["name"] == key]
        if not match:
            raise KeyError(f"the reader schema has no field {'.'.join(path[:depth + 1])}")
        node = match[0]["type"]
    return _resolved(_without_null(node), names)


def type_name(avro_type: Any) -> str:
    """An Avro type in words: `long`, `decimal(12,2)`, `timestamp-millis`, `record`, `union`."""
    if isinstance(avro_type, list):
        return "union"
    if isinstance(avro_type, str):
        return avro_type
    logical = avro_type.get("logicalType")
    if logical == "decimal":
        return f"decimal({avro_type.get('precision')},{avro_type.get('scale', 0)})"
    if not logical and avro_type.get("connect.name") in _CONNECT_NAMES:
        return avro_type["connect.name"]
    return logical or avro_type.get("type", "?")


def column_kind(avro_type: Any) -> ColumnKind | None:
    """The column type that holds values of `avro_type` as they are (widened without loss when no type holds them as
    they are; records, arrays and maps as their JSON), or None."""
    name = type_name(avro_type)
    if name.startswith("decimal("):
        try:
            return DecimalKind(int(avro_type.get("precision", 0)), int(avro_type.get("scale", 0)))
        except ValueError:  # more digits than any column holds
            return None
    return next((kind for how in ("same", *_DEBEZIUM_HOWS, "cast", "json") for kind in DECLARABLE
                 if AVRO_READS[kind.word].get(name) == how),
                None)


def declared_columns(reader: str, envelope: str = "none") -> list[dict[str, str]]:
    """A `columns:` declaration of every top-level field of a reader schema (of a change event's, `envelope:
    debezium`: every field of its row image), each of the column type that holds it (`column_kind`), named by the
    field in lower case (with the field as its `path` when that differs); ValueError naming each field no column
    type holds."""
    schema = json.loads(reader)
    names: dict[str, Any] = {}
    _named_types(schema, names)
    if envelope == "debezium":
        try:
            schema = field_type(reader, (debezium.ROW_IMAGE,))
        except KeyError as exc:
            raise ValueError(f"not a change event's schema: {exc.args[0]}") from None
    columns, problems = [], []
    for member in schema.get("fields", []):
        avro_type = _resolved(_without_null(member["type"]), names)
        kind = column_kind(avro_type)
        if kind is None:
            problems.append(f"field {member['name']}: no column type holds {type_name(avro_type)} values exactly")
        else:
            column = {"name": member["name"].lower(), "type": kind.declared}
            columns.append(column if column["name"] == member["name"] else {**column, "path": member["name"]})
    if problems:
        raise ValueError("; ".join(problems))
    return columns


def reading(kind: ColumnKind, avro_type: Any) -> str | None:
    """How a column of `kind` reads a field of `avro_type` (AVRO_READS), or None when it cannot hold it
    exactly."""
    name = type_name(avro_type)
    found = AVRO_READS[kind.word].get("decimal" if name.startswith("decimal(") else name)
    if found is None and name in _CONNECT_NAMES:  # a semantic name the kind does not know: its Avro type
        found = AVRO_READS[kind.word].get(avro_type["type"])
    return found


def columns_problems(columns: list[DeclaredColumn], schemas: TopicSchemas) -> list[str]:
    """Why the reader schema cannot fill some of the value's columns (none: every column can be read)."""
    problems = []
    for column in columns:
        if column.source != "value":
            continue
        try:
            avro_type = field_type(schemas.reader, column.field_path)
        except KeyError as exc:
            problems.append(f"column {column.name}: {exc.args[0]} (subject {schemas.subject}, schema id "
                            f"{schemas.reader_id})")
            continue
        if reading(column.type, avro_type) is None:
            problems.append(f"column {column.name} ({column.type}) cannot hold the reader schema's "
                            f"{'.'.join(column.field_path)} ({type_name(avro_type)}) exactly")
    return problems


# --- the schema registry --------------------------------------------------------------------------------------------

def unreadable_reason(reader: str, writer: str) -> str | None:
    """Why values written with `writer` cannot be resolved into `reader` (Avro's schema resolution), or None."""
    from avro.compatibility import ReaderWriterCompatibilityChecker, SchemaCompatibilityType
    from avro.schema import parse

    result = ReaderWriterCompatibilityChecker().get_compatibility(parse(reader), parse(writer))
    if result.compatibility == SchemaCompatibilityType.compatible:
        return None
    where = sorted(location for location in result.locations if location != "/") or ["/"]
    return f"{'; '.join(sorted(result.messages))} (at {', '.join(where)})"


def _avro(registered: Any, what: str) -> str:
    schema = schema_of(registered, what, "AVRO")
    if schema.references:
        raise SchemaRefused(f"{what} refers to other schemas ({len(schema.references)} reference(s)), "
                                  "which kafka-ledger does not resolve yet")
    return schema.schema_str


def newest_reader(client: Any, subject: str) -> tuple[int, int, str]:
    """The subject's newest version: its schema id, version number and schema (Avro's JSON)."""
    schema_id, version, schema = newest_schema(client, subject)
    return schema_id, version, _avro(schema, f"version {version} of subject {subject}")


def check_reader(client: Any, columns: list[DeclaredColumn], subject: str, schema_id: int) -> None:
    """Refuse a reader schema that cannot fill the columns (SchemaRefused naming each one)."""
    with asking(f"schema id {schema_id}"):
        reader = _avro(client.get_schema(schema_id), f"the reader schema (id {schema_id}) of subject {subject}")
    problems = columns_problems(columns, TopicSchemas(subject, schema_id, reader, {}))
    if problems:
        raise SchemaRefused("; ".join(problems))


def topic_schemas(client: Any, subject: str, reader_id: int) -> TopicSchemas:
    """The schemas of a topic's values in a batch: the reader `reader_id` and every version of `subject` as writers."""
    with asking(f"the schemas of subject {subject}"):
        reader = _avro(client.get_schema(reader_id), f"the reader schema (id {reader_id})")
        writers = {}
        for version in client.get_versions(subject):
            registered = client.get_version(subject, version)
            writers[registered.schema_id] = _avro(registered, f"version {version} of subject {subject}")
    unreadable = {writer_id: why for writer_id, writer in writers.items()
                  if (why := unreadable_reason(reader, writer)) is not None}
    return TopicSchemas(subject, reader_id, reader, writers, unreadable)


def newest_schemas(client: Any, subjects: dict[str, str]) -> dict[str, TopicSchemas]:
    """Each topic's schemas with its subject's newest version as the reader (`subjects`: topic -> subject), as a
    batch planned now would pin them (the Spark Connect server's warm-up reads with them)."""
    return {topic: topic_schemas(client, subject, newest(client, subject)[0]) for topic, subject in subjects.items()}


# --- Spark ----------------------------------------------------------------------------------------------------------


def _decoded_column(topic: str) -> str:
    return f"avro decoded {topic}"


def _named(name: str) -> Column:
    """A column by its name, quoted: a topic in it may hold dots (Debezium's `<prefix>.<schema>.<table>`), which an
    unquoted name would read as fields of a struct."""
    from pyspark.sql import functions as F

    return F.col("`" + name.replace("`", "``") + "`")


def _schema_id(value: Column) -> Column:
    from pyspark.sql import functions as F

    return F.conv(F.hex(value.substr(2, 4)), 16, 10).cast("long")


class AvroFormat(RegistryFormat):
    """Avro values through a schema registry (see the module); `schemas`: the batch's, by topic."""

    name = "avro"
    description = ("Avro in Confluent's wire format, its schemas in the schema registry ([Avro values]"
                   "(#avro-values))")
    options = frozenset({"subject"})
    values_name = "Avro values"
    kind_readings = AVRO_READS

    def __init__(self, schemas: Mapping[str, TopicSchemas] | None = None):
        self.schemas = dict(schemas or {})

    def with_schemas(self, schemas: Mapping[tuple[str, str], TopicSchemas]) -> AvroFormat:
        return AvroFormat({topic: found for (_, topic), found in schemas.items()})

    def declaration_problems(self, pipeline: DeclaredPipeline) -> list[str]:
        problems = super().declaration_problems(pipeline)
        if pipeline.extra_fields != "ignore":
            problems.append("extra_fields applies to format json: an Avro value has its schema's fields, and the "
                            "reader schema decides which are read")
        return problems

    def check_reader(self, registry: Any, pipeline: DeclaredPipeline, columns: list[DeclaredColumn], subject: str,
                     schema_id: int, version: int, part: str = "value") -> None:
        check_reader(registry, columns, subject, schema_id)

    def topic_schemas(self, registry: Any, subject: str, reader_id: int) -> TopicSchemas:
        return topic_schemas(registry, subject, reader_id)

    def derived_columns(self, sources: ColumnSources, subject: str, envelope: str) -> DerivedColumns:
        registry = sources.registry().client()
        schema_id, version, reader = newest_reader(registry, subject)
        try:
            columns = declared_columns(reader, envelope)
        except ValueError as exc:
            raise SchemaRefused(f"no columns can be taken from version {version} of subject {subject}: {exc}; "
                                "declare the pipeline's `columns:`") from None
        return DerivedColumns(subject, schema_id, version, columns)

    def _decode(self, schemas: TopicSchemas) -> Column:
        from pyspark.sql import functions as F
        from pyspark.sql.avro.functions import from_avro

        payload = framing.payload(F.col("value"))
        schema_id = F.col(SCHEMA_ID_COLUMN)
        reader = _spark_decimals(schemas.reader_with_marker())
        options = {"mode": "PERMISSIVE", "avroSchema": reader}
        decoded = None
        for writer_id, writer in sorted(schemas.writers.items()):
            if writer_id in schemas.unreadable:
                continue
            branch = from_avro(payload, _spark_decimals(writer), options)
            decoded = F.when(schema_id == writer_id, branch) if decoded is None else decoded.when(
                schema_id == writer_id, branch)
        nothing = from_avro(F.lit(None).cast("binary"), reader, options)  # a NULL of the reader's struct type
        return nothing if decoded is None else decoded

    def parse(self, records: DataFrame, pipeline: DeclaredPipeline, keep: list[str]) -> DataFrame:
        from pyspark.sql import functions as F

        framed = records.select(*keep, F.when(framing.is_framed(F.col("value")), _schema_id(F.col("value")))
                                .alias(SCHEMA_ID_COLUMN))
        decoded = framed.select("*", *[F.when(F.col("topic") == topic, self._decode(schemas)).alias(
            _decoded_column(topic)) for topic, schemas in sorted(self.schemas.items())])
        # A numeric without a declared scale as decimal text, in a projection of its own: its expression is deep,
        # and the reading refers to it twice.
        unscaled = []
        for topic, column, raw, avro_type in self._fields_read(pipeline):
            if _wide_decimal(avro_type):  # its unscaled bytes (_spark_decimals), its scale in the schema
                text, why = DecimalKind.unscaled_text(F.base64(raw), F.lit(int(avro_type.get("scale", 0))))
            elif reading(column.type, avro_type) == "variable scale":
                text, why = DecimalKind.unscaled_text(F.base64(raw["value"]), raw["scale"])
            else:
                continue
            unscaled += [text.alias(_unscaled_column(topic, column, "text")),
                         why.alias(_unscaled_column(topic, column, "why"))]
        return decoded.select("*", *unscaled) if unscaled else decoded

    def _fields_read(self, pipeline: DeclaredPipeline) -> list[tuple[str, DeclaredColumn, Column, Any]]:
        """(topic, column, its field of the decoded struct, the field's Avro type) of every value column its topic's
        reader schema has."""
        found = []
        for topic, schemas in sorted(self.schemas.items()):
            for column in pipeline.columns or []:
                if column.source != "value":
                    continue
                try:
                    avro_type = field_type(schemas.reader, column.field_path)
                except KeyError:
                    continue
                found.append((topic, column, _field_of(topic, column), avro_type))
        return found

    def _topic_problem(self, topic: str, schemas: TopicSchemas) -> Column:
        """Why a value of `topic` cannot be decoded at all (NULL when it decoded)."""
        from pyspark.sql import functions as F

        schema_id = F.col(SCHEMA_ID_COLUMN)
        problem = F.when(~schema_id.isin(*schemas.writers), F.concat(
            F.lit("schema id "), schema_id.cast("string"), F.lit(f" is not a version of subject {schemas.subject}")))
        for writer_id, why in sorted(schemas.unreadable.items()):
            problem = problem.when(schema_id == writer_id, F.lit(
                f"the writer schema (id {writer_id}) cannot be read with the reader schema (id {schemas.reader_id}) "
                f"of subject {schemas.subject}: {why}"))
        return problem.when(_named(_decoded_column(topic))[DECODED_FIELD].isNull(), F.concat(
            F.lit("value does not decode with its writer schema (id "), schema_id.cast("string"), F.lit(")")))

    def read(self, pipeline: DeclaredPipeline) -> Reading:
        from pyspark.sql import functions as F

        topic = F.col("topic")
        undecoded = None
        for name, schemas in sorted(self.schemas.items()):
            problem = self._topic_problem(name, schemas)
            undecoded = F.when(topic == name, problem) if undecoded is None else undecoded.when(topic == name, problem)
        known = F.lit("the batch has no schemas for the record's topic")
        first = [F.when(~framing.is_framed(F.col("value")), F.lit(framing.NOT_FRAMED)),
                 undecoded.otherwise(known) if undecoded is not None else known]
        decoded_ok = F.lit(False)
        for name in sorted(self.schemas):
            decoded_ok = F.when(topic == name, _named(_decoded_column(name))[DECODED_FIELD].isNotNull()).otherwise(
                decoded_ok)
        fields = [self._field(column) if column.source == "value" else sources.whole_source(column)
                  for column in pipeline.columns]
        return Reading(first, fields, [], [F.coalesce(decoded_ok, F.lit(False))])

    def _field(self, column: DeclaredColumn) -> FieldRead:
        """A value column: per topic, its field of the decoded struct read as the column's kind."""
        from pyspark.sql import functions as F

        value: Column | None = None
        problems: Column | None = None
        for topic, schemas in sorted(self.schemas.items()):
            try:
                avro_type = field_type(schemas.reader, column.field_path)
            except KeyError:
                # A column the batch's pinned reader lacks: added to the pipeline after the batch was planned (a
                # retry, a replay), its records have no value for it. A new batch's reader fills every column, or
                # its plan is refused (columns_problems).
                read, problem = F.lit(None).cast(column.type.spark_type()), F.lit(None).cast("string")
            else:
                read, problem = _as_kind(_field_of(topic, column), column, avro_type, topic)
            is_topic = F.col("topic") == topic
            value = F.when(is_topic, read) if value is None else value.when(is_topic, read)
            problems = F.when(is_topic, problem) if problems is None else problems.when(is_topic, problem)
        empty = F.lit(None).cast(column.type.spark_type())
        return FieldRead(column, value if value is not None else empty,
                         [problems] if problems is not None else [])


def _field_of(topic: str, column: DeclaredColumn) -> Column:
    """The column's field of its topic's decoded struct."""

    raw = _named(_decoded_column(topic))
    for key in column.field_path:
        raw = raw.getField(key)
    return raw


def _wide_decimal(avro_type: Any) -> bool:
    """A decimal of more digits than Spark's (Debezium's money: precision 64): Spark decodes its bytes."""
    return (isinstance(avro_type, dict) and avro_type.get("logicalType") == "decimal"
            and int(avro_type.get("precision", 0)) > MAX_DECIMAL_PRECISION)


def _spark_decimals(schema: str) -> str:
    """A schema as Spark decodes it: a decimal wider than Spark's without its logical type (its unscaled bytes, read
    with their scale by the kind: a value that fits the column is exact, one that does not a dead letter)."""
    def narrowed(node: Any) -> Any:
        if isinstance(node, list):
            return [narrowed(member) for member in node]
        if not isinstance(node, dict):
            return node
        if _wide_decimal(node):
            return {k: v for k, v in node.items() if k != "logicalType"}
        return {k: narrowed(v) if k in ("fields", "type", "items", "values") else v for k, v in node.items()}

    return json.dumps(narrowed(json.loads(schema)))


def _unscaled_column(topic: str, column: DeclaredColumn, part: str) -> str:
    return f"avro unscaled {part} {topic} {column.name}"


def _as_kind(raw: Column, column: DeclaredColumn, avro_type: Any, topic: str) -> tuple[Column, Column]:
    """A decoded field (of `topic`) as a value of the column's kind, and why it cannot be (NULL when it can)."""
    from pyspark.sql import functions as F

    kind, label = column.type, column.label
    how = reading(kind, avro_type)
    nothing = F.lit(None).cast("string")
    if how == "variable scale" or (how is not None and _wide_decimal(avro_type)):
        # Unscaled bytes with their scale (a numeric without a declared one; a decimal wider than Spark's): parse's
        # projection made their text.
        read = kind.from_unscaled(_named(_unscaled_column(topic, column, "text")),
                                  _named(_unscaled_column(topic, column, "why")), column, label)
        return read.value, read.problem
    if how == "same":
        return raw, nothing
    if how == "text":
        read = kind.from_text(raw, column, label)
        return read.value, read.problem
    if how in ("epoch days", "epoch millis", "epoch micros"):
        read = kind.from_debezium(raw.cast("long"), how, column, label)
        return read.value, read.problem
    if how == "json text":
        parsed = F.try_parse_json(raw)
        read = kind.from_variant(parsed, raw.isNotNull(), label, scalars=True)
        return read.value, F.when(raw.isNotNull() & parsed.isNull(), F.lit(
            f"{label} is not a valid jsonb (its text is not JSON)")).otherwise(read.problem)
    if how == "cast":
        return raw.cast(kind.spark_type()), nothing
    if how == "json":
        # A record's null field stays in its JSON (`"zip": null`), as Avro's own JSON encoding keeps it.
        return F.to_json(raw, {"ignoreNullFields": "false"}), nothing
    # range, fit: the value narrowed; when it does not come back the same, it did not fit.
    narrowed = raw.try_cast(kind.spark_type())
    fits = narrowed.isNotNull() & (narrowed.cast(raw_type(avro_type)) == raw)
    detail = (f" (it does not fit exactly: more than {kind.scale} digit(s) after the point or "
              f"{kind.precision - kind.scale} before it)" if isinstance(kind, DecimalKind) else " (out of range)")
    return F.when(fits, narrowed), F.when(raw.isNotNull() & ~fits, F.lit(f"{label} is not a valid {kind}{detail}"))


def raw_type(avro_type: Any) -> str:
    """The Spark type from_avro gives a numeric Avro type (for comparing a narrowed value back)."""
    name = type_name(avro_type)
    if name.startswith("decimal("):
        return name
    return {"int": "int", "long": "bigint"}[name]
