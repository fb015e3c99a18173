"""The two Spark runtimes a batch can run in, behind one call: run this batch id, then it is committed.

- `connect` (the local stack's default): a long-lived Spark Connect server keeps the JVM, the Spark
  session and Kafka consumers warm. The task is the Spark Connect client: it runs the read on the server
  and publishes the rows and the offsets itself, in one Postgres transaction (ingest.publish).
- `submit`: one spark-submit per batch stages the rows (spark_jobs/ingest_batch.py); the commit task
  publishes them (batches.commit_batch).

A pipeline picks one with `spark_runtime`; the deployment's default is $KAFKA_LEDGER_SPARK_RUNTIME.
"""

from __future__ import annotations

import logging
import threading
import uuid
from typing import TYPE_CHECKING

from kafka_ledger import ingest
from kafka_ledger.config import PipelineConfig
from kafka_ledger.settings import spark_connect_url, spark_runtime

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from kafka_ledger.batches import CommitResult

log = logging.getLogger(__name__)

# Settings of every Spark Connect session a batch opens (the server's own settings are in scripts/stack.sh).
SESSION_CONF = {
    # publish.copy_lines writes timestamps with an explicit offset, computed in this zone.
    "spark.sql.session.timeZone": "UTC",
}

# How long the Spark Connect client retries a broken connection: about 15 s (PySpark's default is over
# 10 minutes). A restarted server has lost the session anyway; the task's retry is the recovery.
CLIENT_RETRIES = {"max_retries": 5, "max_backoff": 10_000}

# Names a batch's server-side session: every attempt of one batch works in the same session.
_SESSION_NAMESPACE = uuid.UUID("6f1c7d0e-2f4b-4c1e-9a57-6b1f0d7a3c21")


class SparkServerError(RuntimeError):
    """The Spark Connect server cannot be reached, or went away during the batch; nothing was published."""


def batch_session_id(pipeline: str, batch_id: int) -> str:
    return str(uuid.uuid5(_SESSION_NAMESPACE, f"{pipeline}/{batch_id}"))


def attempt_tag(pipeline: str, batch_id: int, attempt: int) -> str:
    """The Spark operation tag of one attempt's query, by which it is interrupted."""
    return f"kafka-ledger:{pipeline}:batch-{batch_id}:attempt-{attempt}"


def _without_secrets(url: str) -> str:
    return ";".join(part for part in url.split(";") if not part.startswith("token="))


class ConnectBatch:
    """One attempt at a batch on the Spark Connect server, from the task that runs it.

    `interrupt()` may be called from another thread (Airflow's on_kill): it interrupts the attempt's
    query by its tag. An attempt that dies without that chance (SIGKILL) leaves its query to the next
    attempt, which interrupts everything still running in the batch's session before it starts; and
    whatever such a query computes, only the newest attempt may publish.
    """

    def __init__(self, pipeline: PipelineConfig, batch_id: int):
        self.pipeline, self.batch_id = pipeline, batch_id
        self._spark: SparkSession | None = None
        self._tag: str | None = None
        self._lock = threading.Lock()
        self._interrupted = threading.Event()

    def _connect(self) -> SparkSession:
        from pyspark.sql import SparkSession
        from pyspark.sql.connect.client.retries import DefaultPolicy

        url = spark_connect_url(batch_session_id(self.pipeline.name, self.batch_id))
        try:
            spark = SparkSession.builder.remote(url).create()
            spark.client.set_retry_policies([DefaultPolicy(**CLIENT_RETRIES)])
            for key, value in SESSION_CONF.items():
                spark.conf.set(key, value)
            # Whatever an earlier attempt of this batch left running (its task was killed) stops now.
            stale = spark.interruptAll()
        except Exception as exc:
            if not _lost_server(exc):
                raise
            raise SparkServerError(
                f"the Spark Connect server at {_without_secrets(url)} is not reachable ({exc}): "
                "nothing was read or published. Is it running (scripts/stack.sh status)? The task's retry, or "
                "the next run, resumes the batch"
            ) from exc
        if stale:
            log.warning("interrupted %d operation(s) an earlier attempt of batch %s left on the server",
                        len(stale), self.batch_id)
        return spark

    def run(self, dsn: str, servers: str) -> CommitResult:
        from kafka_ledger.batches import commit_batch

        attempt = ingest.begin(dsn, servers, self.pipeline, self.batch_id)
        if attempt is None:
            # Committed already (a no-op), or staged by a spark-submit attempt before the pipeline moved to
            # this runtime: publish what it staged.
            return commit_batch(dsn, self.pipeline, self.batch_id)
        if not attempt.readable:
            return ingest.publish(None, self.pipeline, attempt, dsn, servers)
        spark = self._connect()
        tag = attempt_tag(self.pipeline.name, self.batch_id, attempt.number)
        spark.addTag(tag)
        with self._lock:
            self._spark, self._tag = spark, tag
        try:
            result = ingest.publish(spark, self.pipeline, attempt, dsn, servers, self._interrupted)
        except BaseException as exc:
            self.interrupt()
            _close(spark, release_session=False)  # the next attempt reuses the session to clean up
            if _lost_server(exc):
                raise SparkServerError(
                    f"the Spark Connect server went away during attempt {attempt.number} of batch {self.batch_id} "
                    f"({exc}): nothing was published; the task's retry, or the next run, resumes the batch"
                ) from exc
            raise
        finally:
            with self._lock:
                self._spark = self._tag = None
        _close(spark, release_session=True)  # the batch is done: its server-side session goes too
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


def _close(spark: SparkSession, release_session: bool) -> None:
    """SparkSession.stop() without its client close: release the server-side session if asked, close the
    gRPC channel, and stop being the process's default and active session.

    PySpark 4.0's client close waits, holding a lock, for the threads that release finished operations on
    the server, and such a thread can need that lock to release an abandoned (interrupted) operation: a
    deadlock. Closing the gRPC channel itself waits for nothing.
    """
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    try:
        if release_session:
            spark.client.release_session()
    except Exception as exc:  # noqa: BLE001 - the server frees idle sessions itself, later
        log.warning("could not release the Spark Connect session (%s); the server expires it when idle", exc)
    finally:
        spark.client._channel.close()
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


def run_batch(pipeline: PipelineConfig, batch_id: int, dsn: str, servers: str) -> CommitResult:
    """Read, publish and commit one planned batch here and now, in the pipeline's runtime (CLI, benchmark)."""
    from kafka_ledger.batches import commit_batch
    from kafka_ledger.spark_submit import submit_batch

    if spark_runtime(pipeline) == "connect":
        return ConnectBatch(pipeline, batch_id).run(dsn, servers)
    submit_batch(pipeline, batch_id, dsn, servers)
    return commit_batch(dsn, pipeline, batch_id)
