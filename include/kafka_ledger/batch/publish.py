"""An attempt's publish: its records decoded into a publish frame, and the frame's rows taken to the sink by what the
sink can do.

The publish frame (`publish_frame`) holds every record's Kafka coordinates and, for a publishable record, its decoded
values as typed columns, or, for a dead letter, its COPY line. Then `publish_attempt` chooses by the sink's kind
(sinks/base.py): an artifact sink's rows are written by Spark as the batch's artifact and adopted by the commit
(`publish_artifact`, the same in every runtime); a transactional sink's rows go the runtime's own way into the
commit's transaction (streamed by the connect runtime, staged by the submit runtime).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from kafka_ledger.batch import commit
from kafka_ledger.batch.commit import Adopted, CommitResult
from kafka_ledger.config.pipeline import PipelineConfig
from kafka_ledger.config.services import Services
from kafka_ledger.formats.decode import decode_records
from kafka_ledger.ledger import sql
from kafka_ledger.model import columns
from kafka_ledger.model.columns import DEAD_LETTER_LINE, PUBLISHED
from kafka_ledger.observe import failpoints
from kafka_ledger.observe.stages import Stopwatch
from kafka_ledger.sinks import ArtifactSink, Sink, TransactionalSink

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

    from kafka_ledger.batch.read import Attempt
    from kafka_ledger.formats.base import ValueFormat

COORDINATES = columns.names(columns.COORDINATES)
# The kind of every column a dead letter's line holds, which says how Spark writes it as CSV.
_LEDGER_KINDS = {c.name: c.kind for c in columns.DEAD_LETTER}

T = TypeVar("T")


def _csv_line(fields: list[Column]) -> Column:
    from pyspark.sql import functions as F

    return F.concat(F.concat_ws(",", *[F.coalesce(f, F.lit("")) for f in fields]), F.lit("\n"))


def publish_frame(records: DataFrame, pipeline: PipelineConfig, sink: Sink, batch_id: int | Column,
                  fmt: ValueFormat | None = None, pipeline_name: Column | None = None) -> DataFrame:
    """Kafka source rows, decoded (formats/decode.py, with the sink's envelope and the attempt's format `fmt`) ->
    Kafka coordinates, PUBLISHED, the output's values (NULL for a dead letter) and DEAD_LETTER_LINE.

    A carrier's frame (runtimes/connect/carrier.py) holds the records of several pipelines of one decode shape
    (`decode_shape`): then `batch_id` and `pipeline_name` are columns of the decoded rows that say each row's batch and
    pipeline.

    The output rows travel as typed values and the client encodes them for binary COPY (sinks/postgres/copy.py):
    Spark's own rendering of them as text cost more on the server than the encoding costs the client, and Postgres
    reads binary values with less work than text (measured: docs/benchmark.md).
    Dead letters are few and keep their raw bytes as hex: Spark renders their lines.
    """
    from pyspark.sql import functions as F

    decoded = decode_records(records, pipeline, sink.envelope, fmt=fmt)
    values = {"batch_id": F.lit(batch_id).cast("long"),
              "pipeline": F.lit(pipeline.name) if pipeline_name is None else pipeline_name}
    published = F.col("error").isNull()
    dead_letter_line = _csv_line([_LEDGER_KINDS[name].csv_field(values.get(name, F.col(name)))
                                  for name in sql.DEAD_LETTER_COLUMNS])
    return decoded.select(
        *COORDINATES,
        published.alias(PUBLISHED),
        *[F.when(published, F.col(name)).alias(name) for name in output_values(sink)],
        F.when(~published, dead_letter_line).alias(DEAD_LETTER_LINE),
    )


# The fields of a pipeline's declaration that its records' decoding and publish frame depend on (with its sink's
# published columns and envelope); every other field of PipelineConfig is in NOT_DECODING_FIELDS. A unit test holds
# every field in one of the two: a new field must be placed before pipelines can share a decode again.
DECODING_FIELDS = frozenset({"value", "extra_fields", "key", "columns", "sink", "write"})
NOT_DECODING_FIELDS = frozenset({
    "name", "description", "topics", "topic_pattern", "assignment", "delivery_mode", "on_data_loss",
    "retention_warning_fraction", "output_table", "output_schema", "max_records_per_partition", "start_position",
    "schedule", "trigger", "owner", "retries", "retry_delay_seconds", "spark_timeout_minutes", "spark_conf",
    "spark_runtime", "mirror_consumer_group"})


def decode_shape(pipeline: PipelineConfig, sink: Sink, fmt: ValueFormat | None = None) -> str | None:
    """What pipelines whose records one publish frame may decode together have in common: equal shapes decode every
    record alike (only a row's batch and pipeline differ). None for a batch bound to a format of its own (an Avro
    batch's schemas): it is decoded alone."""
    if fmt is not None:
        return None
    declared = pipeline.model_dump(mode="json", include=set(DECODING_FIELDS))
    declared["sink"] = {"published": {name: repr(kind) for name, kind in sink.published_columns().items()},
                        "envelope": type(sink.envelope).__qualname__, "spec": declared.get("sink")}
    return json.dumps(declared, sort_keys=True)


def output_values(sink: Sink) -> list[str]:
    """The published columns whose values come from Spark as they are: all but the coordinates (they travel once,
    for every record) and the batch id (the client's)."""
    return [name for name in sink.published_columns() if name not in {*COORDINATES, columns.BATCH_ID.name}]


def publish_attempt(records: DataFrame, attempt: Attempt, sink: Sink, services: Services, *,
                    in_transaction: Callable[[TransactionalSink], T], started: float, clock: Stopwatch,
                    check_interrupted: Callable[[], None] | None = None) -> T | CommitResult:
    """Publish an attempt's records (Spark's Kafka source rows) by what its sink can do: an artifact sink's written in
    Spark and adopted by the commit (`publish_artifact`); a transactional sink's the runtime's way (`in_transaction`:
    streamed into the commit, or staged for it)."""
    if isinstance(sink, ArtifactSink):
        rows = publish_frame(records, sink.pipeline, sink, attempt.batch.batch_id, attempt.value_format)
        return publish_artifact(sink, rows, attempt, services, started=started, clock=clock,
                                check_interrupted=check_interrupted)
    if isinstance(sink, TransactionalSink):
        return in_transaction(sink)
    raise TypeError(f"{sink.target}: a sink is either written by the commit or by the engine")


def publish_artifact(sink: ArtifactSink, rows: DataFrame, attempt: Attempt, services: Services, *,
                     started: float, clock: Stopwatch, check_interrupted: Callable[[], None] | None = None
                     ) -> CommitResult:
    """An artifact sink's publish of an attempt's rows: Spark writes them as the batch's artifact (or adopts the one an
    earlier or racing attempt left), then the ledger's transaction adopts it, with the dead letters, and moves the
    offsets. `check_interrupted` raises if the attempt was interrupted meanwhile: then nothing is committed."""
    artifact, dead = sink.write_attempt(rows, attempt.batch, attempt.number)
    clock.lap("snapshot")
    failpoints.hit("after_snapshot")
    if check_interrupted is not None:
        check_interrupted()
    return commit.commit(services, sink.pipeline, attempt.batch.batch_id,
                         Adopted(attempt.number, artifact, dead, started, clock))
