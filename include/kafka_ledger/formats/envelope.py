"""What a record means for the output: a row to append, or a change to the entity its key names.

The envelope is the sink's to choose (sinks/): an append table takes every record as a row, and a record with no
value (a tombstone) is a dead letter; an entity table (write: upsert) takes a tombstone as the deletion of the entity
its Kafka key names, or, with `envelope: debezium`, each value as a Debezium change event (model/debezium.py).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kafka_ledger.formats import validate
from kafka_ledger.formats.json import json_path
from kafka_ledger.model import columns as ledger_columns
from kafka_ledger.model import debezium
from kafka_ledger.model.columns import TOMBSTONE
from kafka_ledger.model.kinds import STRING, StringKind

if TYPE_CHECKING:
    from pyspark.sql import Column

    from kafka_ledger.formats.base import DeclaredColumn, DeclaredPipeline, FieldRead


@dataclass(frozen=True)
class Enveloped:
    """A record's reason, values and extra columns once its envelope has had its say."""

    error: Column
    values: dict[str, Column]
    extra: list[Column]


class Envelope(ABC):
    """How records become rows."""

    @abstractmethod
    def cheap_ok(self, pipeline: DeclaredPipeline, values: dict[str, Column],
                 unavailable: dict[str, Column]) -> list[Column]:
        """Cheap expressions that, all true, prove the envelope adds no reason of its own (`values`: the columns of
        `reading(pipeline)` as the format read them; `unavailable`: as `unavailable` found them)."""

    def reading(self, pipeline: DeclaredPipeline) -> DeclaredPipeline:
        """The pipeline as the format reads the records: its own columns, unless the envelope moves or adds some."""
        return pipeline

    def unavailable(self, pipeline: DeclaredPipeline, read: FieldRead) -> Column | None:
        """True where the record carries no value for the column but a placeholder of its producer's (a change
        event's unchanged TOASTed value): the column then reads as NULL with none of its problems, and `apply` says
        what becomes of it. None: the column's value is always the record's."""
        return None

    @abstractmethod
    def apply(self, pipeline: DeclaredPipeline, error: Column, values: dict[str, Column],
              unavailable: dict[str, Column]) -> Enveloped:
        """The record's reason (given the format's and the checks' `error`) and its values, for the output
        (`unavailable`: the columns `unavailable` named, and where they lack their value)."""

    def unexpected(self, found: Column) -> Column:
        """Of the fields no column reads (sorted paths), those that make a record a dead letter."""
        return found

    @property
    def extra_columns(self) -> tuple[ledger_columns.Column, ...]:
        """Columns the envelope adds to the decoded rows."""
        return ()


class AppendRecords(Envelope):
    """Every record is a row; a record without a value (a tombstone) is a dead letter."""

    def cheap_ok(self, pipeline: DeclaredPipeline, values: dict[str, Column],
                 unavailable: dict[str, Column]) -> list[Column]:
        from pyspark.sql import functions as F

        return [F.col("value").isNotNull()]

    def apply(self, pipeline: DeclaredPipeline, error: Column, values: dict[str, Column],
              unavailable: dict[str, Column]) -> Enveloped:
        from pyspark.sql import functions as F

        return Enveloped(F.when(F.col("value").isNull(), F.lit("null value (tombstone)")).otherwise(error), values, [])


class KeyedChanges(Envelope):
    """Every record is the newest version of the entity its key columns name; a tombstone (a null value) deletes the
    entity its Kafka key names. The key is a JSON object holding the key columns (as Kafka Connect's JSON converter
    and Debezium write keys) or, for a single key column, that column's value as text; a key column read from the
    Kafka key itself (`source: key`) has its value either way."""

    def cheap_ok(self, pipeline: DeclaredPipeline, values: dict[str, Column],
                 unavailable: dict[str, Column]) -> list[Column]:
        from pyspark.sql import functions as F

        return [F.col("value").isNotNull()]

    @property
    def extra_columns(self) -> tuple[ledger_columns.Column, ...]:
        return (TOMBSTONE,)

    def apply(self, pipeline: DeclaredPipeline, error: Column, values: dict[str, Column],
              unavailable: dict[str, Column]) -> Enveloped:
        from pyspark.sql import functions as F
        from pyspark.sql import types as T

        key, value = F.col("key"), F.col("value")
        text = key.cast("string")
        from_value = [c for c in pipeline.key_columns if c.source_kind == "value"]
        tombstone = value.isNull()
        is_object = F.ltrim(text).startswith("{")
        single = pipeline.key_columns[0] if len(pipeline.key_columns) == 1 else None
        named = {}
        if from_value:
            schema = T.StructType([T.StructField(c.name, c.type.spark_type()) for c in from_value])
            parsed = F.from_json(F.when(is_object, text), schema)
            for c in from_value:
                as_text = ((text if isinstance(c.type, StringKind) else F.trim(text).try_cast(c.type.spark_type()))
                           if c is single else F.lit(None).cast(c.type.spark_type()))
                named[c.name] = F.when(is_object, parsed[c.name]).otherwise(as_text)
        missing = validate.some([named.get(c.name, values[c.name]).isNull() for c in pipeline.key_columns])
        names = ", ".join(pipeline.key)
        forms = (f"a JSON object with {names}" + (f" or the {single.name} itself" if single else "") if from_value
                 else " or ".join(f"{c.label} is missing or null" for c in pipeline.key_columns))
        problem = F.when(key.isNull(), F.lit("tombstone (null value) without a Kafka key"))
        if pipeline.value.key_format is None:  # a key in a format of its own is no text: its columns read it
            problem = problem.when(~F.is_valid_utf8(text), F.lit("tombstone's Kafka key is not valid UTF-8"))
        problem = problem.when(missing, F.lit(f"tombstone's Kafka key does not name its entity ({forms})"))
        keyed = {name: F.when(tombstone, named.get(name, values[name] if name in pipeline.key else F.lit(None)))
                 .otherwise(column) for name, column in values.items()}
        return Enveloped(F.when(tombstone, problem).otherwise(error), keyed, [tombstone.alias(TOMBSTONE.name)])


# The columns a change event's reading adds (names no declared column can take: not identifiers).
OP_COLUMN = "debezium op"


def _old_key_column(column: DeclaredColumn) -> str:
    return f"debezium before {column.name}"


class DebeziumChanges(Envelope):
    """Every value is a Debezium change event (model/debezium.py) of the entity its key columns name: ops c, r and u
    upsert the row image (`after`), d deletes the entity, its key from the old row image (`before`) or from the
    Kafka key or a header where a key column reads those. The Kafka tombstone Debezium writes after a delete
    changes nothing (the delete did it): a published row with no key, which the merge passes over. Any other event
    (t, a truncate; an unknown op; no op at all) is a dead letter saying why, never applied."""

    def reading(self, pipeline: DeclaredPipeline) -> DeclaredPipeline:
        """Value columns read at their event path; none required there (a delete has no row image: the required
        fields are checked for upserts, in `apply`); and the hidden columns: the op, and each value key column's
        field in the old row image."""
        moved = [c.model_copy(update={"required": False, **({"path": ".".join(debezium.event_path(c.field_path))}
                                                             if c.source_kind == "value" else {})})
                 for c in pipeline.columns]
        op = moved[0].model_copy(update={"name": OP_COLUMN, "type": STRING, "source": "value",
                                         "path": debezium.OP_FIELD, "formats": None, "years": None})
        old_keys = [c.model_copy(update={"name": _old_key_column(c), "required": False,
                                         "path": ".".join(debezium.old_row_path(c.field_path))})
                    for c in pipeline.key_columns if c.source_kind == "value"]
        return pipeline.model_copy(update={"columns": [*moved, op, *old_keys]})

    @staticmethod
    def _keys(pipeline: DeclaredPipeline, values: dict[str, Column]) -> dict[str, Column]:
        """A delete's key columns: from the old row image, or as read where the column reads the key or a header."""
        return {c.name: values[_old_key_column(c)] if c.source_kind == "value" else values[c.name]
                for c in pipeline.key_columns}

    def unavailable(self, pipeline: DeclaredPipeline, read: FieldRead) -> Column | None:
        """A row-image column holding the connector's placeholder (`unavailable.value.placeholder`) in any form Debezium
        writes it (model/debezium.py), as the format carried it or as the column's kind read it; None for a kind
        whose source values are never TOASTed (ColumnKind.toastable: those are always logged whole)."""
        from pyspark.sql import functions as F

        column = read.column
        if column.source_kind != "value" or column.field_path[:1] != (debezium.ROW_IMAGE,) \
                or not column.type.toastable:
            return None
        texts = debezium.placeholder_texts(pipeline.value.debezium.unavailable_value_placeholder)
        checks = [check for check in (column.type.holds_one_of(read.value, texts),
                                      None if read.raw_text is None else read.raw_text.isin(*texts))
                  if check is not None]
        if not checks:
            return None
        return F.coalesce(validate.some(checks), F.lit(False))

    @staticmethod
    def _fillable(pipeline: DeclaredPipeline, unavailable: dict[str, Column]) -> list[str]:
        """The columns whose unavailable value the merge keeps from the entity: all but its key."""
        return [name for name in unavailable if name not in pipeline.key]

    @staticmethod
    def _carried(values: dict[str, Column], unavailable: dict[str, Column], name: str) -> Column:
        """Whether the event carries the column: a value, or a placeholder the merge fills."""
        value = values[name].isNotNull()
        return value | unavailable[name] if name in unavailable else value

    def cheap_ok(self, pipeline: DeclaredPipeline, values: dict[str, Column],
                 unavailable: dict[str, Column]) -> list[Column]:
        from pyspark.sql import functions as F

        op = values[OP_COLUMN]
        upsert = validate.every([op.isin(*debezium.UPSERT_OPS),
                                 *[self._carried(values, unavailable, c.name) for c in pipeline.columns if c.required],
                                 *[~unavailable[name] for name in pipeline.key if name in unavailable]])
        delete = validate.every([op == F.lit(debezium.DELETE_OP),
                                 *[key.isNotNull() for key in self._keys(pipeline, values).values()]])
        return [F.col("value").isNotNull(), F.coalesce(upsert | delete, F.lit(False))]

    def apply(self, pipeline: DeclaredPipeline, error: Column, values: dict[str, Column],
              unavailable: dict[str, Column]) -> Enveloped:
        from pyspark.sql import functions as F

        op = values[OP_COLUMN]
        no_value = F.col("value").isNull()
        upsert = F.coalesce(op.isin(*debezium.UPSERT_OPS), F.lit(False))
        delete = F.coalesce(op == F.lit(debezium.DELETE_OP), F.lit(False))
        event = pipeline.value.envelope
        op_problem = (
            F.when(op.isNull(), F.lit(f"not a change event: no op (envelope {event}; a row already unwrapped, e.g. "
                                      "by ExtractNewRecordState, needs no envelope)"))
            .when(op == F.lit(debezium.TRUNCATE_OP), F.lit("truncate event (op t): not applied to an entity table "
                                                           "(to apply it, delete the table's rows yourself)"))
            .when(~upsert & ~delete, F.concat(F.lit("unknown op '"), op, F.lit("' (a change event's op is c, r, u "
                                                                                 "or d)"))))
        moved = {c.name: c for c in self.reading(pipeline).columns}
        unnamed = [F.when(upsert & unavailable[name], F.lit(
            f"{moved[name].label} holds Debezium's unavailable-value placeholder: a key column must carry its value"))
                   for name in pipeline.key if name in unavailable]
        required = [F.when(upsert & ~self._carried(values, unavailable, c.name), F.lit(moved[c.name].required_reason))
                    for c in pipeline.columns if c.required]
        keys = self._keys(pipeline, values)
        where = {c.name: (moved[_old_key_column(c)] if c.source_kind == "value" else c).label
                 for c in pipeline.key_columns}
        missing = [F.when(delete & keys[name].isNull(), F.lit(
            f"delete event (op d) without its key: {where[name]} is null (the source table's REPLICA IDENTITY "
            "must hold the key)")) for name in pipeline.key]
        reason = F.when(no_value, F.lit(None).cast("string")).otherwise(F.coalesce(error, op_problem, *unnamed,
                                                                                     *required, *missing))
        changed = {}
        for c in pipeline.columns:
            row_value = values[c.name]
            old = keys.get(c.name, F.lit(None).cast(c.type.spark_type()))
            changed[c.name] = F.when(no_value, F.lit(None).cast(c.type.spark_type())).when(delete, old).otherwise(
                row_value)
        upserted = ~no_value & upsert
        fillable = self._fillable(pipeline, unavailable)
        lacking = F.lit(None).cast("string")
        if fillable:
            any_lacking = validate.some([unavailable[name] for name in fillable])
            names = F.array_compact(F.array(*[F.when(unavailable[name], F.lit(name)) for name in fillable]))
            lacking = F.when(upserted & any_lacking, F.to_json(names))
        return Enveloped(reason, changed, [
            (no_value | delete).alias(TOMBSTONE.name),
            lacking.alias(ledger_columns.UNAVAILABLE.name),
            F.when(upserted, self._header_key(pipeline, debezium.OLD_KEY_HEADER)).alias(ledger_columns.OLD_KEY.name),
            F.when(~no_value & delete, self._header_key(pipeline, debezium.NEW_KEY_HEADER))
            .alias(ledger_columns.NEW_KEY.name),
        ])

    @staticmethod
    def _header_key(pipeline: DeclaredPipeline, header: str) -> Column:
        """The key a primary-key change's header names (a JSON object of the source key's fields), as a JSON object
        of the key columns, typed as they are; NULL without the header, or when a key column is not a field of the
        row image or of the Kafka key (then the change's entities cannot be linked)."""
        from pyspark.sql import functions as F

        matching = F.filter(F.col("headers"), lambda h: h["key"] == F.lit(header))
        text = F.try_element_at(matching, F.lit(1))["value"].cast("string")
        fields = []
        for c in pipeline.key_columns:
            if c.source_kind == "header" or not c.field_path:
                return F.lit(None).cast("string")
            token = F.get_json_object(text, json_path(c.field_path))
            fields.append((token if isinstance(c.type, StringKind) else F.trim(token).try_cast(c.type.spark_type()))
                          .alias(c.name))
        return F.when(text.isNotNull(), F.to_json(F.struct(*fields)))

    @property
    def extra_columns(self) -> tuple[ledger_columns.Column, ...]:
        return (TOMBSTONE, *ledger_columns.CHANGE_EVENT_EXTRA)

    def unexpected(self, found: Column) -> Column:
        """Only the row image's fields: the event's own (`source`, `ts_ms`, ...) and the old row image are not
        the entity's."""
        from pyspark.sql import functions as F

        return F.filter(found, lambda path: path.startswith(f"{debezium.ROW_IMAGE}."))
