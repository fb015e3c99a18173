"""Pipeline declarations: the YAML file that lists every pipeline, validated on load."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    ValidationError,
    WithJsonSchema,
    field_validator,
    model_validator,
)

from kafka_ledger.config.settings import SparkRuntime, deployment_settings
from kafka_ledger.formats import known
from kafka_ledger.formats.known import FORMATS, format_named
from kafka_ledger.model import debezium
from kafka_ledger.model.columns import RESERVED_COLUMNS
from kafka_ledger.model.kinds import (
    DECLARABLE,
    DEFAULT_TIMESTAMP_FORMATS,
    DEFAULT_YEARS,
    EPOCH_MICROS_PER_UNIT,
    ColumnKind,
    DateKind,
    JsonbKind,
    TimestampFormat,
    TimestampKind,
    parse_kind,
)
from kafka_ledger.model.refusals import Refusal

# Names end up in SQL identifiers, DAG ids and pool names: keep them to a safe, portable alphabet.
IDENTIFIER = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
TOPIC_NAME = re.compile(r"^[A-Za-z0-9._-]{1,249}$")

# Where a column's value comes from: the record's value (the default), its Kafka key, or one of its headers.
SOURCE = re.compile(r"^(?:value|key|header:(?P<header>[^\x00]+))$")
# A path inside a JSON document: object keys separated by dots.
# (No quote, bracket or backslash in a key: Spark's JSON paths could not name it.)
PATH = re.compile(r"^[^.'\"\[\]\\\x00-\x1f]+(?:\.[^.'\"\[\]\\\x00-\x1f]+)*$")


def _identifier(value: str) -> str:
    if not IDENTIFIER.match(value):
        raise ValueError(f"{value!r} must match {IDENTIFIER.pattern} (lower-case letters, digits, _)")
    return value


# A name that ends up in SQL identifiers, DAG ids or an Iceberg catalog's table names.
Identifier = Annotated[str, AfterValidator(_identifier)]

# Every pipeline's DAG id is this prefix and the pipeline's name.
DAG_ID_PREFIX = "kafka_ledger__"
# A carrier's DAG (CarrierDeclaration): not a pipeline's, so not under DAG_ID_PREFIX.
CARRIER_DAG_ID_PREFIX = "kafka_ledger_carrier__"
# A pipeline unknown by name: this many of the declared names in the error (hundreds would fill the log line).
NAMES_IN_ERRORS = 20


class ConfigError(ValueError, Refusal):
    """The pipelines file is missing, unreadable or does not validate."""


class ColumnsUnknownError(RuntimeError, Refusal):
    """A pipeline that takes its columns from its reader schema has none recorded: its first plan records them
    (batch/columns.py)."""

    def __init__(self, pipeline: str):
        super().__init__(f"pipeline {pipeline!r} takes its columns from its reader schema and none are recorded yet: "
                         "its first plan takes them (a batch planned while it still declared `columns:` is "
                         "finished by declaring them again)")


def _declared_kind(value: object) -> object:
    return parse_kind(value) if isinstance(value, str) else value


# A column's kind as declared (`long`, `decimal(12,2)`): parsed into its model.kinds class, written back as its text.
Kind = Annotated[ColumnKind, BeforeValidator(_declared_kind), PlainSerializer(str, return_type=str),
                 WithJsonSchema({"type": "string"})]


class ColumnSpec(BaseModel):
    """One declared field of the record (its value, Kafka key or a header), stored as one column of the output."""

    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True, frozen=True)

    name: str = Field(description="the column's name (and, unless `path` says otherwise, the field's in the value): "
                                  "lower-case letters, digits and _; not one of the columns the ledger adds "
                                  "(`kafka_topic`, `kafka_partition`, `kafka_offset`, `kafka_timestamp`, `batch_id`, "
                                  "...)")
    type: Kind = Field(description="the kind of value, one of the [column types](#column-types) (e.g. `string`, "
                                   "`long`, `timestamp`, `decimal(12,2)`); a value that does not fit is a dead letter")
    source: str = Field(default="value", description="where the field is: `value` (the record's value), `key` (its "
                                                     "Kafka key) or `header:<name>` (one of its headers, the first of "
                                                     "that name)")
    path: str | None = Field(default=None, description="where in its source the field lives, object keys separated "
                                                       "by dots (`user.address.city`); none: the column's name in the "
                                                       "value, and the whole key or header (its text) for those "
                                                       "sources")
    required: bool = Field(default=False, description="a record whose value lacks the field (or holds null) is a "
                                                      "dead letter (`required field '<path>' is missing or null`)")
    description: str = Field(default="", description="what the column holds, for the people reading the file")
    formats: list[TimestampFormat] | None = Field(
        default=None,
        description="timestamp columns only: the forms the value may take, at most one epoch unit ([Timestamps]"
                    f"(#timestamps)); none: `[{', '.join(DEFAULT_TIMESTAMP_FORMATS)}]`")
    years: tuple[int, int] | None = Field(
        default=None,
        description="timestamp and date columns only: `[first, last]`, the years (inclusive) a value may fall in, "
                    f"else it is a dead letter; none: `[{DEFAULT_YEARS[0]}, {DEFAULT_YEARS[1]}]`")

    @field_validator("name")
    @classmethod
    def _name_is_identifier(cls, name: str) -> str:
        if not IDENTIFIER.match(name):
            raise ValueError(f"column name {name!r} must match {IDENTIFIER.pattern}")
        if name in RESERVED_COLUMNS:
            raise ValueError(f"column name {name!r} is reserved (the ledger adds it to every row)")
        return name

    @field_validator("source")
    @classmethod
    def _source_is_known(cls, source: str) -> str:
        if not SOURCE.match(source):
            raise ValueError(f"source {source!r} must be value, key or header:<name>")
        return source

    @field_validator("path")
    @classmethod
    def _path_is_dotted(cls, path: str | None) -> str | None:
        if path is not None and not PATH.match(path):
            raise ValueError(f"path {path!r} must be object keys separated by dots, none of them empty (and none "
                             "holding a quote, bracket or backslash)")
        return path

    @model_validator(mode="after")
    def _options_fit_the_type(self) -> ColumnSpec:
        if self.years is not None:
            if not isinstance(self.type, TimestampKind | DateKind):
                raise ValueError(f"column {self.name!r}: years apply to timestamp and date columns only")
            if not 1 <= self.years[0] <= self.years[1] <= 9998:
                raise ValueError(f"column {self.name!r}: years must be [first, last] with 1 <= first <= last <= 9998")
        if self.formats is None:
            return self
        if not isinstance(self.type, TimestampKind):
            raise ValueError(f"column {self.name!r}: formats apply to timestamp columns only")
        if not self.formats or len(set(self.formats)) != len(self.formats):
            raise ValueError(f"column {self.name!r}: formats must list each accepted form once")
        units = [f for f in self.formats if f in EPOCH_MICROS_PER_UNIT]
        if len(units) > 1:
            raise ValueError(f"column {self.name!r}: declare one epoch unit, not {', '.join(units)} (a number's "
                             "unit cannot be told from the number)")
        return self

    @property
    def source_kind(self) -> str:
        """`value`, `key` or `header`."""
        return self.source.partition(":")[0]

    @property
    def header(self) -> str | None:
        """The header a `header:<name>` column reads."""
        return self.source.partition(":")[2] or None

    @property
    def field_path(self) -> tuple[str, ...]:
        """The object keys leading to the field in its source's document; empty: the whole source, as text."""
        if self.path is not None:
            return tuple(self.path.split("."))
        return (self.name,) if self.source_kind == "value" else ()

    @property
    def label(self) -> str:
        """The field as dead-letter reasons name it: `field 'user.id'`, `field 'id' of the Kafka key`, ..."""
        where = {"value": "", "key": " of the Kafka key", "header": f" of header '{self.header}'"}[self.source_kind]
        if self.field_path:
            return f"field '{'.'.join(self.field_path)}'{where}"
        return "the Kafka key" if self.source_kind == "key" else f"header '{self.header}'"

    @property
    def required_reason(self) -> str:
        """The dead-letter reason of a required column whose field is missing or null."""
        if self.source_kind == "value":
            return f"required field '{'.'.join(self.field_path)}' is missing or null"
        return f"required column '{self.name}': {self.label} is missing or null"

    @property
    def timestamp_formats(self) -> tuple[TimestampFormat, ...]:
        return tuple(self.formats) if self.formats else DEFAULT_TIMESTAMP_FORMATS

    @property
    def value_years(self) -> tuple[int, int]:
        """The years a timestamp or date value may fall in."""
        return self.years or DEFAULT_YEARS

    @property
    def epoch_unit(self) -> str | None:
        """The epoch unit a number in this timestamp column is read in, or None if numbers are refused."""
        return next((f for f in self.timestamp_formats if f in EPOCH_MICROS_PER_UNIT), None)


class DebeziumSettings(BaseModel):
    """The settings of the Debezium connector whose change events a pipeline reads (`value.debezium`), in the
    connector's own names: they decide how its events write a row's values. Declare those set on the connector;
    Debezium's defaults need nothing."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    decimal_handling_mode: Literal["precise", "string", "double"] = Field(
        default="precise", alias="decimal.handling.mode",
        description="how a numeric is written: `precise` (Debezium's default: its unscaled bytes, the scale in the "
                    "schema: exact, in JSON with the JsonConverter's schemas), `string` (its digits as text: exact), "
                    "`double` (a binary float: a `decimal` column refuses it)")
    time_precision_mode: Literal["adaptive", "adaptive_time_microseconds", "connect"] = Field(
        default="adaptive", alias="time.precision.mode",
        description="how a time or a timestamp without time zone is written: `adaptive` (Debezium's default: "
                    "milliseconds up to precision 3, else microseconds), `adaptive_time_microseconds` (times in "
                    "microseconds), `connect` (milliseconds)")
    binary_handling_mode: Literal["bytes", "base64", "base64-url-safe", "hex"] = Field(
        default="bytes", alias="binary.handling.mode",
        description="how a bytea is written: `bytes` (Debezium's default; base64 in JSON), `base64`, "
                    "`base64-url-safe`, `hex`")
    interval_handling_mode: Literal["numeric", "string"] = Field(
        default="numeric", alias="interval.handling.mode",
        description="how an interval is written: `numeric` (Debezium's default: microseconds, a month counted as "
                    "30.4375 days: not exact, an `interval` column refuses it), `string` (ISO-8601 text: exact)")
    value_converter_schemas_enable: bool = Field(
        default=True, alias="value.converter.schemas.enable",
        description="whether the connector's JsonConverter writes each value with its schema (Kafka Connect's "
                    "default): a precise numeric's scale is there only")
    unavailable_value_placeholder: str = Field(
        default=debezium.UNAVAILABLE_PLACEHOLDER, min_length=1, alias="unavailable.value.placeholder",
        description="what an event holds in place of a value Postgres did not log (an unchanged TOASTed value); such "
                    "a column keeps the entity's value, never the placeholder ([Unchanged TOASTed values]"
                    "(#unchanged-toasted-values))")


class ValueSpec(BaseModel):
    """How the record's value (and its key and headers, where columns read them) is encoded on the wire."""

    model_config = ConfigDict(extra="forbid")

    format: str = Field(
        default="json", description="; ".join(f"`{fmt.name}`: {fmt.description}" for fmt in FORMATS.values()))
    framing: Literal["none", "confluent"] = Field(
        default="none",
        description="format `json`: `confluent` when every value is framed as Confluent's serializers write it (its "
                    "JSON Schema serializer: a magic byte 0 and the 4-byte schema id, then the document); the frame "
                    "is checked and stripped, and a value without it is a dead letter. `none`: the value is the "
                    "document")
    subject: str | None = Field(
        default=None,
        description="a registry format (`avro`, `protobuf`): the subject whose newest version is the reader schema "
                    "when a batch is planned, and whose versions are the writer schemas its values may carry; default "
                    "`<topic>-value` (Confluent's TopicNameStrategy)")
    message: str | None = Field(
        default=None,
        description="format `protobuf`: the full name of the message the values are (`shop.Order`; a value of "
                    "another message is a dead letter); default the reader schema's first message")
    key_format: Literal["protobuf"] | None = Field(
        default=None,
        description="format `protobuf`: `protobuf` when the records' Kafka keys are Protobuf messages in Confluent's "
                    "wire format too (its serializer's keys): a key column's `path` names a field of the key's "
                    "message, decoded with a reader schema pinned per batch as the values' are; none: a key column "
                    "reads the whole key ([Protobuf keys](#protobuf-keys))")
    key_subject: str | None = Field(
        default=None,
        description="key_format `protobuf`: the subject of the keys' schemas; default `<topic>-key` (Confluent's "
                    "TopicNameStrategy)")
    key_message: str | None = Field(
        default=None,
        description="key_format `protobuf`: the full name of the message the keys are; default the key schema's "
                    "first message")
    envelope: Literal["none", "debezium"] = Field(
        default="none",
        description="`none`: each value is a row (or, in an entity table, the entity's newest version); `debezium`: "
                    "each value is a Debezium change event applied to an entity table (`write: upsert`): ops c, r "
                    "and u upsert its row image `after`, d deletes its entity, the Kafka tombstone that follows a "
                    "delete changes nothing; a column's `path` reads the row image unless it starts with one of the "
                    "event's own fields (`op`, `source.lsn`, `ts_ms`) ([Change events](#change-events-debezium))")
    debezium: DebeziumSettings = Field(
        default_factory=DebeziumSettings,
        description="envelope `debezium`: the settings of the connector that writes the events, in its own names "
                    "(`decimal.handling.mode`, ...), where they differ from Debezium's defaults ([Debezium's "
                    "settings](#debeziums-settings))")

    @field_validator("format")
    @classmethod
    def _format_is_known(cls, name: str) -> str:
        format_named(name)
        return name

    @model_validator(mode="after")
    def _options_of_the_format(self) -> ValueSpec:
        problems = known.value_problems(self)
        if self.envelope != "debezium" and "debezium" in self.model_fields_set:
            problems.append("debezium applies to envelope debezium")
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def given(self) -> set[str]:
        """The format's options the declaration gives (beside `format`, and the envelope's)."""
        return self.model_fields_set - {"format", "envelope", "debezium"}

    def subject_of(self, topic: str) -> str:
        """The registry subject of a topic's values (a registry format's)."""
        return self.subject or f"{topic}-value"

    def key_subject_of(self, topic: str) -> str:
        """The registry subject of a topic's keys (key_format protobuf)."""
        return self.key_subject or f"{topic}-key"


class AssignedPartition(BaseModel):
    """One partition of an explicit assignment, optionally with the offset the pipeline starts it at."""

    model_config = ConfigDict(extra="forbid")

    topic: str = Field(description="the partition's topic")
    partition: int = Field(ge=0, description="the partition's number, from 0")
    start_offset: int | None = Field(default=None, ge=0,
                                     description="the offset the pipeline starts the partition at; none: where "
                                                 "`start_position` says")


DeliveryMode = Literal["exactly_once", "at_least_once", "latest_only"]
WriteMode = Literal["append", "upsert"]

# An Iceberg partition transform of one output column: the column, or years/months/days/hours(column),
# bucket(N, column), truncate(W, column).
PARTITION_TRANSFORM = re.compile(
    r"^(?:(?P<column>[a-z_][a-z0-9_]*)|(?:years|months|days|hours)\((?P<time_column>[a-z_][a-z0-9_]*)\)"
    r"|(?:bucket|truncate)\((?P<width>[1-9][0-9]*), *(?P<sized_column>[a-z_][a-z0-9_]*)\))$")


class PostgresSinkSpec(BaseModel):
    """Rows go into the pipeline's `output_table` in the ledger's database, in the transaction that moves the
    offsets (the default)."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["postgres"] = Field(description="`postgres`")


def _cron_or_preset(schedule: str | None) -> str | None:
    from croniter import croniter

    if schedule is not None and not croniter.is_valid(schedule):
        raise ValueError(f"schedule {schedule!r} is not a cron expression or preset such as @hourly (or null)")
    return schedule


class LakeMaintenanceSpec(BaseModel):
    """The upkeep of an Iceberg sink's table: small files compacted, old snapshots expired (lake_maintenance.py)."""

    model_config = ConfigDict(extra="forbid")

    schedule: str | None = Field(
        default="@daily",
        description="when the table's maintenance DAG (`kafka_ledger__<pipeline>__maintenance`) runs: a cron "
                    "expression or preset (UTC); `null`: only when triggered, or by `kafka-ledger maintain`")
    compact: bool = Field(
        default=True,
        description="rewrite small data files into files of the table's target size (Iceberg's "
                    "`rewrite_data_files`, bin-packing); a file group is rewritten once it has `min_input_files`")
    min_input_files: int = Field(default=5, ge=2, description="the fewest files a compaction rewrites together")
    expire_after_hours: int = Field(
        default=168, ge=0,
        description="snapshots older than this expire and the files only they referenced are deleted; never the "
                    "snapshot of a batch the ledger has not finished, nor any newer one")
    retain_last: int = Field(default=10, ge=1, description="the newest snapshots kept whatever their age")

    _schedule_is_cron = field_validator("schedule")(_cron_or_preset)


class IcebergSinkSpec(BaseModel):
    """Rows go into an Iceberg table through Spark, one snapshot per batch (docs/deployment.md, The lake)."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["iceberg"] = Field(description="`iceberg`")
    catalog: Identifier = Field(default="lake", description="the Spark catalog holding the table, declared in Spark's "
                                                     "`spark-defaults.conf` (`spark.sql.catalog.<name>.*`); the local "
                                                     "stack declares `lake`")
    namespace: Identifier = Field(description="the table's namespace (created if missing)")
    table: Identifier = Field(description="the table, created if missing with the columns a postgres sink's table has "
                                   "(the declared ones, the `kafka_*` coordinates and `batch_id`); one pipeline per "
                                   "table")
    partition_by: list[str] = Field(
        default_factory=list,
        description="the table's partition spec: Iceberg transforms of its columns, e.g. `days(event_time)`, "
                    "`kafka_partition`, `bucket(16, user_id)`; none: unpartitioned, and each batch writes one file "
                    "per Kafka partition range (no shuffle) ([The lake](deployment.md#the-lake-iceberg))")
    target_file_size_mb: int | None = Field(
        default=None, ge=1,
        description="the table's `write.target-file-size-bytes` in MiB (Iceberg's default: 512)")
    properties: dict[str, str] = Field(
        default_factory=dict,
        description="more table properties, set when the table is created, e.g. "
                    "`write.parquet.compression-codec: zstd`")
    maintenance: LakeMaintenanceSpec = Field(
        default_factory=LakeMaintenanceSpec,
        description="compaction and snapshot expiry on a schedule ([fields below](#lake-maintenance))")

    @field_validator("partition_by")
    @classmethod
    def _transforms(cls, transforms: list[str]) -> list[str]:
        for transform in transforms:
            if not PARTITION_TRANSFORM.match(transform):
                raise ValueError(f"partition_by {transform!r} is not a column or an Iceberg transform of one "
                                 "(years/months/days/hours(c), bucket(N, c), truncate(W, c))")
        return transforms

    @property
    def partition_columns(self) -> list[str]:
        """The columns the partition spec transforms."""
        return [next(c for c in PARTITION_TRANSFORM.match(t).group("column", "time_column", "sized_column") if c)
                for t in self.partition_by]

    @property
    def qualified_table(self) -> str:
        return f"{self.catalog}.{self.namespace}.{self.table}"


SinkSpec = Annotated[PostgresSinkSpec | IcebergSinkSpec, Field(discriminator="type")]


class ScheduleSpec(BaseModel):
    """Runs start on the pipeline's `schedule`, or when someone triggers them (the default)."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["schedule"] = Field(description="`schedule`")


class DoorbellSpec(BaseModel):
    """Runs also start when new data waits: Airflow's triggerer compares the read_committed end offsets of the
    pipeline's partitions with the ledger's positions and rings (doorbell.py). Read-only: no consumer group, no
    committed offset, nothing written."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["doorbell"] = Field(description="`doorbell`")
    min_backlog: int = Field(
        default=1, ge=1,
        description="the offsets that must wait, over all the pipeline's partitions, before the doorbell rings")
    poll_seconds: float = Field(
        default=5.0, ge=0.5, le=3600,
        description="how often the triggerer looks, on the clock's ticks: the doorbells that poll at the same tick "
                    "share one ledger transaction and one Kafka offsets request (and their subscriptions' partitions "
                    "again once a minute)")
    ring_again_seconds: float = Field(
        default=300.0, ge=10,
        description="while data waits and no batch has committed since the doorbell rang, it rings again after "
                    "this long (a lost event, a run that failed): at most one run per ring")
    carry_seconds: float = Field(
        default=300.0, ge=0, le=86_400,
        description="a run the doorbell started keeps planning, reading and committing the next batch, at most one "
                    "every `poll_seconds`, while data waits, for up to this long (batch/carry.py): Airflow's cost of "
                    "a run is paid once for many batches; `0`: one batch a run")
    carrier: Identifier | None = Field(
        default=None,
        description="carry this pipeline's batches with the other pipelines naming the same carrier: one DAG, "
                    "`kafka_ledger_carrier__<carrier>`, whose doorbell watches them all and whose one task plans, "
                    "reads and commits their batches together, each pipeline in its own transaction "
                    "([below](#carriers)); the pipeline's own DAG keeps its manual runs, replays and backfills, "
                    "and its own doorbell stays off. For many pipelines with little data each: a sink `postgres`, "
                    "the `connect` runtime")


TriggerSpec = Annotated[ScheduleSpec | DoorbellSpec, Field(discriminator="type")]


class PipelineConfig(BaseModel):
    """One pipeline: Kafka topics in, one Postgres table out."""

    model_config = ConfigDict(extra="forbid")

    name: Identifier = Field(description="the pipeline's name, its entry's key in the file: lower-case letters, digits "
                                  "and _, at most 48 characters; its DAG is `kafka_ledger__<name>`")
    description: str = Field(default="", description="the DAG's description in Airflow (without one: `Exactly-once "
                                                     "ingest of <subscription>`)")
    topics: list[str] = Field(
        default_factory=list,
        description="Kafka topics to read, each of which must exist. A pipeline declares exactly one subscription: "
                    "`topics`, `topic_pattern` or `assignment` ([below](#subscriptions))")
    topic_pattern: str | None = Field(
        default=None,
        description="a regular expression matching whole topic names (internal `__` topics never); topics that "
                    "come to match it are read from the next plan on")
    assignment: list[AssignedPartition] | None = Field(
        default=None,
        description="explicit partitions: `topic`, `partition` and optionally `start_offset` each ([below]"
                    "(#subscriptions))")
    delivery_mode: DeliveryMode = Field(
        default="exactly_once",
        description="`exactly_once`, `at_least_once` or `latest_only` ([below](#delivery-modes))")
    on_data_loss: Literal["fail", "skip"] = Field(
        default="fail",
        description="when retention deleted offsets the pipeline never read: `fail` the plan, naming the lost "
                    "ranges (nothing moves until someone resets the positions deliberately), or `skip` them: the "
                    "batch starts at the log start and the lost range is recorded as `skipped` in the ledger, "
                    "logged as a warning and counted by `kafka-ledger status`")
    retention_warning_fraction: float = Field(
        default=0.25, gt=0, le=1,
        description="warn when a partition's oldest unread offset has less than this share of its topic's retention "
                    "window left before retention may delete it: the plan task logs a warning and the "
                    "`check_retention_headroom` task fails ([retention headroom](operating.md#retention-headroom))")
    value: ValueSpec = Field(
        default_factory=ValueSpec,
        description="how records are encoded: `format: json` (the default; `value: json` for short), and `framing: "
                    "confluent` for values framed by Confluent's JSON Schema serializer (default `none`) ([Columns]"
                    "(#columns))")
    extra_fields: Literal["ignore", "dead_letter"] = Field(
        default="ignore",
        description="fields of the value that no column reads (at its top level, and inside an object a declared "
                    "`path` goes through): `ignore` them, or `dead_letter` the record (reason `unexpected field(s): "
                    "...`)")
    sink: SinkSpec = Field(
        default_factory=lambda: PostgresSinkSpec(type="postgres"),
        description="where rows are published: `postgres` (into `output_table`, in the transaction that moves the "
                    "offsets) or an Iceberg table (`type: iceberg` and its fields, [below](#sinks))")
    output_table: Identifier | None = Field(
        default=None,
        description="sink `postgres` (required there): the published table, created if missing in `output_schema`; "
                    "it gets the declared columns plus `kafka_topic`, `kafka_partition`, `kafka_offset`, "
                    "`kafka_timestamp`, `batch_id`. A table made beforehand must have the `kafka_*` and `batch_id` "
                    "columns (else the plan is refused; declared columns it lacks are added by the next commit: "
                    "[Changing the columns](#changing-the-columns)) and, appending, an index leading with "
                    "`kafka_topic, kafka_partition, kafka_offset` "
                    "(else each plan warns: a rewrite would scan the table per range). One pipeline per table: an "
                    "entry whose table an entry earlier in the file writes is invalid")
    output_schema: Identifier = Field(default="public",
                                      description="sink `postgres`: the Postgres schema of `output_table`")
    write: WriteMode = Field(
        default="append",
        description="`append`: one row per record, every record kept; `upsert`: an entity table, one row per `key`, "
                    "the newest record by Kafka order, a null value (a tombstone) deleting its key ([Entity tables]"
                    "(#entity-tables)); sink `postgres` only")
    key: list[Identifier] = Field(
        default_factory=list,
        description="`write: upsert` (required there): the declared columns naming an entity, the table's primary "
                    "key; `string`, `int` or `long` columns, required in every value (a tombstone's come from its "
                    "Kafka key)")
    columns: list[ColumnSpec] | None = Field(
        default=None, min_length=1, json_schema_extra={"reference_default": "required (format `avro`: optional)"},
        description="the fields of the record, one column each ([Columns](#columns)); names may not reuse "
                    "the `kafka_*` columns. Format `avro` may leave them out: the pipeline's first plan then takes "
                    "every top-level field of its reader schema, and a later plan the fields a newer version adds "
                    "([Avro values](#avro-values))")
    max_records_per_partition: int = Field(
        default=100_000, ge=1,
        description="offsets per partition per batch: bounds one batch's memory")
    start_position: Literal["earliest", "latest"] = Field(
        default="earliest",
        description="where partitions new to the ledger start (also partitions added later): `earliest` or "
                    "`latest`")
    schedule: str | None = Field(
        default="@hourly",
        description="when scheduled runs start: a cron expression or `@hourly`/`@daily`, as an interval timetable "
                    "(`CronDataIntervalTimetable`, UTC); `null` for manual runs only. A scheduled run catches up "
                    "from the committed positions to the latest offsets (capped per partition) whatever its data "
                    "interval; only backfill runs use their data interval, which they rewrite ([Backfills]"
                    "(operating.md#backfills))")
    trigger: TriggerSpec = Field(
        default_factory=lambda: ScheduleSpec(type="schedule"),
        description="what starts runs besides people: `schedule` (the `schedule` alone) or `doorbell` (also when "
                    "new data waits in Kafka, with `min_backlog`, `poll_seconds` and `ring_again_seconds`: [fields "
                    "below](#doorbell)); the `schedule` stays beside a doorbell unless set to `null`")
    owner: str = Field(default="data-engineering", description="the tasks' owner in Airflow")
    retries: int = Field(default=2, ge=0,
                         description="retries of each task; they back off exponentially (at most 30 min)")
    retry_delay_seconds: int = Field(default=60, ge=0, description="the delay before a task's first retry")
    spark_timeout_minutes: int = Field(default=60, ge=1, description="execution timeout of the Spark task")
    spark_conf: dict[str, str] = Field(
        default_factory=dict,
        description="extra `--conf` for spark-submit, e.g. `spark.executor.memory` (runtime `submit`)")
    spark_runtime: SparkRuntime | None = Field(
        default=None,
        description="where the batch's Spark work runs: `connect`, the warm Spark Connect server, or `submit`, one "
                    "spark-submit per batch ([Spark runtimes](deployment.md#spark-runtimes)); none: the "
                    "deployment's (`$KAFKA_LEDGER_SPARK_RUNTIME`, else `submit`; the local stack sets `connect`)")
    mirror_consumer_group: str | None = Field(
        default=None, pattern=r"^[A-Za-z0-9._:-]{1,249}$",
        description="opt-in: a Kafka consumer group (e.g. `kafka-ledger.impressions`) the committed positions are "
                    "copied into after each commit, so `kafka-consumer-groups --describe`, Burrow or kafbat show "
                    "the lag ([Lag in Kafka's own tools](operating.md#lag-in-kafkas-own-tools)); the ledger stays "
                    "authoritative")

    @field_validator("name")
    @classmethod
    def _name_is_short(cls, value: str) -> str:
        # Derived identifiers (the staging index, the DAG id) add a suffix to the name; Postgres cuts at 63.
        if len(value) > 48:
            raise ValueError(f"pipeline name {value!r} is longer than 48 characters")
        return value

    @field_validator("sink", "trigger", mode="before")
    @classmethod
    def _kind_by_name(cls, value: object) -> object:
        # `sink: postgres` is short for `sink: {type: postgres}`, `trigger: doorbell` for `trigger: {type: doorbell}`.
        return {"type": value} if isinstance(value, str) else value

    @field_validator("value", mode="before")
    @classmethod
    def _format_by_name(cls, value: object) -> object:
        # `value: json` is short for `value: {format: json}`.
        return {"format": value} if isinstance(value, str) else value

    @field_validator("schedule")
    @classmethod
    def _schedule_is_cron(cls, schedule: str | None) -> str | None:
        return _cron_or_preset(schedule)

    @field_validator("topics")
    @classmethod
    def _topics_are_valid(cls, topics: list[str]) -> list[str]:
        for topic in topics:
            if not TOPIC_NAME.match(topic) or topic in (".", ".."):
                raise ValueError(f"{topic!r} is not a valid Kafka topic name")
        if len(set(topics)) != len(topics):
            raise ValueError("topics are listed more than once")
        return topics

    @field_validator("topic_pattern")
    @classmethod
    def _pattern_compiles(cls, pattern: str | None) -> str | None:
        if pattern is not None:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"topic_pattern {pattern!r} is not a valid regular expression: {exc}") from exc
        return pattern

    @model_validator(mode="after")
    def _one_subscription(self) -> PipelineConfig:
        given = [name for name, value in (("topics", self.topics), ("topic_pattern", self.topic_pattern),
                                          ("assignment", self.assignment)) if value]
        if len(given) != 1:
            raise ValueError(
                "declare exactly one of topics (a list), topic_pattern (a regex) or assignment "
                f"(topic/partition list); found {', '.join(given) or 'none'}"
            )
        if self.assignment:
            seen = set()
            for assigned in self.assignment:
                if not TOPIC_NAME.match(assigned.topic):
                    raise ValueError(f"{assigned.topic!r} is not a valid Kafka topic name")
                if (assigned.topic, assigned.partition) in seen:
                    raise ValueError(f"partition {assigned.topic}-{assigned.partition} is assigned twice")
                seen.add((assigned.topic, assigned.partition))
        return self

    @model_validator(mode="after")
    def _the_format_reads_the_declaration(self) -> PipelineConfig:
        problems = format_named(self.value.format).declaration_problems(self)
        if problems:
            raise ValueError("; ".join(problems))
        return self

    @model_validator(mode="after")
    def _change_events_change_entities(self) -> PipelineConfig:
        if self.value.envelope != "debezium":
            return self
        if self.write != "upsert":
            raise ValueError("envelope debezium applies change events to an entity table: declare write: upsert and "
                             "key (the source table's primary key columns); to append the events as they are, "
                             "leave the envelope out and read them by path (`after.id`, `op`)")
        by_name = {c.name: c for c in self.columns or []}
        of_event = [name for name in self.key if name in by_name and by_name[name].source_kind == "value"
                    and debezium.event_path(by_name[name].field_path)[0] != debezium.ROW_IMAGE]
        if of_event:
            raise ValueError(f"key column(s) {', '.join(of_event)}: a change event's entity is named by its row "
                             "image (a path inside `after`, written without `after.`), not by the event's own fields")
        return self

    @model_validator(mode="after")
    def _sink_has_its_table(self) -> PipelineConfig:
        if isinstance(self.sink, PostgresSinkSpec) and self.output_table is None:
            raise ValueError("output_table is required: the table the postgres sink publishes into")
        if isinstance(self.sink, IcebergSinkSpec):
            if self.output_table is not None:
                raise ValueError("output_table is for the postgres sink: an iceberg sink names its table in sink.table")
            declared = {c.name for c in self.columns or []} | set(RESERVED_COLUMNS)
            unknown = [c for c in self.sink.partition_columns if c not in declared]
            if unknown and self.columns is not None:
                raise ValueError(f"sink.partition_by names column(s) the table does not have: {', '.join(unknown)}")
        return self

    @model_validator(mode="after")
    def _columns_are_unique(self) -> PipelineConfig:
        if self.columns is None:
            return self
        names = [column.name for column in self.columns]
        duplicated = sorted({name for name in names if names.count(name) > 1})
        if duplicated:
            raise ValueError(f"columns declared more than once: {', '.join(duplicated)}")
        # Within one source, a field is read by one column, and a field holding declared fields is read whole only
        # as jsonb (the JSON format reads those from the document's variant, the others by their declared schema).
        fields: dict[tuple[str, tuple[str, ...]], ColumnSpec] = {}
        for column in self.columns:
            where = (column.source, column.field_path)
            if where in fields:
                raise ValueError(f"columns {fields[where].name!r} and {column.name!r} both read {column.label}")
            fields[where] = column
        for (source, path), column in fields.items():
            for depth in range(1, len(path)):
                outer = fields.get((source, path[:depth]))
                if outer is not None and not isinstance(outer.type, JsonbKind):
                    raise ValueError(f"column {outer.name!r} reads {outer.label}, which holds the field column "
                                     f"{column.name!r} reads: only a jsonb column can read a field beside the fields "
                                     "inside it")
        return self

    @model_validator(mode="after")
    def _entity_key(self) -> PipelineConfig:
        if self.write == "append":
            if self.key:
                raise ValueError("key is for write: upsert (an entity table); an append pipeline keeps every record")
            return self
        if not self.key:
            raise ValueError("write: upsert needs key: the declared column(s) naming an entity")
        if len(set(self.key)) != len(self.key):
            raise ValueError("key lists a column more than once")
        if not isinstance(self.sink, PostgresSinkSpec):
            raise ValueError("write: upsert needs sink postgres: the iceberg sink appends (docs/configuration.md"
                             "#entity-tables)")
        if self.delivery_mode == "at_least_once":
            raise ValueError("write: upsert keeps one row per key: delivery_mode at_least_once (appending every "
                             "delivery) does not apply; use exactly_once or latest_only")
        if self.columns is None:  # checked once the reader schema gives them (with_columns)
            return self
        declared = {c.name: c for c in self.columns}
        for name in self.key:
            if name not in declared:
                raise ValueError(f"key column {name!r} is not a declared column")
            if not declared[name].type.key_capable:
                raise ValueError(f"key column {name!r} is a {declared[name].type}: a key column is one of "
                                 f"{', '.join(str(k) for k in DECLARABLE if k.key_capable)}")
        # Every value must name its entity: a key column is required whatever its declaration says.
        self.columns = [c.model_copy(update={"required": True}) if c.name in self.key else c for c in self.columns]
        return self

    @model_validator(mode="after")
    def _carried_where_a_carrier_can(self) -> PipelineConfig:
        if self.doorbell is None or self.doorbell.carrier is None:
            return self
        if not isinstance(self.sink, PostgresSinkSpec):
            raise ValueError("trigger.carrier: a carrier publishes into Postgres tables, in its own transactions; an "
                             "iceberg sink's pipeline keeps a doorbell of its own")
        if self.spark_runtime == "submit":
            raise ValueError("trigger.carrier: a carrier reads on the Spark Connect server (runtime connect); a "
                             "pipeline of runtime submit keeps a doorbell of its own")
        return self

    @property
    def carrier(self) -> str | None:
        """The carrier that carries the pipeline's doorbell batches, if any (trigger.carrier)."""
        return self.doorbell.carrier if self.doorbell is not None else None

    @property
    def columns_from_reader_schema(self) -> bool:
        """Whether the columns are left out, to be taken from the reader schema at the pipeline's first plan."""
        return self.columns is None

    def with_columns(self, columns: list[dict[str, Any]]) -> PipelineConfig:
        """The pipeline with `columns` (declarations, as in the file) in place of the ones it left out, validated
        as if the file held them (ValueError saying what does not fit)."""
        declared = self.model_dump(exclude_unset=True, exclude={"columns"})
        try:
            return type(self).model_validate({**declared, "columns": columns})
        except ValidationError as exc:
            raise ValueError("; ".join(line.strip(" -") for line in _error_lines(exc))) from None

    def _known_columns(self) -> list[ColumnSpec]:
        if self.columns is None:
            raise ColumnsUnknownError(self.name)
        return self.columns

    @property
    def is_entity_table(self) -> bool:
        """Whether the output holds one row per key (write: upsert) rather than one per record."""
        return self.write == "upsert"

    @property
    def key_columns(self) -> list[ColumnSpec]:
        """The declared columns of the entity key, in key order (none for an append pipeline)."""
        declared = {c.name: c for c in self._known_columns()}
        return [declared[name] for name in self.key]

    @property
    def reads_headers(self) -> bool:
        """Whether a column reads a Kafka header, or the envelope does (a change event's primary-key change names
        the other key in one): the read then asks Spark for the records' headers."""
        return self.value.envelope == "debezium" or any(c.source_kind == "header" for c in self._known_columns())

    @property
    def dag_id(self) -> str:
        return f"{DAG_ID_PREFIX}{self.name}"

    @property
    def doorbell(self) -> DoorbellSpec | None:
        """The pipeline's doorbell, if new data starts its runs."""
        return self.trigger if isinstance(self.trigger, DoorbellSpec) else None

    @property
    def lake_maintenance_dag_id(self) -> str | None:
        """The DAG that maintains the pipeline's Iceberg table (lake_maintenance.py); None for other sinks."""
        return f"{self.dag_id}__maintenance" if isinstance(self.sink, IcebergSinkSpec) else None

    @property
    def subscription(self) -> str:
        """The subscription in words, for logs and DAG docs."""
        if self.topic_pattern:
            return f"topics matching /{self.topic_pattern}/"
        if self.assignment:
            return "partitions " + ", ".join(f"{a.topic}-{a.partition}" for a in self.assignment)
        return "topics " + ", ".join(self.topics)

    def subscribes(self, topic: str) -> bool:
        """Whether `topic` belongs to the subscription (partitions of an assignment are checked apart)."""
        if self.topic_pattern:
            return re.fullmatch(self.topic_pattern, topic) is not None and not topic.startswith("__")
        if self.assignment:
            return any(a.topic == topic for a in self.assignment)
        return topic in self.topics

    @property
    def qualified_output_table(self) -> str:
        """Where the rows are published: `schema.table` in Postgres, `catalog.namespace.table` for Iceberg."""
        if isinstance(self.sink, IcebergSinkSpec):
            return self.sink.qualified_table
        return f"{self.output_schema}.{self.output_table}"


class PipelinesFile(BaseModel):
    """The pipelines file's top level: a mapping of pipeline name to its declaration (checked one by one)."""

    model_config = ConfigDict(extra="forbid")

    pipelines: dict[str, Any] | None = None


def _error_lines(exc: ValidationError, prefix: tuple[str, ...] = ()) -> list[str]:
    return [f"  - {'.'.join(str(part) for part in (*prefix, *error['loc'])) or '(top level)'}: {error['msg']}"
            for error in exc.errors()]


@dataclass(frozen=True)
class CarrierDeclaration:
    """A carrier: the doorbell pipelines naming it (trigger.carrier), carried together by one DAG. It looks as often as
    the most eager of them (the least poll_seconds and ring_again_seconds) and carries as long as the most patient
    (the most carry_seconds)."""

    name: str
    members: tuple[PipelineConfig, ...]

    @property
    def dag_id(self) -> str:
        return f"{CARRIER_DAG_ID_PREFIX}{self.name}"

    def _doorbells(self) -> list[DoorbellSpec]:
        return [bell for member in self.members if (bell := member.doorbell) is not None]

    @property
    def poll_seconds(self) -> float:
        return min(bell.poll_seconds for bell in self._doorbells())

    @property
    def ring_again_seconds(self) -> float:
        return min(bell.ring_again_seconds for bell in self._doorbells())

    @property
    def carry_seconds(self) -> float:
        return max(bell.carry_seconds for bell in self._doorbells())


def carriers_of(pipelines: Iterable[PipelineConfig]) -> dict[str, CarrierDeclaration]:
    """Each carrier the pipelines name (trigger.carrier), with its members in their order."""
    members: dict[str, list[PipelineConfig]] = {}
    for pipeline in pipelines:
        if pipeline.carrier is not None:
            members.setdefault(pipeline.carrier, []).append(pipeline)
    return {name: CarrierDeclaration(name, tuple(found)) for name, found in members.items()}


@dataclass(frozen=True)
class PipelineDeclarations:
    """Every entry of a pipelines file, each validated on its own, so one broken entry hides no other."""

    source: str
    valid: dict[str, PipelineConfig]
    # Pipeline name -> what is wrong with its entry, one indented line per field.
    invalid: dict[str, str]

    def problem(self, name: str) -> ConfigError:
        return ConfigError(f"{self.source}: pipeline {name!r} is invalid:\n{self.invalid[name]}")

    def all_valid(self) -> dict[str, PipelineConfig]:
        """The pipelines, or a ConfigError naming every invalid entry and field."""
        if self.invalid:
            raise ConfigError(f"{self.source}: invalid pipeline configuration:\n" + "\n".join(self.invalid.values()))
        return self.valid

    def carriers(self) -> dict[str, CarrierDeclaration]:
        """Each carrier named by valid pipelines (trigger.carrier), with its members in the file's order."""
        return carriers_of(self.valid.values())

    def carrier(self, name: str) -> CarrierDeclaration:
        """One carrier by name, with a helpful error when no valid pipeline names it."""
        carriers = self.carriers()
        if name not in carriers:
            raise ConfigError(f"no valid pipeline of {self.source} names carrier {name!r} (named: "
                              f"{', '.join(sorted(carriers)) or 'none'})")
        return carriers[name]

    def pipeline(self, name: str) -> PipelineConfig:
        """One pipeline by name, valid whatever the other entries hold, with a helpful error when it is not."""
        if name in self.invalid:
            raise self.problem(name)
        if name not in self.valid:
            declared = sorted(self.valid)
            known = ", ".join(declared[:NAMES_IN_ERRORS]) or "none"
            more = f" and {len(declared) - NAMES_IN_ERRORS} more" if len(declared) > NAMES_IN_ERRORS else ""
            raise ConfigError(f"pipeline {name!r} is not declared in {self.source} (declared: {known}{more})")
        return self.valid[name]


def _declare(name: str, body: object) -> PipelineConfig:
    # Pipelines are keyed by name in YAML; the key is copied into the body so a pipeline knows its name.
    if not isinstance(body, dict):
        raise ValueError("must be a mapping of the pipeline's fields")
    if "name" in body and body["name"] != name:
        raise ValueError(f"sets name {body['name']!r}: the key is the pipeline's name")
    return PipelineConfig.model_validate({**body, "name": name})


def read_declarations(text: str, source: str = "<string>") -> PipelineDeclarations:
    """Validate pipelines YAML text entry by entry; only an unreadable file as a whole raises ConfigError."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: not valid YAML: {exc}") from exc
    try:
        entries = PipelinesFile.model_validate(data if data is not None else {}).pipelines or {}
    except ValidationError as exc:
        raise ConfigError(f"{source}: invalid pipeline configuration:\n" + "\n".join(_error_lines(exc))) from exc
    valid: dict[str, PipelineConfig] = {}
    invalid: dict[str, str] = {}
    table_writers: dict[str, str] = {}
    for name, body in entries.items():
        try:
            pipeline = _declare(name, body)
        except ValidationError as exc:
            invalid[name] = "\n".join(_error_lines(exc, ("pipelines", name)))
            continue
        except ValueError as exc:
            invalid[name] = f"  - pipelines.{name}: {exc}"
            continue
        # Two pipelines writing one table would publish into each other's rows; the entry declared first
        # in the file keeps the table, so adding an entry can never take a running pipeline's table away.
        table = pipeline.qualified_output_table
        if table in table_writers:
            invalid[name] = (f"  - pipelines.{name}.output_table: {table} is already written by pipeline "
                             f"{table_writers[table]!r}")
            continue
        table_writers[table] = name
        valid[name] = pipeline
    return PipelineDeclarations(source, valid, invalid)


def config_path() -> Path:
    """The pipelines file in use: $KAFKA_LEDGER_PIPELINES, else config/pipelines.yaml in the project."""
    return deployment_settings().pipelines


def parse_pipelines(text: str, source: str = "<string>") -> dict[str, PipelineConfig]:
    """Validate pipelines YAML text; raise ConfigError naming the file and every bad field of every entry."""
    return read_declarations(text, source).all_valid()


def read_pipelines(path: Path | str | None = None) -> PipelineDeclarations:
    """Read the pipelines file (default: config_path()), each entry validated on its own."""
    path = Path(path) if path else config_path()
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read pipelines file {path}: {exc.strerror}") from exc
    return read_declarations(text, str(path))


def load_pipelines(path: Path | str | None = None) -> dict[str, PipelineConfig]:
    """Every pipeline of the pipelines file, or a ConfigError if any entry is invalid."""
    return read_pipelines(path).all_valid()


def get_pipeline(name: str, path: Path | str | None = None) -> PipelineConfig:
    """One pipeline by name, valid whatever the other entries hold, with a helpful error when it is not."""
    return read_pipelines(path).pipeline(name)
