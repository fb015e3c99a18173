"""Spark-side decoding of Kafka records into the declared columns, or a dead-letter reason per record.

Lean by design: every record pays for one JSON parse and a few cheap checks (`_looks_good`). Only the
records that fail them get their exact reason worked out (`_reason`), which parses them again; the
reason is the first problem found, in a fixed order, whichever path a record took.
"""

from __future__ import annotations

from datetime import UTC, datetime

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from kafka_ledger.config.pipeline import EPOCH_MICROS_PER_UNIT, ColumnSpec, PipelineConfig
from kafka_ledger.ledger.sql import staging_columns
from kafka_ledger.model.columns import TOMBSTONE

SPARK_TYPES: dict[str, T.DataType] = {
    "string": T.StringType(),
    "long": T.LongType(),
    "int": T.IntegerType(),
    "double": T.DoubleType(),
    "boolean": T.BooleanType(),
    # Parsed as the JSON token's text: _Timestamp reads it as ISO-8601 or as an epoch number.
    "timestamp": T.StringType(),
}

CORRUPT_COLUMN = "_corrupt_record"
# Jackson, Spark's JSON parser, refuses documents nested deeper than this.
MAX_JSON_DEPTH = 1000

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def value_schema(pipeline: PipelineConfig) -> T.StructType:
    """The JSON value's schema, plus the column Spark fills with records it could not parse."""
    fields = [T.StructField(c.name, SPARK_TYPES[c.type]) for c in pipeline.columns]
    return T.StructType(fields + [T.StructField(CORRUPT_COLUMN, T.StringType())])


class _Timestamp:
    """A timestamp column read from its JSON token's text: the value, and why it cannot be published (or NULL).

    Text whose fifth character is "-" (a year, then a dash) is read as ISO-8601; anything else as a number,
    quoted or not, in the column's epoch unit. Either way the result must lie in the column's years.
    `parsed_text` and `parsed_number` are the text parsed both ways (`parses`), computed beforehand.
    """

    def __init__(self, column: ColumnSpec, raw: Column, parsed_text: Column, parsed_number: Column):
        formats = column.timestamp_formats
        declared = ", ".join(formats)
        first, last = column.timestamp_years
        years = f"{first}-{last}"
        # The accepted range in epoch microseconds: [first year's start, the year after last's start).
        micros_range = [int((datetime(year, 1, 1, tzinfo=UTC) - _EPOCH).total_seconds()) * 1_000_000
                        for year in (first, last + 1)]
        invalid = F.lit(f"field '{column.name}' is not a valid timestamp")
        iso_like = self.iso_like(raw)

        text = parsed_text
        if "iso8601" in formats:
            # Compared as epoch microseconds: a datetime literal would ask the session for its settings.
            text_problem = F.when(text.isNull(), invalid).when(
                (F.unix_micros(text) < F.lit(micros_range[0])) | (F.unix_micros(text) >= F.lit(micros_range[1])),
                F.lit(f"field '{column.name}' is not a valid timestamp (a date outside {years})"),
            )
        else:
            text_problem = F.when(text.isNull(), invalid).otherwise(
                F.lit(f"field '{column.name}' is not a valid timestamp (ISO-8601 text; declared formats: {declared})"))
            text = F.lit(None).cast("timestamp")

        number = parsed_number
        unit = column.epoch_unit
        if unit is not None:
            per_unit = EPOCH_MICROS_PER_UNIT[unit]
            # Compared in the declared unit first, so that scaling to microseconds cannot overflow.
            in_range = (number >= F.lit(micros_range[0] // per_unit)) & (number < F.lit(micros_range[1] // per_unit))
            from_number = F.when(in_range, F.timestamp_micros(F.round(F.try_multiply(number, F.lit(per_unit)), 0)
                                                              .cast("long")))
            number_problem = F.when(number.isNull(), invalid).when(
                ~in_range,
                F.lit(f"field '{column.name}' is not a valid timestamp (a number outside {years} read as {unit})"),
            )
        else:
            from_number = F.lit(None).cast("timestamp")
            number_problem = F.when(number.isNull(), invalid).otherwise(
                F.lit(f"field '{column.name}' is not a valid timestamp (a number; declared formats: {declared})"))

        # from_json gives the JSON null as NULL, like a missing field: the required check deals with both.
        self.problem = F.when(raw.isNotNull(), F.when(iso_like, text_problem).otherwise(number_problem))
        self.value = F.when(iso_like, text).otherwise(from_number)

    @staticmethod
    def iso_like(raw: Column) -> Column:
        return F.substring(raw, 5, 1) == F.lit("-")

    @classmethod
    def parses(cls, raw: Column) -> tuple[Column, Column]:
        """The token's text parsed as an ISO-8601 timestamp (when it looks like one) and as a number (else).

        Computed once per record in a projection of their own (decode_records): the checks and the value refer
        to each several times, and Spark would otherwise parse the text again for every reference (measured:
        about a tenth of W1's Spark CPU time)."""
        return (F.when(cls.iso_like(raw), raw.try_cast("timestamp")),
                F.when(~cls.iso_like(raw), raw.try_cast("decimal(38,9)")))


class _Decoder:
    """The expressions that decode one pipeline's records; `parsed` is the value parsed once with from_json."""

    def __init__(self, pipeline: PipelineConfig, value: Column, text: Column, parsed: Column):
        self.pipeline, self.value, self.text, self.parsed = pipeline, value, text, parsed
        self.timestamps = {c.name: _Timestamp(c, parsed[c.name], F.col(_parsed_text_column(c)),
                                              F.col(_parsed_number_column(c)))
                           for c in pipeline.columns if c.type == "timestamp"}

    def column_value(self, column: ColumnSpec) -> Column:
        if column.type == "timestamp":
            return self.timestamps[column.name].value
        return self.parsed[column.name]

    def _extra_keys(self, keys: Column) -> Column:
        return F.array_except(keys, F.array(*[F.lit(c.name) for c in self.pipeline.columns]))

    def looks_good(self) -> Column:
        """Cheap checks that, passed, prove the record publishable: `reason` would be NULL for it."""
        checks = [
            self.value.isNotNull(),
            F.is_valid_utf8(self.value),
            # A document from_json parsed in full, with every present field of its declared type, is a JSON
            # object whose declared fields are all valid.
            self.parsed.isNotNull(),
            self.parsed[CORRUPT_COLUMN].isNull(),
        ]
        for c in self.pipeline.columns:
            if c.type == "string":
                # What looks like JSON text may be an object or array turned into text: only `reason` tells.
                text = self.parsed[c.name]
                checks.append(F.coalesce(~(text.startswith("{") | text.startswith("[") | text.contains("\x00")),
                                         F.lit(True)))
            elif c.type == "timestamp":
                checks.append(self.timestamps[c.name].problem.isNull())
            if c.required:
                checks.append(self.column_value(c).isNotNull())
        if self.pipeline.extra_fields == "dead_letter":
            checks.append(F.size(self._extra_keys(F.json_object_keys(self.text))) == 0)
        good = checks[0]
        for check in checks[1:]:
            good = good & check
        return good

    def _field_errors(self) -> list[Column]:
        errors = []
        variant = F.try_parse_json(self.text)
        for c in self.pipeline.columns:
            if c.type == "timestamp":
                errors.append(self.timestamps[c.name].problem)
                continue
            present = F.get_json_object(self.text, f"$.{c.name}").isNotNull()
            parsed = self.parsed[c.name]
            errors.append(F.when(present & parsed.isNull(), F.lit(f"field '{c.name}' is not a valid {c.type}")))
            if c.type == "string":
                # from_json turns an object or array into its JSON text for a string column: refuse that.
                kind = F.schema_of_variant(F.variant_get(variant, f"$.{c.name}", "variant"))
                looks_nested = parsed.startswith("{") | parsed.startswith("[")
                errors.append(F.when(looks_nested, F.when(kind.startswith("OBJECT") | kind.startswith("ARRAY"),
                                     F.lit(f"field '{c.name}' is not a valid string (a JSON object or array)"))))
                # Postgres text cannot hold the NUL character (JSON "\u0000").
                errors.append(F.when(parsed.contains("\x00"), F.lit(
                    f"field '{c.name}' contains a NUL character, which Postgres text cannot store")))
        for c in self.pipeline.columns:
            if c.required:
                errors.append(F.when(self.column_value(c).isNull(),
                                     F.lit(f"required field '{c.name}' is missing or null")))
        return errors

    def _extra_fields(self, keys: Column) -> list[Column]:
        if self.pipeline.extra_fields != "dead_letter":
            return []
        extra = self._extra_keys(keys)
        reason = F.concat(F.lit("unexpected field(s): "), F.array_join(F.array_sort(extra), ", "))
        return [F.when(F.size(extra) > 0, reason)]

    def reason(self) -> Column:
        """Why a record cannot be published (NULL when it can), first problem found wins."""
        keys = F.json_object_keys(self.text)
        opening_brackets = F.length(self.text) - F.length(F.regexp_replace(self.text, r"[\[{]", ""))
        return F.coalesce(
            F.when(self.value.isNull(), F.lit("null value (tombstone)")),
            F.when(~F.is_valid_utf8(self.text), F.lit("value is not valid UTF-8")),
            F.when(keys.isNull() & (opening_brackets > MAX_JSON_DEPTH),
                   F.lit(f"JSON nested too deeply to parse (over {MAX_JSON_DEPTH} levels)")),
            F.when(keys.isNull(), F.lit("malformed JSON (not a JSON object)")),
            *self._field_errors(),
            *self._extra_fields(keys),
            F.when(self.parsed[CORRUPT_COLUMN].isNotNull(), F.lit("value does not match the declared schema")),
        )


class _TombstoneKey:
    """An entity table's tombstone (write: upsert): a record with a null value deletes the entity its Kafka key names.

    The key is a JSON object holding the key columns (as Kafka Connect's JSON converter and Debezium write keys)
    or, for a single key column, that column's value as text. `values` are the key columns' values (NULL unless
    the record is a tombstone), `problem` why a tombstone names no entity (NULL when it does).
    """

    def __init__(self, pipeline: PipelineConfig, key: Column, value: Column):
        text = key.cast("string")
        key_columns = pipeline.key_columns
        schema = T.StructType([T.StructField(c.name, SPARK_TYPES[c.type]) for c in key_columns])
        is_object = F.ltrim(text).startswith("{")
        parsed = F.from_json(F.when(is_object, text), schema)
        single = key_columns[0] if len(key_columns) == 1 else None
        tombstone = value.isNull()
        self.values = {
            c.name: F.when(tombstone, F.when(is_object, parsed[c.name]).otherwise(
                (text if c.type == "string" else F.trim(text).try_cast(SPARK_TYPES[c.type])) if c is single
                else F.lit(None).cast(SPARK_TYPES[c.type])))
            for c in key_columns
        }
        names = ", ".join(pipeline.key)
        forms = f"a JSON object with {names}" + (f" or the {single.name} itself" if single else "")
        missing = F.lit(False)
        for column_value in self.values.values():
            missing = missing | column_value.isNull()
        self.problem = F.when(tombstone, F.when(key.isNull(), F.lit("tombstone (null value) without a Kafka key"))
                              .when(~F.is_valid_utf8(text), F.lit("tombstone's Kafka key is not valid UTF-8"))
                              .when(missing, F.lit(f"tombstone's Kafka key does not name its entity ({forms})")))


def _parsed_text_column(column: ColumnSpec) -> str:
    # Beside topic, partition, ..., parsed in decode_records' frame, never in its result: no declared column's name.
    return f"parsed timestamp text of {column.name}"


def _parsed_number_column(column: ColumnSpec) -> str:
    return f"parsed timestamp number of {column.name}"


def decode_records(records: DataFrame, pipeline: PipelineConfig, *, lean: bool = True) -> DataFrame:
    """Kafka source rows -> Kafka coordinates, raw key and value, `error` (NULL: publishable) and the columns (and,
    for an entity table, whether the record is a tombstone: `_TombstoneKey`).

    With `lean` (always, outside tests) the exact reason is worked out only for records that fail the cheap
    checks; without it, for every record (the reference the lean path is tested against).
    """
    text = F.col("value").cast("string")
    parsed = F.col("parsed")
    decoded = records.select(
        "topic", "partition", "offset", "timestamp", "key", "value",
        F.from_json(
            text, value_schema(pipeline), {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": CORRUPT_COLUMN}
        ).alias("parsed"),
    )
    timestamps = [c for c in pipeline.columns if c.type == "timestamp"]
    if timestamps:
        decoded = decoded.select("*", *[
            parse.alias(name) for c in timestamps
            for parse, name in zip(_Timestamp.parses(parsed[c.name]),
                                   (_parsed_text_column(c), _parsed_number_column(c)), strict=True)
        ])
    decoder = _Decoder(pipeline, F.col("value"), text, parsed)
    error = F.when(~decoder.looks_good(), decoder.reason()) if lean else decoder.reason()
    values = {c.name: decoder.column_value(c) for c in pipeline.columns}
    entity = []
    if pipeline.is_entity_table:
        tombstone = _TombstoneKey(pipeline, F.col("key"), F.col("value"))
        is_tombstone = F.col("value").isNull()
        error = F.when(is_tombstone, tombstone.problem).otherwise(error)
        values = {name: F.when(is_tombstone, tombstone.values.get(name, F.lit(None))).otherwise(value)
                  for name, value in values.items()}
        entity = [is_tombstone.alias(TOMBSTONE.name)]
    return decoded.select(
        F.col("topic").alias("kafka_topic"),
        F.col("partition").alias("kafka_partition"),
        F.col("offset").alias("kafka_offset"),
        F.col("timestamp").alias("kafka_timestamp"),
        F.col("key").alias("kafka_key"),
        F.col("value").alias("kafka_value"),
        error.alias("error"),
        *[value.alias(name) for name, value in values.items()],
        *entity,
    )


def to_staging_rows(records: DataFrame, pipeline: PipelineConfig, batch_id: int, attempt: int) -> DataFrame:
    """Kafka source rows -> the staging table's layout (sql.staging_columns): decoded columns, or raw bytes plus the
    error."""
    decoded = decode_records(records, pipeline)
    good = F.col("error").isNull()
    values = {
        "batch_id": F.lit(batch_id).cast("long"),
        "attempt": F.lit(attempt).cast("int"),
        # The raw record is kept for dead letters only; a decoded row keeps its columns instead.
        "kafka_key": F.when(~good, F.col("kafka_key")),
        "kafka_value": F.when(~good, F.col("kafka_value")),
        **{c.name: F.when(good, F.col(c.name)) for c in pipeline.columns},
    }
    return decoded.select(*[values.get(name, F.col(name)).alias(name) for name in staging_columns(pipeline)])
