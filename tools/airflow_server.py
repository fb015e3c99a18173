"""A dedicated Airflow (scripts/airflow.sh) for the integration tests, the freshness benchmark and the doorbell's fault
campaign, the stack's own for the demo, and a small client of their REST API v2."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path
from typing import Any

import httpx
import psycopg2
from tenacity import retry, retry_if_exception_type, stop_after_attempt, wait_fixed

# Airflow's components on loopback, as the local stack runs them (`scripts/stack.sh airflow`).
PROJECT_ROOT = Path(__file__).resolve().parents[1]
AIRFLOW_SCRIPT = PROJECT_ROOT / "scripts" / "airflow.sh"

TERMINAL_RUN_STATES = frozenset({"success", "failed"})
ACTIVE_RUN_STATES = frozenset({"queued", "running"})
# Task states worth a log tail when a run fails (upstream_failed tasks never ran: no log).
SUSPECT_TASK_STATES = frozenset({"failed", "up_for_retry"})


class AirflowStartError(RuntimeError):
    """The test Airflow did not come up; the message names its log."""


@dataclass(frozen=True)
class AirflowSettings:
    """Where an Airflow lives: its home, metadata database and port (the tests' own, never the developer's; or the
    stack's, `stack_airflow`)."""

    home: Path
    port: int
    db_url: str
    stamp: Path

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.home / "airflow.log"

    @property
    def pid_path(self) -> Path:
        return self.home / "airflow.pid"


def airflow_test_settings() -> AirflowSettings:
    """Settings from the environment of scripts/env.sh (KL_AIRFLOW_TEST_PORT); KL_AIRFLOW_TEST_DB_URL overrides."""
    state = Path(os.environ.get("KL_STATE") or PROJECT_ROOT / ".stack")
    pg_port = os.environ.get("KL_PG_PORT", "15432")
    db_url = os.environ.get("KL_AIRFLOW_TEST_DB_URL") or (
        f"postgresql+psycopg2://airflow_test:{os.environ['KL_PG_AIRFLOW_TEST_PASSWORD']}@127.0.0.1:{pg_port}/airflow_test"
    )
    return AirflowSettings(
        home=state / "airflow-test",
        port=int(os.environ["KL_AIRFLOW_TEST_PORT"]),
        db_url=db_url,
        stamp=state / "stamps" / "airflow-test-db",
    )


def airflow_env(settings: AirflowSettings, extra_dags: Path | None = None, edge_workers: int = 0) -> dict[str, str]:
    """The environment of every test Airflow process.

    It inherits this process's environment on purpose: KAFKA_LEDGER_PIPELINES (set by conftest to the
    session's pipelines file) makes the dag-processor generate the test pipelines' DAGs, and the
    KAFKA_LEDGER_* / AIRFLOW_CONN_* variables of scripts/env.sh reach the tasks. `extra_dags`: a folder of DAGs
    loaded as a bundle of its own beside the project's dags/ (the tests' downstream DAGs). `edge_workers`: the Edge
    executor with that many workers (scripts/airflow.sh) instead of the LocalExecutor.
    """
    env = dict(os.environ)
    env.update({
        "AIRFLOW_HOME": str(settings.home),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": settings.db_url,
        "AIRFLOW__API__PORT": str(settings.port),
        # Task processes report to the api-server's execution API: it must name the port we serve on.
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{settings.base_url}/execution/",
        "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        # One api-server worker and a few LocalExecutor workers (32 by default, all started up front) are
        # plenty for one DAG with max_active_runs=1, and spare the 2-core machine.
        "AIRFLOW__API__WORKERS": "1",
        "AIRFLOW__CORE__PARALLELISM": "4",
        # Parse quickly so the session's DAGs appear within seconds, and re-parse as often as the stack's Airflow
        # (scripts/env.sh: a doorbell's watcher starts at its DAG's first parse after the unpause).
        "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
        "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "5",
        # Start a run's next task right after the previous one ends.
        "AIRFLOW__SCHEDULER__SCHEDULER_IDLE_SLEEP_TIME": "0.5",
        # A killed scheduler's task instances are reset for its successor to run within 15 s of its heartbeat aging
        # (5 min by default): the doorbell's fault campaign kills it.
        "AIRFLOW__SCHEDULER__ORPHANED_TASKS_CHECK_INTERVAL": "15",
        "PYTHONUNBUFFERED": "1",
        # The project's dags/ and, in a bundle of their own, the extra DAGs (never the project's).
        "AIRFLOW__DAG_PROCESSOR__DAG_BUNDLE_CONFIG_LIST": json.dumps([
            {"name": "dags-folder", "classpath": "airflow.dag_processing.bundles.local.LocalDagBundle", "kwargs": {}},
            *([{"name": "kafka-ledger-extra", "classpath": "airflow.dag_processing.bundles.local.LocalDagBundle",
                "kwargs": {"path": str(extra_dags)}}] if extra_dags else []),
        ]),
    })
    if edge_workers:
        env.update({
            "KL_AIRFLOW_EDGE_WORKERS": str(edge_workers),
            # A task whose worker was lost (its heartbeats stopped) is failed, and retried, within half a minute.
            "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": "30",
        })
    # scripts/airflow.sh starts the components by bare name: the venv's airflow must come first on PATH.
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


def _airflow_bin() -> str:
    return str(Path(sys.executable).parent / "airflow")


def _libpq_url(sqlalchemy_url: str) -> str:
    return sqlalchemy_url.replace("postgresql+psycopg2://", "postgresql://", 1)


def _alembic_revision(settings: AirflowSettings) -> str | None:
    """The metadata DB's Alembic revision, or None before its first migration."""
    try:
        conn = psycopg2.connect(_libpq_url(settings.db_url), connect_timeout=5)
    except psycopg2.OperationalError as exc:
        raise AirflowStartError(
            f"the test Airflow's metadata database does not answer ({exc}): run `scripts/stack.sh up` "
            "(it creates the airflow_test database) or set KL_AIRFLOW_TEST_DB_URL"
        ) from exc
    try:
        with conn, conn.cursor() as cur:
            cur.execute("SELECT to_regclass('public.alembic_version') IS NOT NULL")
            if not cur.fetchone()[0]:
                return None
            cur.execute("SELECT version_num FROM alembic_version")
            row = cur.fetchone()
            return row[0] if row else None
    finally:
        conn.close()


def migrate_metadata_db(settings: AirflowSettings, env: dict[str, str]) -> None:
    """`airflow db migrate` and the Spark pool, skipped when the stamp matches the DB and Airflow version.

    The stamp holds the DB's Alembic revision too, so a dropped or re-created database is migrated again.
    """
    slots = env["KL_SPARK_SLOTS"]  # scripts/env.sh's deployment-wide cap, as the local stack sets it
    revision = _alembic_revision(settings)
    key = hashlib.sha256(f"{version('apache-airflow')}|{settings.db_url}|{revision}|{slots}".encode()).hexdigest()[:16]
    if revision is not None and settings.stamp.exists() and settings.stamp.read_text() == key:
        return
    log = settings.home / "migrate.log"
    with log.open("w") as out:
        for command in (
            ["db", "migrate"],
            ["pools", "set", "kafka_ledger_spark", slots, env["KL_SPARK_POOL_DESCRIPTION"]],
        ):
            done = subprocess.run(
                [_airflow_bin(), *command], env=env, stdout=out, stderr=subprocess.STDOUT, timeout=900, check=False
            )
            if done.returncode != 0:
                raise AirflowStartError(f"`airflow {' '.join(command)}` failed (log: {log}):\n{_tail(log, 30)}")
    revision = _alembic_revision(settings)
    key = hashlib.sha256(f"{version('apache-airflow')}|{settings.db_url}|{revision}|{slots}".encode()).hexdigest()[:16]
    settings.stamp.parent.mkdir(parents=True, exist_ok=True)
    settings.stamp.write_text(key)


def _tail(path: Path, lines: int) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return f"({path} does not exist)"


def _stat_fields(pid: int) -> list[str] | None:
    """/proc/<pid>/stat's fields after the parenthesised command name (state ppid pgrp session ...), None if gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def session_members(sid: int) -> list[int]:
    """Live processes of session `sid` (task processes get their own process group, not session)."""
    members = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (fields := _stat_fields(int(entry.name))) and int(fields[3]) == sid \
                and fields[0] != "Z":
            members.append(int(entry.name))
    return members


def component_processes(sid: int, component: str) -> list[int]:
    """The processes of one Airflow component (`triggerer`, `scheduler`, ...) of the Airflow whose session is
    `sid`: the `airflow <component>` process scripts/airflow.sh started, and every process under it (the
    triggerer's trigger runner, the scheduler's executor workers and their task processes), the started one first."""
    members = session_members(sid)
    roots = []
    for pid in members:
        try:
            args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        words = [Path(a.decode(errors="replace")).name for a in args if a]
        if "airflow" in words and words[words.index("airflow") + 1:][:1] == [component]:
            roots.append(pid)
    parents = {pid: int(fields[1]) for pid in members if (fields := _stat_fields(pid))}
    found = set(roots)
    while children := {pid for pid, parent in parents.items() if parent in found} - found:
        found |= children
    # The component's own processes first, then what runs under them.
    return sorted(roots) + sorted(found - set(roots))


def task_process(ti_id: str) -> int | None:
    """The process running the task instance `ti_id` now (the Task SDK titles it `airflow worker -- <id>`), if any."""
    title = f"airflow worker -- {ti_id}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if (entry / "cmdline").read_bytes().rstrip(b"\0").startswith(title):
                return int(entry.name)
        except OSError:
            continue
    return None


def kill_component(sid: int, component: str) -> list[int]:
    """Kill (SIGKILL) one component of the Airflow whose session is `sid` and every process under it, as a crashed
    container takes them all; scripts/airflow.sh starts a killed component again. Returns the pids killed."""
    pids = component_processes(sid, component)
    if not pids:
        raise AirflowError(f"no `airflow {component}` process in session {sid}")
    _signal_all(pids, signal.SIGKILL)
    return pids


def _signal_all(pids: list[int], sig: signal.Signals) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def stop_session(sid: int, grace: float = 30.0) -> None:
    """Stop the Airflow whose pid (and session id) is `sid`, then every process left in its session.

    SIGINT is scripts/airflow.sh's way to stop: it terminates its components and reaps them. Task
    supervisors put each task in a process group of its own (a spark-submit JVM may be in there), so
    what is left is found by session id, not process group.
    """
    if sid in session_members(sid):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(sid, signal.SIGINT)
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 10.0)):
        deadline = time.monotonic() + wait
        while session_members(sid) and time.monotonic() < deadline:
            time.sleep(0.5)
        _signal_all(session_members(sid), sig)


def _started_here(pid: int, home: Path) -> bool:
    """Whether a process has AIRFLOW_HOME=`home` in its environment, i.e. this harness started it.

    Components that retitle themselves (api-server, executor workers) may lose their environment
    listing, but scripts/airflow.sh itself and most components keep it.
    """
    try:
        return f"AIRFLOW_HOME={home}".encode() in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return False


def _stop_stale_airflow(settings: AirflowSettings) -> None:
    """Stop the Airflow a killed test session left behind (only called while holding the lock)."""
    try:
        pid = int(settings.pid_path.read_text())
    except (FileNotFoundError, ValueError):
        return
    # The session is ours if a member carries the test AIRFLOW_HOME (Linux does not hand out a pid that
    # still names a live session, so a session with members is the one we recorded).
    members = session_members(pid)
    if any(_started_here(member, settings.home) for member in members):
        print(f"stopping the test Airflow a previous session left running (pid {pid})", file=sys.stderr)
        stop_session(pid)
    settings.pid_path.unlink(missing_ok=True)


@contextlib.contextmanager
def _exclusive(settings: AirflowSettings, timeout: float = 1800.0) -> Iterator[None]:
    """One test Airflow per machine: a second test session waits for the first (same home, port and DB)."""
    settings.home.mkdir(parents=True, exist_ok=True)
    with (settings.home / "lock").open("w") as handle:
        deadline = time.monotonic() + timeout
        announced = False
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if not announced:
                    print(f"waiting for another test session's Airflow ({settings.home}/lock)", file=sys.stderr)
                    announced = True
                if time.monotonic() > deadline:
                    raise AirflowStartError(f"another test session holds {settings.home}/lock") from None
                time.sleep(2)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _port_answers(port: int) -> bool:
    try:
        httpx.get(f"http://127.0.0.1:{port}/", timeout=2)
    except httpx.TransportError:
        return False
    return True


def _wait_healthy(settings: AirflowSettings, process: subprocess.Popen, timeout: float) -> None:
    """Until the api-server answers and reports the metadata DB, scheduler and dag-processor healthy."""
    deadline = time.monotonic() + timeout
    last = "no answer"
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AirflowStartError(
                f"scripts/airflow.sh exited with {process.returncode} during start (log: {settings.log_path}):\n"
                f"{_tail(settings.log_path, 40)}"
            )
        try:
            health = httpx.get(f"{settings.base_url}/api/v2/monitor/health", timeout=5).json()
            parts = [health.get(name) or {} for name in ("metadatabase", "scheduler", "dag_processor")]
            if all(part.get("status") == "healthy" for part in parts):
                return
            last = json.dumps(health)
        except (httpx.TransportError, ValueError) as exc:
            last = str(exc)
        time.sleep(1)
    raise AirflowStartError(
        f"the test Airflow was not healthy within {timeout:.0f} s (last: {last}; log: {settings.log_path}):\n"
        f"{_tail(settings.log_path, 40)}"
    )


def admin_password(settings: AirflowSettings) -> str:
    """The password the Simple auth manager generated for user admin."""
    password_file = settings.home / "simple_auth_manager_passwords.json.generated"
    deadline = time.monotonic() + 30
    while not password_file.exists() and time.monotonic() < deadline:
        time.sleep(0.5)
    return json.loads(password_file.read_text())["admin"]  # the file holds {"admin": "<password>"}


def admin_token(settings: AirflowSettings) -> str:
    """A JWT for user admin: POST /auth/token with the password the Simple auth manager generated."""
    response = httpx.post(
        f"{settings.base_url}/auth/token", json={"username": "admin", "password": admin_password(settings)},
        timeout=30,
    )
    response.raise_for_status()
    return response.json()["access_token"]


@contextlib.contextmanager
def stack_airflow() -> Iterator[AirflowClient]:
    """A REST client of the local stack's own Airflow (`scripts/stack.sh airflow`: the one a user opens at
    KL_AIRFLOW_PORT), started for the while if it was not running. Needs scripts/env.sh's environment."""
    stack = ["bash", str(PROJECT_ROOT / "scripts" / "stack.sh")]
    port = int(os.environ["KL_AIRFLOW_PORT"])
    was_running = _port_answers(port)
    subprocess.run([*stack, "airflow"], check=True, stdout=sys.stderr)
    state = Path(os.environ.get("KL_STATE") or PROJECT_ROOT / ".stack")
    settings = AirflowSettings(home=Path(os.environ["AIRFLOW_HOME"]), port=port,
                               db_url=os.environ["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"], stamp=state / "stamps")
    try:
        with AirflowClient(settings.base_url, admin_token(settings), state / "logs" / "airflow.log") as client:
            yield client
    finally:
        if not was_running:
            subprocess.run([*stack, "stop-airflow"], check=False, stdout=sys.stderr)


@contextlib.contextmanager
def running_airflow(startup_timeout: float = 300.0, extra_dags: Path | None = None,
                    edge_workers: int = 0) -> Iterator[AirflowClient]:
    """Start a dedicated Airflow (scripts/airflow.sh), yield a REST client, and stop every process it started."""
    settings = airflow_test_settings()
    env = airflow_env(settings, extra_dags, edge_workers)
    with _exclusive(settings):
        _stop_stale_airflow(settings)
        if _port_answers(settings.port):
            raise AirflowStartError(
                f"port {settings.port} is already taken by another server: stop it or set KL_AIRFLOW_TEST_PORT"
            )
        migrate_metadata_db(settings, env)
        with settings.log_path.open("w") as log:
            # A session of its own: stopping it reaches every process it starts, task processes included.
            process = subprocess.Popen(
                ["bash", str(AIRFLOW_SCRIPT)], env=env, stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True, cwd=settings.home,
            )
        settings.pid_path.write_text(str(process.pid))
        try:
            _wait_healthy(settings, process, startup_timeout)
            with AirflowClient(settings.base_url, admin_token(settings), settings.log_path, process.pid) as client:
                yield client
        finally:
            stop_session(process.pid)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=10)
            settings.pid_path.unlink(missing_ok=True)


class AirflowError(AssertionError):
    """A REST call failed or a wait timed out; the message carries diagnostics and the server log's path."""


class AirflowClient:
    """The few REST API v2 calls the tests need, with polling helpers that explain their failures."""

    def __init__(self, base_url: str, token: str, log_path: Path, session_id: int | None = None):
        self.log_path = log_path
        self.session_id = session_id  # the process session of the Airflow components, when started here
        self.http = httpx.Client(base_url=base_url, headers={"Authorization": f"Bearer {token}"}, timeout=30)

    def __enter__(self) -> AirflowClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.http.close()

    # --- plain calls ----------------------------------------------------------------------------
    def request(self, method: str, path: str, *, expect: tuple[int, ...] = (200,), **kwargs: Any) -> httpx.Response:
        send = self._read if method == "GET" else self.http.request
        response = send(method, path, **kwargs)
        if response.status_code not in expect:
            raise AirflowError(
                f"{method} {path} answered {response.status_code}: {response.text[:2000]} "
                f"(Airflow log: {self.log_path})"
            )
        return response

    # The api-server has one worker: on a 2-core machine running several stacks at once it can stay silent past
    # the 30 s timeout now and then. A read asks again; a write is never sent twice.
    @retry(retry=retry_if_exception_type(httpx.TimeoutException), stop=stop_after_attempt(3), wait=wait_fixed(2),
           reraise=True)
    def _read(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        return self.http.request(method, path, **kwargs)

    def dag(self, dag_id: str) -> dict[str, Any] | None:
        response = self.request("GET", f"/api/v2/dags/{dag_id}", expect=(200, 404))
        return response.json() if response.status_code == 200 else None

    def set_paused(self, dag_id: str, paused: bool) -> None:
        self.request("PATCH", f"/api/v2/dags/{dag_id}", json={"is_paused": paused})

    def trigger(self, dag_id: str, conf: dict[str, Any] | None = None) -> dict[str, Any]:
        """A manual run now: `logical_date` must be present, null means no logical date (Airflow 3)."""
        return self.request(
            "POST", f"/api/v2/dags/{dag_id}/dagRuns", json={"logical_date": None, "conf": conf or {}}
        ).json()

    def run(self, dag_id: str, run_id: str) -> dict[str, Any]:
        return self.request("GET", f"/api/v2/dags/{dag_id}/dagRuns/{run_id}").json()

    def runs(self, dag_id: str, run_type: str | None = None, **filters: str) -> list[dict[str, Any]]:
        """Every run of the DAG, oldest first.

        `run_type` (scheduled, manual, operator_triggered, backfill, ...) and `filters` (further query
        parameters such as logical_date_gte) narrow the list.
        """
        params: dict[str, Any] = {"limit": 100, "order_by": "id", **filters}
        if run_type:
            params["run_type"] = run_type
        runs: list[dict[str, Any]] = []
        while True:
            page = self.request("GET", f"/api/v2/dags/{dag_id}/dagRuns", params={**params, "offset": len(runs)})
            batch = page.json()["dag_runs"]
            runs.extend(batch)
            if len(batch) < params["limit"]:
                return runs

    def task_instances(self, dag_id: str, run_id: str) -> list[dict[str, Any]]:
        return self.request(
            "GET", f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances", params={"limit": 100}
        ).json()["task_instances"]

    def task_log(self, dag_id: str, run_id: str, task_id: str, try_number: int) -> list[str]:
        """The task try's log as lines (the JSON form: a list of structured entries, or plain strings)."""
        response = self.request(
            "GET", f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/logs/{try_number}",
            params={"full_content": "true"}, headers={"Accept": "application/json"}, expect=(200, 404),
        )
        if response.status_code == 404:
            return [f"(no log: {response.text[:200]})"]
        lines = []
        for entry in response.json().get("content") or []:
            if not isinstance(entry, dict):
                lines.append(str(entry))
                continue
            lines.append(f"{entry.get('timestamp', '')} {entry.get('level', '')} {entry.get('event', '')}".strip())
            # An exception comes as a chain of {exc_type, exc_value, frames}: one line per link.
            for error in entry.get("error_detail") or []:
                frame = (error.get("frames") or [{}])[-1]
                lines.append(
                    f"  {error.get('exc_type')}: {error.get('exc_value')} "
                    f"(at {frame.get('filename')}:{frame.get('lineno')})"
                )
        return lines

    def create_backfill(self, body: dict[str, Any]) -> dict[str, Any]:
        return self.request("POST", "/api/v2/backfills", json=body).json()

    def dry_run_backfill(self, body: dict[str, Any]) -> list[dict[str, Any]]:
        return self.request("POST", "/api/v2/backfills/dry_run", json=body).json()["backfills"]

    def backfill(self, backfill_id: int) -> dict[str, Any]:
        return self.request("GET", f"/api/v2/backfills/{backfill_id}").json()

    # --- diagnostics ------------------------------------------------------------------------------
    def describe_run(self, dag_id: str, run_id: str, log_lines: int = 40) -> str:
        """The run's state, every task instance's state, and the log tail of each failed task."""
        run = self.run(dag_id, run_id)
        out = [
            f"run {run_id}: {run['state']} (type {run['run_type']}, conf {json.dumps(run.get('conf'))}, "
            f"interval {run.get('data_interval_start')} .. {run.get('data_interval_end')})"
        ]
        for ti in sorted(self.task_instances(dag_id, run_id), key=lambda t: t.get("start_date") or ""):
            out.append(f"  {ti['task_id']}: {ti['state']} (try {ti['try_number']})")
            if ti["state"] in SUSPECT_TASK_STATES:
                for try_number in range(1, (ti["try_number"] or 0) + 1):
                    tail = self.task_log(dag_id, run_id, ti["task_id"], try_number)[-log_lines:]
                    out.append(f"    --- log of {ti['task_id']} try {try_number} (last {len(tail)} lines) ---")
                    out.extend(f"    {line}" for line in tail)
        out.append(f"(Airflow log: {self.log_path})")
        return "\n".join(out)

    def describe_runs(self, dag_id: str, runs: list[dict[str, Any]]) -> str:
        return "\n".join(self.describe_run(dag_id, r["dag_run_id"]) for r in runs)

    # --- polling --------------------------------------------------------------------------------
    def _poll(self, what: str, probe: Callable[[], Any], timeout: float, interval: float = 2.0) -> Any:
        """Call `probe` until it returns something other than None; on timeout raise naming `what`."""
        deadline = time.monotonic() + timeout
        while True:
            result = probe()
            if result is not None:
                return result
            if time.monotonic() > deadline:
                raise AirflowError(f"timed out after {timeout:.0f} s waiting for {what} (Airflow log: {self.log_path})")
            time.sleep(interval)

    def wait_for_dag(self, dag_id: str, timeout: float = 120.0) -> dict[str, Any]:
        """Until the dag-processor has parsed the DAG and the API knows it; a timeout names the import errors."""
        try:
            return self._poll(f"the dag-processor to parse {dag_id}", lambda: self.dag(dag_id), timeout)
        except AirflowError as timed_out:
            errors = self.request("GET", "/api/v2/importErrors", params={"limit": 20}).json()["import_errors"]
            found = "\n".join(f"{e['filename']} at {e['timestamp']}: {e['stack_trace'][-1500:]}" for e in errors)
            raise AirflowError(f"{timed_out}\nimport errors: {found or 'none'}") from None

    def wait_for_run(self, dag_id: str, run_id: str, timeout: float = 600.0) -> dict[str, Any]:
        """Until the run is success or failed; on timeout the message shows every task's state."""
        def probe() -> dict[str, Any] | None:
            run = self.run(dag_id, run_id)
            return run if run["state"] in TERMINAL_RUN_STATES else None

        try:
            return self._poll(f"run {run_id} of {dag_id} to finish", probe, timeout)
        except AirflowError as exc:
            raise AirflowError(f"{exc}\n{self.describe_run(dag_id, run_id)}") from None

    def wait_for_runs(
        self, dag_id: str, run_type: str, count: int = 1, timeout: float = 60.0
    ) -> list[dict[str, Any]]:
        """Until at least `count` runs of `run_type` exist (e.g. the scheduler's run after unpausing)."""
        def probe() -> list[dict[str, Any]] | None:
            runs = self.runs(dag_id, run_type)
            return runs if len(runs) >= count else None

        return self._poll(f"{count} {run_type} run(s) of {dag_id}", probe, timeout)

    def wait_until_idle(self, dag_id: str, timeout: float = 600.0, settle: float = 5.0) -> list[dict[str, Any]]:
        """Until no run of the DAG is queued or running, seen twice `settle` seconds apart; returns every run.

        A run's drain_backlog task triggers the next run before it ends, so a run is always queued or
        running while a backlog drains; the second look catches a run created by the scheduler meanwhile.
        """
        deadline = time.monotonic() + timeout
        while True:
            runs = self.runs(dag_id)
            active = [r for r in runs if r["state"] in ACTIVE_RUN_STATES]
            if not active:
                time.sleep(settle)
                again = self.runs(dag_id)
                if not any(r["state"] in ACTIVE_RUN_STATES for r in again):
                    return again
                continue
            if time.monotonic() > deadline:
                raise AirflowError(
                    f"timed out after {timeout:.0f} s: runs of {dag_id} still active\n"
                    + self.describe_runs(dag_id, active)
                )
            time.sleep(2)

    def backfill_runs(self, backfill: dict[str, Any]) -> list[dict[str, Any]]:
        """The DAG's backfill runs with a logical date in the backfill's (inclusive) range.

        Run responses do not name their backfill; a run the backfill re-ran keeps its run_id (e.g.
        scheduled__...) but its run_type becomes backfill.
        """
        return self.runs(
            backfill["dag_id"], "backfill",
            logical_date_gte=backfill["from_date"], logical_date_lte=backfill["to_date"],
        )

    def wait_for_backfill(self, backfill: dict[str, Any], runs: int, timeout: float = 900.0) -> list[dict[str, Any]]:
        """Until the backfill's `runs` runs (from its dry run) all finished; returns them.

        The scheduler sets the backfill's completed_at only every 30 s, so this looks at the runs.
        """
        def probe() -> list[dict[str, Any]] | None:
            found = self.backfill_runs(backfill)
            done = len(found) >= runs and not any(r["state"] in ACTIVE_RUN_STATES for r in found)
            return found if done or self.backfill(backfill["id"])["completed_at"] is not None else None

        try:
            return self._poll(f"the {runs} runs of backfill {backfill['id']} to finish", probe, timeout)
        except AirflowError as exc:
            active = [r for r in self.backfill_runs(backfill) if r["state"] in ACTIVE_RUN_STATES]
            raise AirflowError(f"{exc}\n{self.describe_runs(backfill['dag_id'], active)}") from None
