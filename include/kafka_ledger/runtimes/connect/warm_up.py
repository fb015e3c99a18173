"""Warming a freshly started Spark Connect server up: a made-up batch, then each pipeline's newest records."""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kafka_ledger.batch import read
from kafka_ledger.batch.columns import with_columns_or_none
from kafka_ledger.batch.publish import publish_frame
from kafka_ledger.config.pipeline import PipelineConfig
from kafka_ledger.config.services import Services
from kafka_ledger.config.settings import SettingsError, runtime_name
from kafka_ledger.formats.base import ValueFormat
from kafka_ledger.formats.known import value_format
from kafka_ledger.formats.schema_registry import SchemaRefused, SchemaRegistryError
from kafka_ledger.kafka.offsets import subscribed_offsets
from kafka_ledger.ledger import db as ledger
from kafka_ledger.model.ranges import OffsetRange, PartitionOffsets, PlanError, TopicPartition
from kafka_ledger.runtimes.connect.batch import arrow_stream, default_session_id, pipeline_session
from kafka_ledger.runtimes.connect.runtime import ConnectRuntime
from kafka_ledger.sinks import sink_for
from kafka_ledger.spark.connect import (
    SparkServerError,
    client_session,
    close_session,
    closed_session,
    configure,
    headline,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

# The warm-up's made-up batch: enough records for the JIT to compile the decode's and the transfer's hot code.
WARM_UP_RECORDS = 300_000
# Then, per pipeline, the newest records of at most this many of its partitions, this many records in all (at
# most one partition's batch, which its batches read anyway: a topic of big records stays affordable): the
# Kafka reader's code compiled, the pipeline's own query code generated and its consumers in Spark's pool.
WARM_UP_PIPELINE_RECORDS, WARM_UP_PIPELINE_PARTITIONS = 50_000, 32
_WARM_UP_PIPELINE = {
    "name": "kafka_ledger_warm_up", "topics": ["kafka-ledger-warm-up"], "output_table": "kafka_ledger_warm_up",
    "columns": [{"name": "event_id", "type": "string", "required": True}, {"name": "amount", "type": "long"},
                {"name": "count", "type": "int"}, {"name": "price", "type": "double"},
                {"name": "ok", "type": "boolean"}, {"name": "event_time", "type": "timestamp"}],
}


def newest_ranges(offsets: Mapping[TopicPartition, PartitionOffsets], records: int = WARM_UP_PIPELINE_RECORDS,
                  partitions: int = WARM_UP_PIPELINE_PARTITIONS) -> list[OffsetRange]:
    """The newest offsets Kafka holds, about `records` in all, of at most `partitions` partitions (those holding
    the most first): what the warm-up reads of a pipeline's topics."""
    holding = sorted((tp for tp, o in offsets.items() if o.end > o.log_start),
                     key=lambda tp: (-(offsets[tp].end - offsets[tp].log_start), tp))[:partitions]
    if not holding:
        return []
    each = -(-records // len(holding))
    return sorted(OffsetRange(tp.topic, tp.partition, max(offsets[tp].log_start, offsets[tp].end - each),
                              offsets[tp].end) for tp in holding)


@dataclass(frozen=True)
class WarmUp:
    """What a warm-up ran: the made-up batch, then each pipeline's newest records (read, never written)."""

    made_up_records: int
    pipeline_records: dict[str, int]
    skipped: dict[str, str]
    seconds: float


def warm_up(records: int = WARM_UP_RECORDS, pipelines: Sequence[PipelineConfig] = (),
            services: Services | None = None) -> WarmUp:
    """Warm a freshly started Spark Connect server up: run a made-up batch's decode and transfer on it, then read
    and decode the newest records of each pipeline of this runtime as its batches do (`services`: Kafka and the
    ledger, needed with `pipelines`).

    A freshly started server interprets its code until the JIT has compiled it: the first batch after a start
    took about twice as long as the next ones (docs/benchmark.md). Run once after the server starts, this makes
    the first real batch find that code compiled: the JSON parser and Arrow's writer (the made-up batch: Spark
    makes up JSON records of every declared type, a dead letter in every 50, in the shape of its Kafka source's
    rows), and the Kafka reader, the pipeline's generated query code and its pooled consumers (its newest
    records, read as its batches read them, in its session: assigned partitions, read_committed, nothing committed
    to Kafka; an Avro pipeline's with its subjects' newest versions from the schema registry). The ledger names each
    pipeline's session (`pipeline_session`). Writes nothing anywhere.
    A pipeline whose topics are missing or empty is skipped, saying why.
    For a process of its own (`kafka-ledger warm-up`): it waits for every Spark Connect release the process has
    under way, which a worker running batches must not do (see close_session).
    """
    from pyspark.errors import PySparkException
    from pyspark.sql import functions as F

    def received(frame: DataFrame, pipeline: PipelineConfig, fmt: ValueFormat | None = None) -> int:
        return sum(table.num_rows for table in arrow_stream(publish_frame(frame, pipeline, sink_for(pipeline), 0,
                                                                          fmt=fmt)))

    def newest_format(pipeline: PipelineConfig, ranges: list[OffsetRange]) -> ValueFormat | None:
        """A registry format bound to its subjects' newest versions, as the pipeline's next batch will likely pin
        them (None: the pipeline's format reads as it is)."""
        fmt = value_format(pipeline)
        if not fmt.binds:
            return None
        assert services is not None, "a pipeline's warm-up reads its Kafka: give the services"
        return fmt.newest(services.registry().client(), pipeline, {r.topic for r in ranges})

    def session_of(pipeline: PipelineConfig) -> SparkSession:
        if services is None:
            return client_session(default_session_id(pipeline.name))
        with ledger.transaction(services.ledger) as cur:
            return client_session(pipeline_session(cur, pipeline.name))

    made_up = PipelineConfig.model_validate(_WARM_UP_PIPELINE)
    started = time.monotonic()
    pipeline_records: dict[str, int] = {}
    skipped: dict[str, str] = {}
    spark = client_session(str(uuid.uuid4()))
    sessions = [spark]
    try:
        configure(spark)
        n = F.col("id")
        value = F.when(n % 50 == 0, F.lit('{"event_id": ')).otherwise(F.concat(
            F.lit('{"event_id": "e'), n.cast("string"), F.lit('", "amount": '), n.cast("string"),
            F.lit(', "count": 7, "price": '), (n / 7).cast("string"), F.lit(', "ok": true, "event_time": "'),
            F.lit("2026-11-21T10:00:00Z"), F.lit('"}')))
        records_frame = spark.range(records, numPartitions=4).select(
            F.lit(_WARM_UP_PIPELINE["topics"][0]).alias("topic"), (n % 4).cast("int").alias("partition"),
            n.alias("offset"), F.timestamp_micros(F.lit(1_795_255_200_000_000) + n).alias("timestamp"),
            F.lit(None).cast("binary").alias("key"), value.cast("binary").alias("value"))
        made_up_records = received(records_frame, made_up)
        for pipeline in (p for p in pipelines if runtime_name(p) == ConnectRuntime.name):  # the server's own
            try:
                assert services is not None, "a pipeline's warm-up reads its Kafka: give the services"
                ranges = newest_ranges(subscribed_offsets(services.kafka, pipeline),
                                       min(WARM_UP_PIPELINE_RECORDS, pipeline.max_records_per_partition))
            except PlanError as exc:  # a topic not made yet, a broker away (KafkaUnavailable)
                skipped[pipeline.name] = str(exc)
                continue
            if not ranges:
                skipped[pipeline.name] = f"its {pipeline.subscription} hold no records yet"
                continue
            try:
                with_columns = with_columns_or_none(services.ledger, pipeline)
            except SchemaRefused as exc:  # its plans will say so too
                skipped[pipeline.name] = str(exc)
                continue
            if with_columns is None:
                skipped[pipeline.name] = "it takes its columns from its reader schema at its first plan, not made yet"
                continue
            pipeline = with_columns
            try:
                fmt = newest_format(pipeline, ranges)
            except (SchemaRegistryError, SettingsError) as exc:  # its batches will say so too
                skipped[pipeline.name] = f"its schemas could not be read: {exc}"
                continue
            # Its batches' session: Spark keeps the generated code of a query per session (pipeline_session).
            sessions.append(session := session_of(pipeline))
            try:
                configure(session)
                # Fewer rows than offsets is right: a transactional producer's commit markers take offsets too.
                pipeline_records[pipeline.name] = received(
                    read.read_ranges(session, ranges, services.kafka, pipeline.name, pipeline.reads_headers), pipeline,
                    fmt)
            except PySparkException as exc:  # its batches will fail the same way, saying so in their task logs
                skipped[pipeline.name] = (
                    "its Spark Connect session was closed: its next batch replaces it" if closed_session(exc)
                    else f"reading its newest records failed: {headline(exc)}")
        # The client releases the finished queries on the server in threads of its own: let them finish before
        # the session goes, or each logs a warning. (Safe here: nothing was interrupted, see close_session.)
        from pyspark.sql.connect.client.reattach import ExecutePlanResponseReattachableIterator

        ExecutePlanResponseReattachableIterator.shutdown()
    except BaseException:
        for session in sessions:
            close_session(session, release_session=False)  # an unreachable server would only be retried again
        raise
    close_session(spark, release_session=True)
    for session in sessions[1:]:
        close_session(session, release_session=False)  # the pipelines' batches work in them next
    if made_up_records != records:
        raise SparkServerError(f"the warm-up batch came back with {made_up_records} of its {records} records")
    return WarmUp(made_up_records, pipeline_records, skipped, time.monotonic() - started)


