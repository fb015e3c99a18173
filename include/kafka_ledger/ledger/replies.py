"""Bounded waits on the ledger database: a connection whose server stops answering is closed, not waited on.

The server ends every statement itself at its `statement_timeout` (the session's, or a batch transaction's wider
one) and answers with an error. A client that has heard nothing REPLY_GRACE seconds after that cannot reach it:
the network drops its packets (a blackholed route, a proxy or load balancer that keeps the client's side of the
connection open), or the server is frozen. Without a bound the task would wait for ever, holding its Airflow
slot; with it, the statement fails with NoReply, the transaction is gone (nothing it wrote is published) and
the task's retry resumes the batch. TCP keepalives (see KEEPALIVES) catch a dead path sooner where no proxy
answers for the server; this catches the rest.

Every statement, COPY, fetch of a named cursor, commit and rollback on a connection made by `connect()` is
watched. A COPY's source (rows streaming from Spark) may take as long as it needs: only the time the client
waits on the server counts.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

import psycopg2
import psycopg2.extensions

# How long past the server's own statement bound the client still waits for its answer (the cancel and the
# error's way back over a busy link).
REPLY_GRACE = 15.0

# libpq's TCP keepalives, unless the connection string sets its own: a path that silently stopped carrying
# packets (no proxy in between) is found within about a minute, while idle or in a long statement.
KEEPALIVES = {"keepalives": "1", "keepalives_idle": "30", "keepalives_interval": "10", "keepalives_count": "3"}


class NoReply(psycopg2.OperationalError):
    """The database did not answer in time; the connection was closed and its transaction is lost."""


class _Watchdog:
    """One thread per connection that shuts its socket once a wait on the server outlasts its bound."""

    def __init__(self, conn: WatchedConnection):
        self._conn = conn
        self._cond = threading.Condition()
        self._due: float | None = None
        self._seconds = 0.0
        self._closed = False
        self.fired: str | None = None
        self._thread: threading.Thread | None = None

    def arm(self, seconds: float) -> None:
        with self._cond:
            self._due, self._seconds = time.monotonic() + seconds, seconds
            if self._thread is None:
                self._thread = threading.Thread(target=self._watch, name="ledger reply watchdog", daemon=True)
                self._thread.start()
            self._cond.notify()

    def disarm(self) -> None:
        with self._cond:
            self._due = None

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()

    def _watch(self) -> None:
        with self._cond:
            while not self._closed:
                if self._due is None:
                    self._cond.wait()
                    continue
                remaining = self._due - time.monotonic()
                if remaining > 0:
                    self._cond.wait(remaining)
                    continue
                self.fired = (f"the ledger database did not answer within {self._seconds:.0f} s (its statement "
                              f"bound plus {REPLY_GRACE:.0f} s): the connection was closed and its transaction "
                              "rolled back, nothing of it was published")
                self._shut()
                return

    def _shut(self) -> None:
        # shutdown(), not close(): libpq still owns the descriptor; its blocked read or write fails at once.
        try:
            duplicate = socket.socket(fileno=os.dup(self._conn.fileno()))
        except (OSError, psycopg2.Error):
            return
        try:
            duplicate.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        finally:
            duplicate.close()


class WatchedConnection(psycopg2.extensions.connection):
    """A psycopg2 connection whose waits on the server are bounded by `reply_limit` seconds each."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.session_reply_limit = self.reply_limit = 60.0 + REPLY_GRACE
        self.lock_timeout = 600  # seconds a lock wait may take (the session's lock_timeout), for messages
        self._watchdog = _Watchdog(self)

    def bound_replies(self, statement_seconds: float) -> None:
        """The session's statement bound is `statement_seconds`: wait for no reply longer than it plus the grace."""
        self.session_reply_limit = self.reply_limit = statement_seconds + REPLY_GRACE

    def widen_for_transaction(self, statement_seconds: float) -> None:
        """This transaction's statements may run `statement_seconds` (SET LOCAL statement_timeout)."""
        self.reply_limit = max(self.session_reply_limit, statement_seconds + REPLY_GRACE)

    @contextmanager
    def awaiting_reply(self, seconds: float | None = None) -> Iterator[_Watchdog]:
        self._watchdog.arm(self.reply_limit if seconds is None else seconds)
        try:
            yield self._watchdog
        except psycopg2.Error as exc:
            if self._watchdog.fired and not isinstance(exc, NoReply):
                raise NoReply(f"{self._watchdog.fired} ({str(exc).strip()})") from exc
            raise
        finally:
            self._watchdog.disarm()

    def commit(self) -> None:
        with self.awaiting_reply():
            super().commit()
        self.reply_limit = self.session_reply_limit

    def rollback(self) -> None:
        if self.closed and self._watchdog.fired:
            return  # the transaction went with the connection; keep the NoReply that closed it in view
        with self.awaiting_reply():
            super().rollback()
        self.reply_limit = self.session_reply_limit

    def close(self) -> None:
        self._watchdog.close()
        super().close()


class _PausedWhileReading:
    """A COPY source: the watchdog rests while the source produces (Spark), and counts again while the server
    takes each chunk."""

    def __init__(self, source: Any, watchdog: _Watchdog, seconds: float):
        self._source, self._watchdog, self._seconds = source, watchdog, seconds

    def read(self, size: int = -1) -> Any:  # all COPY FROM asks of its source
        self._watchdog.disarm()
        try:
            return self._source.read(size)
        finally:
            self._watchdog.arm(self._seconds)


class WatchedCursor(psycopg2.extensions.cursor):
    """A cursor of a WatchedConnection: each call that waits on the server is watched."""

    connection: WatchedConnection

    def execute(self, query: Any, vars: Any = None) -> None:
        with self.connection.awaiting_reply():
            super().execute(query, vars)

    def executemany(self, query: Any, vars_list: Any) -> None:
        with self.connection.awaiting_reply():
            super().executemany(query, vars_list)

    def copy_expert(self, sql: Any, file: Any, size: int = 8192) -> None:
        # Each chunk the server takes is bounded like a statement of the session: only the COPY as a whole may
        # run as long as the batch's transaction allows, and it is the source's time that makes it long.
        seconds = self.connection.session_reply_limit
        with self.connection.awaiting_reply(seconds) as watchdog:
            super().copy_expert(sql, _PausedWhileReading(file, watchdog, seconds), size)

    # A named (server-side) cursor asks the server for every batch of rows it fetches; a client-side one has
    # them all already.
    def _fetching(self) -> AbstractContextManager[Any]:
        return nullcontext() if self.name is None else self.connection.awaiting_reply()

    def fetchone(self) -> Any:
        with self._fetching():
            return super().fetchone()

    def fetchmany(self, size: int | None = None) -> Any:
        with self._fetching():
            return super().fetchmany(size)

    def fetchall(self) -> Any:
        with self._fetching():
            return super().fetchall()

    def __next__(self) -> Any:
        with self._fetching():
            return super().__next__()


def keepalives(dsn: str) -> dict[str, str]:
    """The KEEPALIVES the connection string does not set itself."""
    given = psycopg2.extensions.parse_dsn(dsn)
    return {key: value for key, value in KEEPALIVES.items() if key not in given}


def connect(dsn: str, **kwargs: Any) -> WatchedConnection:
    """psycopg2.connect with watched replies and TCP keepalives (the connection string's own settings win)."""
    return psycopg2.connect(dsn, connection_factory=WatchedConnection, cursor_factory=WatchedCursor,
                            **keepalives(dsn), **kwargs)
