"""A client of the Spark Connect server: its sessions, its heartbeat, and how its failures read.

Every batch of the `connect` runtime, its warm-up and the lake's maintenance open their sessions here. No call reaches
the server before `configure`; a session's gRPC channel is closed without PySpark's client close (`close_session`).
"""

from __future__ import annotations

import atexit
import logging
import re
import threading
from typing import TYPE_CHECKING

from kafka_ledger.config.settings import spark_connect_url

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

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


def without_secrets(url: str) -> str:
    """A Spark Connect URL without its token, fit for a log line."""
    return ";".join(part for part in url.split(";") if not part.startswith("token="))


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
    # PySpark 4.0 registers every client's ML-cache clean-up to run at exit, which keeps every client (its stub,
    # channel and caches) alive until then: a run carrying hundreds of batches, each with a client of its own, would
    # keep hundreds. We use no ML cache.
    atexit.unregister(spark.client._cleanup_ml)


def lost_server(exc: BaseException) -> bool:
    """Whether an error means the server is gone (down, restarted, unreachable), not that the query failed."""
    from pyspark.errors.exceptions.base import RetriesExceeded
    from pyspark.errors.exceptions.connect import SparkConnectGrpcException

    if isinstance(exc, RetriesExceeded):  # the client retried a broken connection until it gave up
        return True
    return isinstance(exc, SparkConnectGrpcException) and any(
        sign in str(exc) for sign in ("UNAVAILABLE", "SESSION_CHANGED", "Connection refused", "Socket closed"))


def closed_session(exc: BaseException) -> bool:
    """Whether the server refused the session because it has closed it (the session's id is never reused)."""
    from pyspark.errors.exceptions.connect import SparkConnectGrpcException

    return isinstance(exc, SparkConnectGrpcException) and "SESSION_CLOSED" in str(exc)


def spark_failure(exc: BaseException) -> bool:
    """Whether the error is Spark's: the query failed on the server (a Kafka read that timed out, say)."""
    from pyspark.errors import PySparkException

    return isinstance(exc, PySparkException)


# How Spark's error about a failed Python UDF or mapInArrow function starts.
PYTHON_WORKER_FAILED = "An exception was thrown from the Python worker"


def headline(exc: BaseException) -> str:
    """An error's first line, and the root cause Spark names below its stack trace, if any."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    causes = [line for line in lines if line.startswith("Caused by: ")]
    head = lines[0] if lines else type(exc).__name__
    if head.startswith(PYTHON_WORKER_FAILED):
        # The Python worker's own error is the last line of its traceback (a wide read's Kafka error, say).
        raised = [line for line in lines if re.match(r"[\w.]+(Error|Exception): ", line)]
        head = f"{PYTHON_WORKER_FAILED}: {raised[-1]}" if raised else head
    return head + (f"; {causes[-1]}" if causes and causes[-1] not in head else "")


