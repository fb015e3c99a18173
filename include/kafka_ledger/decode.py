"""Spark-side decoding of Kafka records into the declared columns, or a dead-letter reason per record."""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from kafka_ledger.config import ColumnSpec, PipelineConfig

SPARK_TYPES: dict[str, T.DataType] = {
    "string": T.StringType(),
    "long": T.LongType(),
    "int": T.IntegerType(),
    "double": T.DoubleType(),
    "boolean": T.BooleanType(),
    "timestamp": T.TimestampType(),
}

CORRUPT_COLUMN = "_corrupt_record"
# Jackson, Spark's JSON parser, refuses documents nested deeper than this.
MAX_JSON_DEPTH = 1000


def value_schema(pipeline: PipelineConfig) -> T.StructType:
    """The JSON value's schema, plus the column Spark fills with records it could not parse."""
    fields = [T.StructField(c.name, SPARK_TYPES[c.type]) for c in pipeline.columns]
    return T.StructType(fields + [T.StructField(CORRUPT_COLUMN, T.StringType())])


def _field_errors(columns: list[ColumnSpec], text: Column, parsed: Column) -> list[Column]:
    errors = []
    variant = F.try_parse_json(text)
    for c in columns:
        present = F.get_json_object(text, f"$.{c.name}").isNotNull()
        errors.append(F.when(present & parsed[c.name].isNull(), F.lit(f"field '{c.name}' is not a valid {c.type}")))
        if c.type == "string":
            # from_json turns an object or array into its JSON text for a string column: refuse that.
            # Parsing the value again costs, so only values that look like JSON text are looked at.
            kind = F.schema_of_variant(F.variant_get(variant, f"$.{c.name}", "variant"))
            looks_nested = parsed[c.name].startswith("{") | parsed[c.name].startswith("[")
            errors.append(F.when(looks_nested, F.when(kind.startswith("OBJECT") | kind.startswith("ARRAY"),
                                 F.lit(f"field '{c.name}' is not a valid string (a JSON object or array)"))))
    for c in columns:
        if c.required:
            errors.append(F.when(parsed[c.name].isNull(), F.lit(f"required field '{c.name}' is missing or null")))
    return errors


def _extra_fields(pipeline: PipelineConfig, keys: Column) -> list[Column]:
    if pipeline.extra_fields != "dead_letter":
        return []
    extra = F.array_except(keys, F.array(*[F.lit(c.name) for c in pipeline.columns]))
    reason = F.concat(F.lit("unexpected field(s): "), F.array_join(F.array_sort(extra), ", "))
    return [F.when(F.size(extra) > 0, reason)]


def dead_letter_reason(pipeline: PipelineConfig, value: Column, text: Column, parsed: Column) -> Column:
    """Why a record cannot be published (NULL when it can), first problem found wins."""
    keys = F.json_object_keys(text)
    opening_brackets = F.length(text) - F.length(F.regexp_replace(text, r"[\[{]", ""))
    return F.coalesce(
        F.when(value.isNull(), F.lit("null value (tombstone)")),
        F.when(~F.is_valid_utf8(text), F.lit("value is not valid UTF-8")),
        F.when(keys.isNull() & (opening_brackets > MAX_JSON_DEPTH),
               F.lit(f"JSON nested too deeply to parse (over {MAX_JSON_DEPTH} levels)")),
        F.when(keys.isNull(), F.lit("malformed JSON (not a JSON object)")),
        *_field_errors(pipeline.columns, text, parsed),
        *_extra_fields(pipeline, keys),
        F.when(parsed[CORRUPT_COLUMN].isNotNull(), F.lit("value does not match the declared schema")),
    )


def to_staging_rows(records: DataFrame, pipeline: PipelineConfig, batch_id: int, attempt: int) -> DataFrame:
    """Kafka source rows -> the staging table's layout: decoded columns, or raw bytes plus the error."""
    text = F.col("value").cast("string")
    decoded = records.select(
        "*",
        F.from_json(
            text, value_schema(pipeline), {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": CORRUPT_COLUMN}
        ).alias("parsed"),
    )
    decoded = decoded.withColumn("error", dead_letter_reason(pipeline, F.col("value"), text, F.col("parsed")))
    good = F.col("error").isNull()
    return decoded.select(
        F.lit(batch_id).cast("long").alias("batch_id"),
        F.lit(attempt).cast("int").alias("attempt"),
        F.col("topic").alias("kafka_topic"),
        F.col("partition").alias("kafka_partition"),
        F.col("offset").alias("kafka_offset"),
        F.col("timestamp").alias("kafka_timestamp"),
        F.when(~good, F.col("key")).alias("kafka_key"),
        F.when(~good, F.col("value")).alias("kafka_value"),
        F.col("error"),
        *[F.when(good, F.col("parsed")[c.name]).alias(c.name) for c in pipeline.columns],
    )
