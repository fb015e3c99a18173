"""The `connect` runtime: the task is a client of a warm Spark Connect server and commits the batch itself.

A long-lived Spark Connect server keeps the JVM, the Spark session and the Kafka consumers warm. The task
runs the batch's read and decode on the server, and the rows stream back as Arrow, encoded for binary COPY straight
into the commit's one Postgres transaction (commit.publish_stream): no staging table, no second copy.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kafka_ledger.batch import commit, read
from kafka_ledger.batch.commit import CommitResult
from kafka_ledger.config.pipeline import PipelineConfig
from kafka_ledger.config.settings import runtime_name, spark_connect_url
from kafka_ledger.kafka.offsets import subscribed_offsets
from kafka_ledger.ledger import db as ledger
from kafka_ledger.model.ranges import OffsetRange, PartitionOffsets, PlanError, TopicPartition
from kafka_ledger.observe.stages import Stopwatch
from kafka_ledger.runtimes.base import AirflowTasks, Runtime
from kafka_ledger.sinks import IcebergSink, sink_for
from kafka_ledger.sinks.iceberg import write as lake_publish

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)

# Settings of every Spark Connect session a batch opens (the server's own settings are in scripts/stack.sh).
SESSION_CONF = {
    # publish.publish_frame renders dead letters' timestamps with an explicit offset, computed in this zone.
    "spark.sql.session.timeZone": "UTC",
}

# How long the Spark Connect client retries a broken connection: about 15 s (PySpark's default is over
# 10 minutes). A restarted server has lost the session anyway; the task's retry is the recovery.
CLIENT_RETRIES = {"max_retries": 5, "max_backoff": 10_000}

# The heartbeat (Heartbeat below): one cheap question to the server every HEARTBEAT_INTERVAL s, each allowed
# HEARTBEAT_DEADLINE s; HEARTBEAT_MISSES unanswered in a row and the attempt gives up. The batch's own calls
# wait as long as Spark computes (gRPC streams have no deadline of their own), so without it a server that
# stops answering (a network that drops packets, a frozen JVM) would hold the task forever.
HEARTBEAT_INTERVAL, HEARTBEAT_DEADLINE, HEARTBEAT_MISSES = 5.0, 10.0, 2

# Names a pipeline's default server-side session (pipeline_session).
_SESSION_NAMESPACE = uuid.UUID("6f1c7d0e-2f4b-4c1e-9a57-6b1f0d7a3c21")


class SparkServerError(RuntimeError):
    """The Spark Connect server cannot be reached, or went away during the batch; nothing was published."""


class Heartbeat:
    """Asks the Spark Connect server a cheap question (the Config RPC, with a deadline) while an attempt runs.

    A server that misses HEARTBEAT_MISSES questions in a row is taken as gone: the heartbeat closes the
    session's gRPC channel, which ends every call waiting on it at once, and `lost` says why. Bounded: the
    task fails about HEARTBEAT_MISSES x (HEARTBEAT_INTERVAL + HEARTBEAT_DEADLINE) s after the server's last
    answer, and its retry (a new attempt) resumes the batch.
    """

    def __init__(self, spark: SparkSession, description: str):
        self._spark, self._description = spark, description
        self._stopped = threading.Event()
        self.lost: str | None = None
        self._thread = threading.Thread(target=self._beat, name=f"heartbeat {description}", daemon=True)

    def start(self) -> Heartbeat:
        if not self._thread.is_alive() and not self._stopped.is_set():
            self._thread.start()
        return self

    def __enter__(self) -> Heartbeat:
        return self.start()

    def stop(self) -> None:
        self._stopped.set()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _ask(self) -> None:
        from pyspark.sql.connect.proto import base_pb2 as pb2

        client = self._spark.client
        request = client._config_request_with_metadata()
        request.operation.CopyFrom(pb2.ConfigRequest.Operation(get=pb2.ConfigRequest.Get(keys=list(SESSION_CONF))))
        # The stub directly: the client's own retries would wait far longer than the deadline.
        client._stub.Config(request, metadata=client._builder.metadata(), timeout=HEARTBEAT_DEADLINE)

    def _beat(self) -> None:
        import grpc

        misses = 0
        while not self._stopped.wait(HEARTBEAT_INTERVAL):
            try:
                self._ask()
                misses = 0
            except grpc.RpcError as exc:
                if exc.code() not in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNAVAILABLE):
                    continue  # the server answered, if not with a result: it is there
                misses += 1
                log.warning("the Spark Connect server did not answer the heartbeat of %s (%s, %d of %d)",
                            self._description, exc.code().name, misses, HEARTBEAT_MISSES)
                if misses >= HEARTBEAT_MISSES and not self._stopped.is_set():
                    self.lost = (f"the Spark Connect server stopped answering: {misses} heartbeats "
                                 f"{HEARTBEAT_INTERVAL:.0f} s apart went unanswered within {HEARTBEAT_DEADLINE:.0f} s")
                    log.error("%s during %s; closing the connection", self.lost, self._description)
                    self._spark.client._channel.close()  # every call waiting on it fails now
                    return
            except ValueError:
                return  # the channel was closed: the attempt is over


def client_session(session_id: str) -> SparkSession:
    """A client of the server's session `session_id`, retrying a broken connection for CLIENT_RETRIES only.

    No call reaches the server yet; `configure` is the first."""
    from pyspark.sql import SparkSession
    from pyspark.sql.connect.client.retries import DefaultPolicy

    spark = SparkSession.builder.remote(spark_connect_url(session_id)).create()
    spark.client.set_retry_policies([DefaultPolicy(**CLIENT_RETRIES)])
    return spark


def configure(spark: SparkSession) -> None:
    """Apply SESSION_CONF, which every read of a batch relies on, to a session."""
    for key, value in SESSION_CONF.items():
        spark.conf.set(key, value)


def default_session_id(pipeline: str) -> str:
    return str(uuid.uuid5(_SESSION_NAMESPACE, pipeline))


def pipeline_session(cur: ledger.Cursor, pipeline: str) -> str:
    """The server-side session every batch of the pipeline works in, batch after batch.

    One session for all of them, not one per batch: Spark Connect gives each session a class loader of its own,
    and Spark's cache of generated query code is kept per class loader, so a batch in a new session compiled its
    query's code again (about 0.6 CPU-seconds, a tenth of a W1 batch: docs/benchmark.md). The default session is
    named after the pipeline; the ledger names the one that replaced it if the server closed it
    (`replace_session`).
    """
    return ledger.spark_session(cur, pipeline) or default_session_id(pipeline)


def replace_session(dsn: str, pipeline: str, closed: str) -> str:
    """A new session for the pipeline in place of one the server has closed (a session idle past the server's
    spark.connect.session.manager.defaultSessionTimeout is closed, and its id refused for good)."""
    with ledger.transaction(dsn) as cur:
        session_id = ledger.replace_spark_session(cur, pipeline, closed, str(uuid.uuid4()))
    log.warning("the Spark Connect server had closed session %s of pipeline %s (idle too long?): its batches work "
                "in session %s from now on", closed, pipeline, session_id)
    return session_id


def attempt_tag(pipeline: str, batch_id: int, attempt: int) -> str:
    """The Spark operation tag of one attempt's query, by which it is interrupted."""
    return f"kafka-ledger:{pipeline}:batch-{batch_id}:attempt-{attempt}"


def without_secrets(url: str) -> str:
    """A Spark Connect URL without its token, fit for a log line."""
    return ";".join(part for part in url.split(";") if not part.startswith("token="))


class ConnectBatch:
    """One attempt at a batch on the Spark Connect server, from the task that runs it, in the pipeline's session
    (`pipeline_session`).

    `interrupt()` may be called from another thread (Airflow's on_kill): it interrupts the attempt's
    query by its tag. An attempt that dies without that chance (SIGKILL) leaves its query to the next
    attempt, which interrupts the queries of every earlier attempt of the batch before it starts (never a
    newer one's: a slow zombie must not stop its replacement); and whatever such a query computes, only the
    newest attempt may publish.
    """

    def __init__(self, pipeline: PipelineConfig, batch_id: int):
        self.pipeline, self.batch_id = pipeline, batch_id
        self._spark: SparkSession | None = None
        self._tag: str | None = None
        self._lock = threading.Lock()
        self._interrupted = threading.Event()

    def _prepare(self, spark: SparkSession, attempt: int) -> None:
        configure(spark)
        # Whatever an earlier attempt of this batch left running (its task was killed) stops now. By the
        # earlier attempts' tags, not interruptAll: a zombie that gets here after its replacement started
        # would stop the replacement's query, and then neither may publish.
        stale = [op for earlier in range(1, attempt)
                 for op in spark.interruptTag(attempt_tag(self.pipeline.name, self.batch_id, earlier))]
        if stale:
            log.warning("interrupted %d operation(s) an earlier attempt of batch %s left on the server",
                        len(stale), self.batch_id)

    def _open(self, dsn: str, batch: ledger.Batch, attempt: int, description: str) -> tuple[SparkSession, Heartbeat]:
        """The batch's session on the server, prepared for the attempt, its heartbeat running: the pipeline's, or
        the batch's own (`_own_session`). A session the server has closed is replaced, once (the pipeline's in the
        ledger, for its next batches too)."""
        own = self._own_session(batch)
        if own:
            session_id = str(uuid.uuid5(_SESSION_NAMESPACE, f"{self.pipeline.name}/{batch.batch_id}"))
        else:
            with ledger.transaction(dsn) as cur:
                session_id = pipeline_session(cur, self.pipeline.name)
        replaced = False
        while True:
            spark = client_session(session_id)
            heartbeat = Heartbeat(spark, description).start()
            try:
                self._prepare(spark, attempt)
                return spark, heartbeat
            except Exception as exc:
                heartbeat.stop()
                close_session(spark, release_session=False)
                if _closed_session(exc) and not replaced:
                    replaced = True
                    session_id = str(uuid.uuid4()) if own else replace_session(dsn, self.pipeline.name, session_id)
                    continue
                if heartbeat.lost is None and not _lost_server(exc):
                    raise
                raise SparkServerError(
                    f"the Spark Connect server at {without_secrets(spark_connect_url(session_id))} is not reachable "
                    f"({heartbeat.lost or exc}): nothing was read or published. Is it running (scripts/stack.sh "
                    "status)? The task's retry, or the next run, resumes the batch"
                ) from exc

    def _own_session(self, batch: ledger.Batch) -> bool:
        # An Iceberg rewrite stamps its MERGE's snapshot through its session's settings: not in a session that
        # other batches of the pipeline may share at the same time.
        return isinstance(sink_for(self.pipeline), IcebergSink) and not batch.moves_positions

    def run(self, dsn: str, servers: str) -> CommitResult:
        clock = Stopwatch()
        attempt = read.begin(dsn, servers, self.pipeline, self.batch_id)
        if attempt is None:
            # Committed already (a no-op), or staged by a spark-submit attempt before the pipeline moved to
            # this runtime: publish what it staged.
            return commit.commit_batch(dsn, servers, self.pipeline, self.batch_id)
        if not attempt.readable:
            read.mark_nothing_to_read(dsn, attempt)
            return commit.commit_batch(dsn, servers, self.pipeline, self.batch_id)
        clock.lap("begin")
        description = f"attempt {attempt.number} of batch {self.batch_id}"
        spark, heartbeat = self._open(dsn, attempt.batch, attempt.number, description)
        clock.lap("session")
        with heartbeat:
            tag = attempt_tag(self.pipeline.name, self.batch_id, attempt.number)
            spark.addTag(tag)
            with self._lock:
                self._spark, self._tag = spark, tag
            try:
                result = publish(spark, self.pipeline, attempt, dsn, servers, self._interrupted, clock)
            except BaseException as exc:
                if heartbeat.lost is None:
                    self.interrupt()
                close_session(spark, release_session=False)  # the next attempt reuses the session to clean up
                if heartbeat.lost is not None or _lost_server(exc):
                    raise SparkServerError(
                        f"the Spark Connect server went away during {description} ({heartbeat.lost or exc}): "
                        "nothing was published; the task's retry, or the next run, resumes the batch"
                    ) from exc
                if _spark_failure(exc):
                    raise SparkReadError(
                        f"Spark failed {description} ({_headline(exc)}): nothing was published; the task's retry, "
                        "or the next run, reads the same ranges again"
                    ) from exc
                raise
            finally:
                with self._lock:
                    self._spark = self._tag = None
        # The pipeline's next batch works in the same session; a batch's own one the server expires when idle.
        let_go(spark)
        return result

    def running(self) -> bool:
        """Whether an attempt's query may be running on the server now."""
        with self._lock:
            return self._spark is not None

    def interrupt(self) -> None:
        """Interrupt the running attempt's query on the server, if any (safe to call from another thread).

        The attempt stops streaming rows too, so a query that starts just after this call publishes nothing.
        """
        self._interrupted.set()
        with self._lock:
            spark, tag = self._spark, self._tag
        if spark is None or tag is None:
            return
        try:
            interrupted = spark.interruptTag(tag)
            if interrupted:
                log.warning("interrupted the query of %s on the Spark Connect server", tag)
        except Exception as exc:  # noqa: BLE001 - best effort: the next attempt interrupts it anyway
            log.warning("could not interrupt %s (%s); the next attempt of the batch will", tag, exc)


def close_session(spark: SparkSession, release_session: bool) -> None:
    """SparkSession.stop() without its client close: release the server-side session if asked, close the
    gRPC channel (cutting off whatever it still streams), and stop being the process's default and active session.

    PySpark 4.0's client close waits, holding a lock, for the threads that release finished operations on
    the server, and such a thread can need that lock to release an abandoned (interrupted) operation: a
    deadlock. Closing the gRPC channel itself waits for nothing.
    """
    try:
        if release_session:
            spark.client.release_session()
    except Exception as exc:  # noqa: BLE001 - the server frees idle sessions itself, later
        log.warning("could not release the Spark Connect session (%s); the server expires it when idle", exc)
    finally:
        spark.client._channel.close()
        let_go(spark)


def let_go(spark: SparkSession) -> None:
    """Stop using a session whose work ended well: it stops being the process's default and active session; its
    server-side session stays (the pipeline's next batch works in it), and its gRPC channel closes once the client's
    last release of a finished operation lets go of it. Closing the channel now would cut those releases short, each
    with a warning in the task's log (after the task's result, where the fault campaign reads it)."""
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    with ConnectSession._lock:
        if spark is ConnectSession._default_session:
            ConnectSession._default_session = None
        if spark is getattr(ConnectSession._active_session, "session", None):
            ConnectSession._active_session.session = None


def _lost_server(exc: BaseException) -> bool:
    """Whether an error means the server is gone (down, restarted, unreachable), not that the query failed."""
    from pyspark.errors.exceptions.base import RetriesExceeded
    from pyspark.errors.exceptions.connect import SparkConnectGrpcException

    if isinstance(exc, RetriesExceeded):  # the client retried a broken connection until it gave up
        return True
    return isinstance(exc, SparkConnectGrpcException) and any(
        sign in str(exc) for sign in ("UNAVAILABLE", "SESSION_CHANGED", "Connection refused", "Socket closed"))


def _closed_session(exc: BaseException) -> bool:
    """Whether the server refused the session because it has closed it (the session's id is never reused)."""
    from pyspark.errors.exceptions.connect import SparkConnectGrpcException

    return isinstance(exc, SparkConnectGrpcException) and "SESSION_CLOSED" in str(exc)


def _spark_failure(exc: BaseException) -> bool:
    """Whether the error is Spark's: the query failed on the server (a Kafka read that timed out, say)."""
    from pyspark.errors import PySparkException

    return isinstance(exc, PySparkException)


def _headline(exc: BaseException) -> str:
    """An error's first line, and the root cause Spark names below its stack trace, if any."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    causes = [line for line in lines if line.startswith("Caused by: ")]
    head = lines[0] if lines else type(exc).__name__
    return head + (f"; {causes[-1]}" if causes and causes[-1] not in head else "")


class SparkReadError(RuntimeError):
    """Spark failed the attempt's query (its read or decode); nothing was published."""


class AttemptInterrupted(RuntimeError):
    """The attempt was interrupted (its task is being stopped): nothing it read is published."""


def publish(
    spark: SparkSession, pipeline: PipelineConfig, attempt: read.Attempt, dsn: str, servers: str,
    interrupted: threading.Event | None = None, clock: Stopwatch | None = None,
) -> CommitResult:
    """Read the attempt's ranges and publish them and the offsets in ONE transaction (commit.publish_stream).

    The rows stream from the Spark Connect server into COPY as Spark produces them. Once `interrupted` is set,
    the stream stops and nothing is published. `clock` times the stages (stages.STAGES).
    """
    # decode builds Spark columns and publish Arrow streams: PySpark, Arrow and NumPy are imported once a batch is
    # read, not by every user of the runtimes (the DAG file, the CLI).
    from kafka_ledger.batch.publish import publish_frame
    from kafka_ledger.formats.decode import decode_records

    started = time.monotonic()
    rows = publish_frame(decode_records(read.read_records(spark, attempt, servers), pipeline), pipeline,
                         attempt.batch.batch_id)
    sink = sink_for(pipeline)
    if isinstance(sink, IcebergSink):  # Spark writes the rows; the task gets the dead letters and commits
        def check_interrupted() -> None:
            if interrupted is not None and interrupted.is_set():
                raise AttemptInterrupted(f"attempt {attempt.number} of batch {attempt.batch.batch_id} was interrupted")

        return lake_publish.publish_attempt(sink, rows, attempt, dsn, servers, started=started,
                                            clock=clock or Stopwatch(), check_interrupted=check_interrupted)
    return commit.publish_stream(dsn, servers, pipeline, attempt.batch.batch_id, attempt.number,
                                 arrow_stream(rows, attempt, interrupted), started=started, clock=clock)


def arrow_stream(frame: DataFrame, attempt: read.Attempt | None = None,
                 interrupted: threading.Event | None = None) -> Iterator[Any]:
    """The frame's rows as Arrow tables, as the Spark Connect server sends them (not all at once); `interrupted`
    (the attempt's) stops them."""
    client = frame.sparkSession.client
    # DataFrame.toArrow() would hold the whole batch in memory; the client's iterator yields each
    # Arrow batch as it arrives (PySpark 4.0 exposes it only on the client object).
    def stop_if_interrupted() -> None:
        # An interruption that came before the query started on the server, or after its last rows came
        # in, is caught here: the stream fails and the transaction with it.
        if interrupted is not None and interrupted.is_set():
            what = f"attempt {attempt.number} of batch {attempt.batch.batch_id}" if attempt else "the query"
            raise AttemptInterrupted(f"{what} was interrupted")

    for item in client.to_table_as_iterator(frame._plan.to_proto(client), {}):
        stop_if_interrupted()
        if not hasattr(item, "fields"):  # the first item is the schema
            yield item
    stop_if_interrupted()


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
            servers: str | None = None, dsn: str | None = None) -> WarmUp:
    """Warm a freshly started Spark Connect server up: run a made-up batch's decode and transfer on it, then read
    and decode the newest records of each pipeline of this runtime as its batches do (`servers`: Kafka's).

    A freshly started server interprets its code until the JIT has compiled it: the first batch after a start
    took about twice as long as the next ones (docs/benchmark.md). Run once after the server starts, this makes
    the first real batch find that code compiled: the JSON parser and Arrow's writer (the made-up batch: Spark
    makes up JSON records of every declared type, a dead letter in every 50, in the shape of its Kafka source's
    rows), and the Kafka reader, the pipeline's generated query code and its pooled consumers (its newest
    records, read as its batches read them, in its session: assigned partitions, read_committed, nothing committed
    to Kafka). `dsn`, the ledger's, names each pipeline's session (`pipeline_session`). Writes nothing anywhere.
    A pipeline whose topics are missing or empty is skipped, saying why.
    For a process of its own (`kafka-ledger warm-up`): it waits for every Spark Connect release the process has
    under way, which a worker running batches must not do (see close_session).
    """
    from pyspark.errors import PySparkException
    from pyspark.sql import functions as F

    from kafka_ledger.batch.publish import publish_frame
    from kafka_ledger.formats.decode import decode_records

    def received(frame: DataFrame, pipeline: PipelineConfig) -> int:
        return sum(table.num_rows for table in arrow_stream(publish_frame(decode_records(frame, pipeline),
                                                                          pipeline, 0)))

    def session_of(pipeline: PipelineConfig) -> SparkSession:
        if dsn is None:
            return client_session(default_session_id(pipeline.name))
        with ledger.transaction(dsn) as cur:
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
                ranges = newest_ranges(subscribed_offsets(servers or "", pipeline),
                                       min(WARM_UP_PIPELINE_RECORDS, pipeline.max_records_per_partition))
            except PlanError as exc:  # a topic not made yet, a broker away (KafkaUnavailable)
                skipped[pipeline.name] = str(exc)
                continue
            if not ranges:
                skipped[pipeline.name] = f"its {pipeline.subscription} hold no records yet"
                continue
            # Its batches' session: Spark keeps the generated code of a query per session (pipeline_session).
            sessions.append(session := session_of(pipeline))
            try:
                configure(session)
                # Fewer rows than offsets is right: a transactional producer's commit markers take offsets too.
                pipeline_records[pipeline.name] = received(
                    read.read_ranges(session, ranges, servers or "", pipeline.name), pipeline)
            except PySparkException as exc:  # its batches will fail the same way, saying so in their task logs
                skipped[pipeline.name] = (
                    "its Spark Connect session was closed: its next batch replaces it" if _closed_session(exc)
                    else f"reading its newest records failed: {_headline(exc)}")
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


class ConnectRuntime(Runtime):
    """The warm Spark Connect server; one task reads the batch there and commits it."""

    name = "connect"
    spark_task_id = "read_and_commit"
    commit_task_id = None
    sinks = frozenset({"postgres", "iceberg"})

    def run_batch(self, pipeline: PipelineConfig, batch_id: int, dsn: str, servers: str) -> CommitResult:
        return ConnectBatch(pipeline, batch_id).run(dsn, servers)

    def airflow_tasks(self, tasks: AirflowTasks) -> tuple[Any, Any]:
        spark = tasks.read_and_commit(self.spark_task_id)
        return spark, spark

    def describe(self) -> str:
        return (f"`{self.spark_task_id}` reads exactly those ranges on the warm Spark Connect server and publishes "
                "the rows, the dead letters and the new offsets in one Postgres transaction")
