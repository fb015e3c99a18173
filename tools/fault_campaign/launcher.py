"""Task processes forked from a server that has loaded the tasks' heavy libraries once (multiprocessing's forkserver).

A campaign starts hundreds of task processes, each of which imported the Spark Connect client, Arrow and pandas afresh:
2.5 CPU-seconds and 5 s of a 2-core machine's time a task. Forked from a server that imported them once (third-party
libraries only, as Airflow's LocalExecutor preloads them: include/airflow_local_settings.py), a task starts at once;
it is still a process of its own, with its own environment, that a fault kills by its pid, and it imports
kafka-ledger's modules afresh. `start` returns a `ForkedTask` with the few of subprocess.Popen's ways the harness uses.
"""

from __future__ import annotations

import atexit
import contextlib
import faulthandler
import multiprocessing
import os
import subprocess
import sys
import tempfile
import threading
import traceback
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

# Third-party modules the tasks import, loaded once by the server; no connection is opened by importing them.
PRELOADED = ["pyspark.sql.connect.session", "pyspark.sql.functions", "pyarrow", "pyarrow.compute", "pandas", "numpy",
             "pgpq", "psycopg2", "psycopg2.extras", "confluent_kafka", "confluent_kafka.admin", "pydantic",
             "pydantic_settings", "yaml", "grpc", "tenacity", "jproperties", "sqlalchemy"]

_context: Any = None


def _forkserver() -> Any:
    global _context
    if _context is None:
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(PRELOADED)
        _context = context
    return _context


def _run(main: Callable[[list[str]], int], argv: list[str], env: Mapping[str, str], stdout: str, stderr: str) -> None:
    """In the forked task: its own environment, stdout to a file the harness reads, stderr appended to the task log,
    then `main(argv)`'s return for the exit code (1 for an exception, its traceback in the log)."""
    os.environ.clear()
    os.environ.update(env)
    os.dup2(os.open(stdout, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), 1)
    os.dup2(os.open(stderr, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600), 2)
    sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115 - the process's own stdout, for its whole life
    sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115
    try:
        code = main(argv)
    except SystemExit as exc:
        _exit(exc.code if isinstance(exc.code, int) else 1)
    except BaseException:
        traceback.print_exc()
        # Ended inside the handler, the exception still held: leaving it would release the failed task's frames and
        # run their finalizers (a Spark result stream's generator, a connection that died mid-COPY). A task under the
        # network campaign's Postgres blackhole (the fresh clones of 4dbb85d and 93f3ded) printed its traceback and
        # was alive 240 s later, with no stack dumped by _exit: perhaps waiting in them, or its end not reported
        # (the strike then says what the kernel saw: ForkedTask.process_state). Airflow's task reports its state
        # before its process ends, so nothing there waits on them either.
        _exit(1)
    _exit(code)


def _exit(code: int) -> None:
    """End the task as Airflow ends a task's process (its supervisor's `_fork_main`): the exit functions, then
    os._exit. A process ending normally would first wait for every thread a library left running: a task whose
    COPY failed once waited for minutes on such a thread (the network campaign at 2e49fb8), where Airflow's would have
    ended. The threads still running are named in the task's log."""
    left = [t.name for t in threading.enumerate() if t is not threading.main_thread() and not t.daemon and t.is_alive()]
    if left:
        print(f"the task ends with threads still running: {', '.join(left)}", file=sys.stderr)
    # Where a task that does not end waits, in its log (the network campaign's Postgres blackhole at 4dbb85d: a task
    # that had failed its COPY at once was still alive 240 s later, after its traceback and before this function's
    # line about threads, if any): every thread's stack once a minute while the exit functions run.
    faulthandler.dump_traceback_later(60, repeat=True, file=sys.stderr)
    try:
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(ValueError, OSError):
                stream.flush()
        os._exit(code)


def _temporary(suffix: str) -> str:
    handle, path = tempfile.mkstemp(prefix="kafka-ledger-task-", suffix=suffix)
    os.close(handle)
    return path


class ForkedTask:
    """A task process forked from the server: its pid, poll(), kill(), send_signal(), wait(), communicate() and
    returncode, as Popen's.
    Its stderr is appended to `stderr`, or, without one, kept for communicate() to return."""

    def __init__(self, main: Callable[[list[str]], int], argv: list[str], env: Mapping[str, str],
                 stderr: Path | None = None):
        self._stdout = _temporary(".out")
        self._stderr = None if stderr is not None else _temporary(".err")
        self._process = _forkserver().Process(target=_run, args=(main, argv, dict(env), self._stdout,
                                                                 str(stderr or self._stderr)))
        self._process.start()
        self.pid: int = self._process.pid
        self._outputs: tuple[str, str | None] | None = None

    @property
    def returncode(self) -> int | None:
        code = self._process.exitcode
        return None if code is None else code

    def poll(self) -> int | None:
        return self.returncode

    def kill(self) -> None:
        self._process.kill()

    def process_state(self) -> str:
        """What the kernel says of the task's process (for a task that seems not to end): gone (its exit status
        then lost on its way from the fork server), a zombie, or its state and the kernel function it waits in."""
        proc = Path(f"/proc/{self.pid}")
        try:
            state = next(line.split(":", 1)[1].strip() for line in (proc / "status").read_text().splitlines()
                         if line.startswith("State:"))
            wchan = (proc / "wchan").read_text().strip() or "-"
        except (OSError, StopIteration):
            return f"process {self.pid} is gone"
        return f"process {self.pid}: {state}, waiting in {wchan}"

    def send_signal(self, signal_number: int) -> None:
        os.kill(self.pid, signal_number)

    def wait(self, timeout: float | None = None) -> int:
        self._process.join(timeout)
        if self._process.exitcode is None:
            raise subprocess.TimeoutExpired(f"task {self.pid}", timeout or 0)
        return self._process.exitcode

    def communicate(self, timeout: float | None = None) -> tuple[str, str | None]:
        """Wait for the task (subprocess.TimeoutExpired after `timeout`) and return its stdout, and its stderr if it
        was kept."""
        self.wait(timeout)
        if self._outputs is not None:
            return self._outputs
        outputs: list[str | None] = []
        for path in (self._stdout, self._stderr):
            if path is None:
                outputs.append(None)
                continue
            try:
                outputs.append(Path(path).read_text(errors="replace"))
            finally:
                Path(path).unlink(missing_ok=True)
        self._outputs = (outputs[0] or "", outputs[1])
        return self._outputs


def start(main: Callable[[list[str]], int], argv: list[str], env: Mapping[str, str],
          stderr: Path | None = None) -> ForkedTask:
    """Fork a task that runs `main(argv)` (a module-level function, sent to the server by name) with environment `env`,
    its stderr appended to `stderr` (else kept for communicate())."""
    return ForkedTask(main, argv, env, stderr)
