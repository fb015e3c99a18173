"""What a record means for the output: a row to append, or a change to the entity its key names.

The envelope is the sink's to choose (sinks/): an append table takes every record as a row, and a record with no
value (a tombstone) is a dead letter; an entity table (write: upsert) takes a tombstone as the deletion of the entity
its Kafka key names.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kafka_ledger.model.columns import TOMBSTONE
from kafka_ledger.model.kinds import StringKind

if TYPE_CHECKING:
    from pyspark.sql import Column

    from kafka_ledger.config.pipeline import PipelineConfig


@dataclass(frozen=True)
class Enveloped:
    """A record's reason, values and extra columns once its envelope has had its say."""

    error: Column
    values: dict[str, Column]
    extra: list[Column]


class Envelope(ABC):
    """How records become rows."""

    @abstractmethod
    def cheap_ok(self) -> list[Column]:
        """Cheap expressions that, all true, prove the envelope adds no reason of its own."""

    @abstractmethod
    def apply(self, pipeline: PipelineConfig, error: Column, values: dict[str, Column]) -> Enveloped:
        """The record's reason (given the format's and the checks' `error`) and its values, for the output."""

    @property
    def extra_columns(self) -> list[str]:
        """Columns the envelope adds to the decoded rows."""
        return []


class AppendRecords(Envelope):
    """Every record is a row; a record without a value (a tombstone) is a dead letter."""

    def cheap_ok(self) -> list[Column]:
        from pyspark.sql import functions as F

        return [F.col("value").isNotNull()]

    def apply(self, pipeline: PipelineConfig, error: Column, values: dict[str, Column]) -> Enveloped:
        from pyspark.sql import functions as F

        return Enveloped(F.when(F.col("value").isNull(), F.lit("null value (tombstone)")).otherwise(error), values, [])


class KeyedChanges(Envelope):
    """Every record is the newest version of the entity its key columns name; a tombstone (a null value) deletes the
    entity its Kafka key names. The key is a JSON object holding the key columns (as Kafka Connect's JSON converter
    and Debezium write keys) or, for a single key column, that column's value as text; a key column read from the
    Kafka key itself (`source: key`) has its value either way."""

    def cheap_ok(self) -> list[Column]:
        from pyspark.sql import functions as F

        return [F.col("value").isNotNull()]

    @property
    def extra_columns(self) -> list[str]:
        return [TOMBSTONE.name]

    def apply(self, pipeline: PipelineConfig, error: Column, values: dict[str, Column]) -> Enveloped:
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
        missing = F.lit(False)
        for c in pipeline.key_columns:
            missing = missing | named.get(c.name, values[c.name]).isNull()
        names = ", ".join(pipeline.key)
        forms = f"a JSON object with {names}" + (f" or the {single.name} itself" if single else "")
        problem = (F.when(key.isNull(), F.lit("tombstone (null value) without a Kafka key"))
                   .when(~F.is_valid_utf8(text), F.lit("tombstone's Kafka key is not valid UTF-8"))
                   .when(missing, F.lit(f"tombstone's Kafka key does not name its entity ({forms})")))
        keyed = {name: F.when(tombstone, named.get(name, values[name] if name in pipeline.key else F.lit(None)))
                 .otherwise(column) for name, column in values.items()}
        return Enveloped(F.when(tombstone, problem).otherwise(error), keyed, [tombstone.alias(TOMBSTONE.name)])
