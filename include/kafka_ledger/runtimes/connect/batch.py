"""The `connect` runtime's batch: the task is a client of a warm Spark Connect server and commits the batch itself.

A long-lived Spark Connect server keeps the JVM, the Spark session and the Kafka consumers warm. The task
runs the batch's read and decode on the server, and the rows stream back as Arrow, encoded for binary COPY straight
into the commit's one Postgres transaction (batch/commit.Streamed): no staging table, no second copy. An artifact
sink's rows are written on the server as the batch's artifact instead (batch/publish.publish_artifact).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from kafka_ledger.batch import commit, read
from kafka_ledger.batch.columns import with_columns
from kafka_ledger.batch.commit import CommitResult, Streamed, Written
from kafka_ledger.batch.publish import publish_attempt, publish_frame
from kafka_ledger.config.pipeline import PipelineConfig
from kafka_ledger.config.services import LedgerDatabase, Services
from kafka_ledger.config.settings import spark_connect_url
from kafka_ledger.ledger import db as ledger
from kafka_ledger.observe.stages import Stopwatch
from kafka_ledger.sinks import TransactionalSink, sink_for
from kafka_ledger.spark.connect import (
    Heartbeat,
    SparkServerError,
    client_session,
    close_session,
    closed_session,
    configure,
    headline,
    let_go,
    lost_server,
    spark_failure,
    without_secrets,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)

# Names a pipeline's default server-side session (pipeline_session).
_SESSION_NAMESPACE = uuid.UUID("6f1c7d0e-2f4b-4c1e-9a57-6b1f0d7a3c21")


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


def replace_session(db: LedgerDatabase, pipeline: str, closed: str) -> str:
    """A new session for the pipeline in place of one the server has closed (a session idle past the server's
    spark.connect.session.manager.defaultSessionTimeout is closed, and its id refused for good)."""
    with ledger.transaction(db) as cur:
        session_id = ledger.replace_spark_session(cur, pipeline, closed, str(uuid.uuid4()))
    log.warning("the Spark Connect server had closed session %s of pipeline %s (idle too long?): its batches work "
                "in session %s from now on", closed, pipeline, session_id)
    return session_id


def attempt_tag(pipeline: str, batch_id: int, attempt: int) -> str:
    """The Spark operation tag of one attempt's query, by which it is interrupted."""
    return f"kafka-ledger:{pipeline}:batch-{batch_id}:attempt-{attempt}"


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

    def _open(self, db: LedgerDatabase, batch: ledger.Batch, attempt: int, description: str
              ) -> tuple[SparkSession, Heartbeat]:
        """The batch's session on the server, prepared for the attempt, its heartbeat running: the pipeline's, or
        the batch's own (`_own_session`). A session the server has closed is replaced, once (the pipeline's in the
        ledger, for its next batches too)."""
        own = self._own_session(batch)
        if own:
            session_id = str(uuid.uuid5(_SESSION_NAMESPACE, f"{self.pipeline.name}/{batch.batch_id}"))
        else:
            with ledger.transaction(db) as cur:
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
                if closed_session(exc) and not replaced:
                    replaced = True
                    session_id = str(uuid.uuid4()) if own else replace_session(db, self.pipeline.name, session_id)
                    continue
                if heartbeat.lost is None and not lost_server(exc):
                    raise
                raise SparkServerError(
                    f"the Spark Connect server at {without_secrets(spark_connect_url(session_id))} is not reachable "
                    f"({heartbeat.lost or exc}): nothing was read or published. Is it running (scripts/stack.sh "
                    "status)? The task's retry, or the next run, resumes the batch"
                ) from exc

    def _own_session(self, batch: ledger.Batch) -> bool:
        # A rewrite that stamps its artifact through its session's settings (an Iceberg MERGE) must not share a session
        # that other batches of the pipeline may use at the same time.
        return sink_for(self.pipeline).rewrites_stamp_the_session and not batch.moves_positions

    def run(self, services: Services) -> CommitResult:
        clock = Stopwatch()
        self.pipeline = with_columns(services.ledger, self.pipeline)
        attempt = read.begin(services, self.pipeline, self.batch_id)
        if attempt is None:
            # Committed already (a no-op), or staged by a spark-submit attempt before the pipeline moved to
            # this runtime: publish what it staged.
            return commit.commit(services, self.pipeline, self.batch_id, Written())
        if not attempt.readable:
            read.mark_nothing_to_read(services.ledger, attempt)
            return commit.commit(services, self.pipeline, self.batch_id, Written())
        clock.lap("begin")
        description = f"attempt {attempt.number} of batch {self.batch_id}"
        spark, heartbeat = self._open(services.ledger, attempt.batch, attempt.number, description)
        clock.lap("session")
        with heartbeat:
            tag = attempt_tag(self.pipeline.name, self.batch_id, attempt.number)
            spark.addTag(tag)
            with self._lock:
                self._spark, self._tag = spark, tag
            try:
                result = publish(spark, self.pipeline, attempt, services, self._interrupted, clock)
            except BaseException as exc:
                if heartbeat.lost is None:
                    self.interrupt()
                close_session(spark, release_session=False)  # the next attempt reuses the session to clean up
                if heartbeat.lost is not None or lost_server(exc):
                    raise SparkServerError(
                        f"the Spark Connect server went away during {description} ({heartbeat.lost or exc}): "
                        "nothing was published; the task's retry, or the next run, resumes the batch"
                    ) from exc
                if spark_failure(exc):
                    raise SparkReadError(
                        f"Spark failed {description} ({headline(exc)}): nothing was published; the task's retry, "
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


class SparkReadError(RuntimeError):
    """Spark failed the attempt's query (its read or decode); nothing was published."""


class AttemptInterrupted(RuntimeError):
    """The attempt was interrupted (its task is being stopped): nothing it read is published."""


def publish(
    spark: SparkSession, pipeline: PipelineConfig, attempt: read.Attempt, services: Services,
    interrupted: threading.Event | None = None, clock: Stopwatch | None = None,
) -> CommitResult:
    """Read the attempt's ranges and publish them and the offsets in ONE transaction (batch/commit.py).

    The rows stream from the Spark Connect server into COPY as Spark produces them (a transactional sink), or the
    server writes them as the batch's artifact (an artifact sink). Once `interrupted` is set, the stream stops and
    nothing is published. `clock` times the stages (stages.STAGES).
    """
    started = time.monotonic()
    clock = clock or Stopwatch()
    sink = sink_for(pipeline)
    records = read.read_records(spark, attempt, services.kafka)

    def check_interrupted() -> None:
        if interrupted is not None and interrupted.is_set():
            raise AttemptInterrupted(f"attempt {attempt.number} of batch {attempt.batch.batch_id} was interrupted")

    def streamed(sink: TransactionalSink) -> CommitResult:
        rows = publish_frame(records, pipeline, sink, attempt.batch.batch_id, attempt.value_format)
        return commit.commit(services, pipeline, attempt.batch.batch_id,
                             Streamed(attempt.number, arrow_stream(rows, attempt, interrupted), started, clock))

    return publish_attempt(records, attempt, sink, services, in_transaction=streamed, started=started, clock=clock,
                           check_interrupted=check_interrupted)


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


