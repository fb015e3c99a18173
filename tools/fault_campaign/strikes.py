"""The campaign's faults: the kinds of each Spark runtime, their seeded schedule, and how each one is
injected into a run and timed (the strikes), with where in the batch it landed."""

from __future__ import annotations

import functools
import os
import random
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kafka_ledger.config.settings import kafka_client, ledger_database
from tools.fault_campaign import PROJECT_ROOT, CampaignFailure, launcher
from tools.fault_campaign.network import POSTGRES, SCHEMA_REGISTRY, SPARK_CONNECT, kafka_proxy
from tools.stack import stack_command

COMMON_FAULTS = (
    "kill_commit",                # SIGKILL of the committing task inside its transaction
    "restart_postgres_in_commit",  # Postgres restarted while the commit's transaction is open
    "restart_kafka_in_read",      # the Kafka broker restarted while Spark reads
    "racing_runs",                # two runs of the pipeline at once: a double trigger, or a zombie task
    "retry_after_success",        # a task run again after it succeeded
    "crash_after_plan",           # the plan task dies after recording the batch, before Spark starts
)
FAULT_KINDS = {
    "connect": (
        "kill_task_in_read",      # SIGKILL of the read_and_commit task while its query runs (timed, or as rows stream)
        "kill_spark_connect",     # SIGKILL of the Spark Connect server mid-read or mid-streaming, then started again
        "restart_spark_connect",  # the Spark Connect server stopped and started mid-read or mid-streaming
        "racing_attempts",        # a second attempt of the same batch on the same server while the first runs
        *COMMON_FAULTS,
    ),
    "submit": (
        "kill_spark_submit",      # SIGKILL of spark-submit (the driver JVM) at a random moment of its read
        "kill_spark_driver",      # SIGKILL of the PySpark driver process, timed or as its first rows are staged
        "two_drivers",            # a second driver for the same batch while the first runs (a resubmission)
        *COMMON_FAULTS,
    ),
}
# With an Iceberg sink: the catalog's Postgres (the stack's) restarted while Spark writes the batch's snapshot.
ICEBERG_FAULTS = (
    "restart_postgres_in_write",  # Postgres (the lake's catalog and the ledger) restarted while the snapshot is written
)
# With Avro or Protobuf values (--format avro|protobuf): the schema registry, which every task reaches through its
# proxy. A task asks it before anything is begun (the plan for the newest version, the Spark task for the batch's
# schemas).
REGISTRY_FAULTS = (
    "kill_registry_in_plan",      # the registry SIGKILLed as the plan task starts, started again once the task ended
    "kill_registry_in_read",      # the registry SIGKILLed as the Spark task starts, started again once the task ended
    "restart_registry",           # the registry stopped and started at a random moment of the Spark task
    "latency_registry",           # every answer of the registry delayed through its proxy, in the plan and Spark tasks
    "new_schema_version",         # a version added (a field with a default) while records flow: the next ones use it
)
# On a Spark cluster (KAFKA_LEDGER_SPARK_MASTER=spark://...): the machine running the executors is lost.
CLUSTER_FAULTS = (
    "kill_spark_worker",          # SIGKILL of the worker and its executors mid-read, then a new worker started
)


# Through Toxiproxy between the tasks and each service (scripts/stack.sh proxies), in the connect runtime, whose
# one task talks to all three: Kafka (the server's executors read through the proxy too), the ledger's Postgres and
# the Spark Connect server.
NETWORK_FAULTS = (
    "latency_kafka", "latency_postgres", "latency_spark_connect",        # every packet to the client delayed
    "slow_link_kafka", "slow_link_postgres", "slow_link_spark_connect",  # a bandwidth limit on the link
    "reset_kafka", "reset_postgres", "reset_spark_connect",              # connections reset mid-stream
    "blackhole_kafka", "blackhole_postgres", "blackhole_spark_connect",  # nothing passes, until the task gives up
    "restart_kafka_streaming",    # the broker restarted while a slowed read streams its records
)
SERVICES = {"kafka": "Kafka", "postgres": "Postgres", "spark_connect": "the Spark Connect server"}


@dataclass(frozen=True)
class NetworkFault:
    """One network fault: its kind and effect (latency, slow, reset, blackhole, restart), the service and the proxy
    in front of it, the toxic (type, attributes), how it reads in a report, and the streams it is added to."""

    kind: str
    effect: str
    service: str
    proxy: str
    toxic: tuple[str, dict[str, int]]
    what: str
    streams: tuple[str, ...]


def campaign_shape(runtime: str, on_cluster: bool, network: bool = False, secure: bool = False,
                   iceberg: bool = False, registered: str | None = None, entity: bool = False,
                   change_events: bool = False, driver_in_cluster: bool = False, typed: bool = False) -> str:
    """What a campaign ran on: the Spark runtime, whether on the local standalone cluster (with the submit runtime's
    driver on its worker, cluster deploy mode, or not), whether Kafka over
    SASL_SSL with the ledger over verified TLS (the production shape), whether through the network proxies
    (network faults among its kinds), whether into an Iceberg table (the lake's faults among its kinds), whether its
    values are Avro or Protobuf (`registered`) through the schema registry (the registry's faults among its kinds),
    whether into an entity
    table (write: upsert), of Debezium's change events or not (of the wide typed table: `typed`)."""
    return (runtime + ("-cluster" if on_cluster else "") + ("-driver" if driver_in_cluster else "")
            + ("-secure" if secure else "")
            + ("-network" if network else "") + ("-iceberg" if iceberg else "")
            + (f"-{registered}" if registered else "")
            + ("-cdc" if change_events else "-entity" if entity else "") + ("-typed" if typed else ""))


def secured() -> bool:
    """Whether the deployment reaches Kafka over SASL_SSL and the ledger over TLS that verifies its server."""
    from kafka_ledger.config.services import libpq_settings

    return (dict(kafka_client().settings).get("security.protocol", "").upper() == "SASL_SSL"
            and libpq_settings(ledger_database().url).get("sslmode") == "verify-full")


def fault_kinds(shape: str) -> tuple[str, ...]:
    runtime, *traits = shape.split("-")
    return (FAULT_KINDS[runtime] + (CLUSTER_FAULTS if "cluster" in traits else ())
            + (NETWORK_FAULTS if "network" in traits else ()) + (ICEBERG_FAULTS if "iceberg" in traits else ())
            + (REGISTRY_FAULTS if {"avro", "protobuf"} & set(traits) else ()))


# The longest a task may wait on a blackholed service before the campaign calls its wait unbounded: Spark's
# Kafka poll bound (60 s) with its offset look-ups, the ledger's (the campaign's 30 s statement bound + 15 s).
BLACKHOLE_LIMIT = 240

# Where the committing task dies: in `connect` its one transaction also holds the freshly copied rows (an Iceberg
# sink's task may die between its snapshot and that transaction too: after_snapshot, the critical window).
COMMIT_FAIL_POINTS = {"connect": ("after_staging", "commit_after_publish", "commit_before_end"),
                      "submit": ("commit_after_publish", "commit_before_end")}
ICEBERG_FAIL_POINTS = ("after_snapshot",)
# When a timed fault strikes, after the attempt began: spark-submit spends its first seconds starting a JVM. A
# connect attempt of a short campaign's batch (about 1,000 records) takes 2–3 s: its timed strikes strike as the rows
# begin to stream when that comes sooner (_until_streaming), or they would miss it.
STRIKE_DELAYS = {"connect": (0.2, 2.5), "submit": (1.0, 15.0)}


def fault_schedule(faults: int, rng: random.Random, kinds: tuple[str, ...], network_weight: int = 1) -> list[str]:
    """`faults` fault kinds: every kind once per round (a network fault `network_weight` times), in a seeded
    order."""
    schedule: list[str] = []
    while len(schedule) < faults:
        round_ = [kind for kind in kinds for _ in range(network_weight if kind in NETWORK_FAULTS else 1)]
        rng.shuffle(round_)
        schedule.extend(round_)
    return schedule[:faults]


def _variant(timing: str, delay: float, or_as_rows_stream: bool = False) -> str:
    """How a strike is timed, as an iteration reports it."""
    if timing != "timed":
        return timing
    return f"timed ({delay}s after the attempt began{', or as rows stream if sooner' if or_as_rows_stream else ''})"


@dataclass
class RunHooks:
    """What to break in a run's first try of each task (later tries run clean, as retries do)."""

    plan_failpoints: str | None = None
    plan_strike: Callable[[launcher.ForkedTask], str] | None = None
    spark_strike: Callable[..., str] | None = None
    commit_failpoints: str | None = None
    commit_during: Callable[[launcher.ForkedTask, Path], str] | None = None
    repeat_spark: bool = False
    repeat_commit: bool = False


def copying_into(run: Callable[[str, tuple], list[tuple]], table: str, *, running: bool = True) -> bool:
    """Whether a session copies rows into the table: its COPY is running, or (not `running`) the COPY has ended and
    its transaction goes on (a COPY stays its session's `query` until the session's next statement). `run` runs a
    statement with its parameters on a connection to the table's Postgres."""
    states = ["active"] if running else ["active", "idle in transaction"]
    return bool(run("SELECT count(*) FROM pg_stat_activity WHERE state = ANY(%s) AND query LIKE 'COPY%%' "
                    "AND query LIKE %s", (states, f"%{table}%"))[0][0])


class FaultStrikes:
    """The faults of a Campaign (runner.py), which mixes this in: the hooks that inject each fault into a run.

    Uses the campaign's rng, runtime, pipeline, servers, task_log, network (its Toxiproxy), iceberg (whether its
    sink is an Iceberg table) and producer (its records, which an Avro or Protobuf campaign's faults evolve), its
    ledger look-up (_query, batch_state) and its task processes (_start_task, _finish_task).
    """

    # --- where a batch is ---------------------------------------------------------------------------------
    def staged_rows(self, batch_id: int, attempt: int) -> int:
        from psycopg2 import sql

        from kafka_ledger.ledger.sql import staging_table

        statement = sql.SQL("SELECT count(*) FROM {} WHERE batch_id = %(b)s AND attempt = %(a)s").format(
            staging_table(self.pipeline))
        return self._query(statement, {"b": batch_id, "a": attempt})[0][0]

    def streaming(self, batch_id: int) -> bool:
        """Whether the connect runtime's task streams the batch's rows: into COPY (the Postgres sink), or as the
        data files of its snapshot, which Spark writes before it commits (an Iceberg sink)."""
        if self.iceberg:
            (started,) = self._query("SELECT extract(epoch FROM started_at) FROM kafka_ledger.batches WHERE "
                                     "batch_id = %(b)s", {"b": batch_id})[0]
            return started is not None and any(f.stat().st_mtime > float(started) for f in self._lake_data_files())
        return copying_into(self._query, self.pipeline.output_table, running=False)

    def _lake_data_files(self) -> list[Path]:
        folder = self._lake_data_folder()
        return [p for p in folder.rglob("*.parquet")] if folder.exists() else []

    @functools.cache  # noqa: B019 - one per campaign, which lives as long as its process: the table's place is fixed
    def _lake_data_folder(self) -> Path:
        """Where the table's data files go (asked of the catalog once: the strikes look many times a second)."""
        from kafka_ledger.sinks import IcebergSink

        return Path(IcebergSink(self.pipeline).table().location().removeprefix("file://")) / "data"

    def phase(self, batch_id: int, attempt: int) -> str:
        status, attempts = self.batch_state(batch_id)
        if self.runtime == "connect" or self.iceberg:  # the Spark work publishes and commits: nothing is staged
            if status == "committed" or attempts != attempt:
                return "after the batch was committed (the task was finishing)"
            if self.streaming(batch_id):
                return ("mid-write (the snapshot's files being written)" if self.iceberg
                        else "mid-streaming (rows flowing into COPY)")
            return "before streaming (connect or read)"
        if status in ("written", "committed") or attempts != attempt:
            return "after staging (the job was finishing)"
        return "mid-staging" if self.staged_rows(batch_id, attempt) else "before staging (session start or read)"

    # --- faults -------------------------------------------------------------------------------------------
    def _wait(self, condition: Callable[[], bool], alive: threading.Thread | launcher.ForkedTask,
              timeout: float = 300) -> bool:
        """Wait for `condition` while the Spark task (a thread driving spark-submit, or a process) is alive."""
        is_alive = alive.is_alive if isinstance(alive, threading.Thread) else (lambda: alive.poll() is None)
        deadline = time.monotonic() + timeout
        while is_alive() and time.monotonic() < deadline:
            if condition():
                return True
            time.sleep(0.01)
        return False

    def _until_streaming(self, batch_id: int, alive: threading.Thread | launcher.ForkedTask,
                         delay: float | None = None) -> None:
        """Wait until the Spark work streams the batch's rows (or is past them), at most `delay` seconds (None: as
        long as the task lives). A timed strike lands before the commit even when the attempt is shorter than its
        delay: a batch of an entity table's 1,000 change events was read and committed within 2.3 s."""
        self._wait(lambda: self.streaming(batch_id) or self.batch_state(batch_id)[0] != "planned", alive,
                   timeout=300 if delay is None else delay)

    def _strike_spark(self, target: str, timing: str, delay: float) -> Callable[..., str]:
        def strike(hook: Any, batch_id: int, attempts_before: int, thread: threading.Thread) -> str:
            attempt = attempts_before + 1
            if not self._wait(lambda: self.batch_state(batch_id)[1] >= attempt, thread):
                return f"{target} kill missed: the job ended before its attempt began"
            if timing == "first staged rows":  # an Iceberg sink's: the snapshot's first data files
                def writing() -> bool:
                    return self.streaming(batch_id) if self.iceberg else self.staged_rows(batch_id, attempt) > 0

                self._wait(lambda: writing() or self.batch_state(batch_id)[0] != "planned", thread)
            else:
                time.sleep(delay)
            landed = self.phase(batch_id, attempt)
            proc = hook._submit_sp
            if proc is None or proc.poll() is not None:
                return f"{target} kill missed: spark-submit had exited ({landed})"
            if target == "spark-submit":
                os.kill(proc.pid, signal.SIGKILL)
            else:
                drivers = self._driver_processes(batch_id, proc.pid)
                if not drivers:
                    return f"driver kill missed: no driver process ({landed})"
                for driver in drivers:
                    driver.kill()
            return f"{target} SIGKILLed {landed}"
        return strike

    def _driver_processes(self, batch_id: int, spark_submit: int) -> list[Any]:
        """The batch's driver: the PySpark process spark-submit starts here (client deploy mode), or on a standalone
        cluster's worker (cluster deploy mode) the worker's DriverWrapper JVM and the PySpark process it starts."""
        import psutil

        arguments = ["--pipeline", self.pipeline.name, "--batch-id", str(batch_id)]
        drivers = []
        for process in psutil.process_iter():
            try:
                command = process.cmdline()
            except psutil.Error:  # exited meanwhile, or not ours to read
                continue
            ours = any(part.endswith("ingest_batch.py") for part in command) and any(
                command[i:i + len(arguments)] == arguments for i in range(len(command)))
            if ours and process.pid != spark_submit:
                drivers.append(process)
        return drivers

    def _second_driver(self, delay: float) -> Callable[..., str]:
        """A second spark-submit of the same batch `delay` seconds after the first one's attempt began, as a
        resubmission after a lost worker (or a re-attached operator) starts one: exactly one of the two may publish,
        the other must be fenced (exit EXIT_FENCED, saying so) or find the batch written already."""
        def strike(hook: Any, batch_id: int, attempts_before: int, thread: threading.Thread) -> str:
            from kafka_ledger.ledger.db import EXIT_FENCED

            attempt = attempts_before + 1
            if not self._wait(lambda: self.batch_state(batch_id)[1] >= attempt, thread):
                return "second driver missed: the first ended before its attempt began"
            time.sleep(delay)
            landed = self.phase(batch_id, attempt)
            if not thread.is_alive():
                return f"second driver missed: the first had ended ({landed})"
            # The very command the first one runs, in the same environment (spark_submit_try set it).
            submission = self.submission
            second = subprocess.run(hook._build_spark_submit_command(submission.application), env=dict(os.environ),
                                    capture_output=True, text=True, timeout=900)
            thread.join(900)
            if submission.outcome_in_ledger:
                # Drivers on a standalone cluster's worker: spark-submit's exit says nothing of theirs; the ledger
                # does, and what they printed is in the worker's work folder.
                status = self.batch_state(batch_id)[0]
                if status not in ("written", "committed"):
                    raise CampaignFailure(f"two drivers of batch {batch_id} on the cluster (the second started "
                                          f"{landed}): neither staged the batch (it is {status})")
                if self._driver_said(f"fenced: batch {batch_id} attempt"):
                    return f"a second driver started {landed} on the cluster: one staged the batch, one was fenced"
                if self._driver_said(f'{{"batch_id": {batch_id}, "staged": false}}'):
                    return f"a second driver started {landed} on the cluster: one staged the batch, one found it so"
                raise CampaignFailure(
                    f"two drivers of batch {batch_id} on the cluster (the second started {landed}): one staged the "
                    "batch, but the other neither said it was fenced nor found the batch staged (their output: "
                    "the worker's work folder, driver-*/stdout and stderr)")
            first = hook._submit_sp.returncode if hook._submit_sp is not None else None
            # The second begins the newer attempt: it publishes and fences the first, or finds the batch written.
            if (first, second.returncode) == (EXIT_FENCED, 0):
                return f"a second driver started {landed}: it published the batch, the first was fenced"
            if (first, second.returncode) == (0, 0) and '"staged": false' in second.stdout:
                return f"a second driver started {landed}: it found the batch written by the first"
            raise CampaignFailure(
                f"two drivers of batch {batch_id} (the second started {landed}): not one published and the other "
                f"fenced (exit codes {first} and {second.returncode}; the second's last lines: "
                f"{' | '.join(second.stderr.splitlines()[-3:])})")
        return strike

    @staticmethod
    def _driver_said(line: str) -> bool:
        """Whether a driver on the local cluster's worker printed `line` (its output is in the worker's work folder)."""
        work = Path(os.environ.get("KL_STATE", PROJECT_ROOT / ".stack")) / "spark-work"
        return any(line in output.read_text(errors="replace") for output in work.glob("driver-*/std*"))

    def _strike_stack(self, delay: float, missed: str, commands: tuple[str, ...], landed_as: str) -> Callable[..., str]:
        """A fault by scripts/stack.sh `commands`, `delay` seconds after the Spark attempt began."""
        def strike(task: Any, batch_id: int, attempts_before: int, thread: threading.Thread | None = None) -> str:
            # spark-submit's task is a thread driving the hook; the connect runtime's is a process.
            alive = thread if thread is not None else task
            running = alive.is_alive if thread is not None else (lambda: task.poll() is None)
            attempt = attempts_before + 1
            if not self._wait(lambda: self.batch_state(batch_id)[1] >= attempt, alive):
                return f"{missed} missed: the job ended before its attempt began"
            time.sleep(delay)
            landed = self.phase(batch_id, attempt) if running() else "after the job ended"
            for command in commands:
                self._stack(command)
            return f"{landed_as} {landed}"
        return strike

    def _strike_writing(self, missed: str, commands: tuple[str, ...], landed_as: str) -> Callable[..., str]:
        """A fault by scripts/stack.sh `commands` once the Spark work streams its rows (an Iceberg sink's: as Spark
        writes the snapshot's files, before it commits them)."""
        def strike(task: Any, batch_id: int, attempts_before: int, thread: threading.Thread | None = None) -> str:
            # spark-submit's task is a thread driving the hook; the connect runtime's is a process.
            alive = thread if thread is not None else task
            running = alive.is_alive if thread is not None else (lambda: task.poll() is None)
            attempt = attempts_before + 1
            if not self._wait(lambda: self.batch_state(batch_id)[1] >= attempt, alive):
                return f"{missed} missed: the task ended before its attempt began"
            self._until_streaming(batch_id, alive)
            landed = self.phase(batch_id, attempt) if running() else "after the task ended"
            for command in commands:
                self._stack(command)
            return f"{landed_as} {landed}"
        return strike

    def _strike_connect(self, target: str, timing: str, delay: float) -> Callable[..., str]:
        """A fault of the connect runtime, once the task's attempt began: after `delay`, or as rows stream."""
        def strike(proc: launcher.ForkedTask, batch_id: int, attempts_before: int) -> str:
            attempt = attempts_before + 1
            if not self._wait(lambda: self.batch_state(batch_id)[1] >= attempt, proc):
                return f"{target} missed: the task ended before its attempt began"
            self._until_streaming(batch_id, proc, None if timing == "as rows stream" else delay)
            landed = self.phase(batch_id, attempt)
            if target == "task kill":
                if proc.poll() is not None:
                    return f"task kill missed: the task had ended ({landed})"
                os.kill(proc.pid, signal.SIGKILL)
                return f"task SIGKILLed {landed}"
            if target == "server kill":
                self._stack("kill-spark-connect")
                self._stack("start")
                return f"Spark Connect server SIGKILLed {landed}, then started again"
            if target == "server restart":
                self._stack("restart-spark-connect")
                return f"Spark Connect server restarted {landed}"
            # A racing attempt: the same batch's task once more, on the same server, while the first runs.
            racer, _ = self._start_task(["read_and_commit", "--batch-id", str(batch_id)])
            won = self._finish_task(racer) is not None
            return f"a second attempt raced the first {landed}: the second {'committed' if won else 'failed'}"
        return strike

    def network_fault(self, kind: str) -> NetworkFault:
        """The toxic a network fault kind adds (its figures drawn from the campaign's rng), and on which proxy."""
        effect = kind.split("_")[0]
        service = next(name for name in SERVICES if name in kind)
        proxy = {"kafka": kafka_proxy(self.servers), "postgres": POSTGRES, "spark_connect": SPARK_CONNECT}[service]
        rng = self.rng
        toxic = {
            "latency": ("latency", {"latency": rng.randrange(100, 800), "jitter": 50}),
            "slow": ("bandwidth", {"rate": rng.choice([16, 64, 256])}),
            "reset": ("reset_peer", {"timeout": 0}),
            # Both ways, the connections held open: only the task's own bounds end its waits.
            "blackhole": ("timeout", {"timeout": 0}),
            # A slow read (8 KB/s per connection), so that the broker's restart lands while it streams.
            "restart": ("bandwidth", {"rate": 8}),
        }[effect]
        what = {"latency": f"{toxic[1].get('latency')} ms latency", "slow": f"a {toxic[1].get('rate')} KB/s link",
                "reset": "connections reset", "restart": "a broker restart",
                "blackhole": "a blackhole (nothing passes either way)"}[effect]
        streams = ("downstream", "upstream") if effect == "blackhole" else ("downstream",)
        return NetworkFault(kind, effect, service, proxy, toxic, what, streams)

    def _strike_network(self, kind: str, timing: str, delay: float) -> Callable[..., str]:
        """A network fault on the proxy in front of one service, once the task's attempt began: after `delay`,
        or as rows stream; held until the task ends (a latency, a slow link) or for a moment (resets)."""
        fault = self.network_fault(kind)
        effect, service, proxy, toxic, what, streams = (fault.effect, fault.service, fault.proxy, fault.toxic,
                                                        fault.what, fault.streams)

        def strike(proc: launcher.ForkedTask, batch_id: int, attempts_before: int) -> str:
            attempt = attempts_before + 1
            if not self._wait(lambda: self.batch_state(batch_id)[1] >= attempt, proc):
                return f"{what} missed: the task ended before its attempt began"
            name = f"campaign-{kind}"
            try:
                self._until_streaming(batch_id, proc,
                                      None if timing == "as rows stream" or effect == "restart" else delay)
                if effect == "restart":
                    # Only once rows stream: slowed before, the attempt's own look-ups (the retention check of
                    # its begin) would time out, and the task would end before the broker restarted.
                    self.network.add(proxy, f"{name}-downstream", *toxic)
                landed = self.phase(batch_id, attempt)
                if proc.poll() is not None:
                    return f"{what} missed: the task had ended ({landed})"
                if effect == "restart":
                    self._stack("restart-kafka")
                    return f"Kafka broker restarted {landed}, its read slowed to 8 KB/s"
                for stream in streams:
                    self.network.add(proxy, f"{name}-{stream}", *toxic, stream=stream)
                if effect == "reset":
                    time.sleep(1.0)  # every connection that carries data meanwhile is reset
                elif effect == "blackhole":
                    # Until the task fails: its bounds (docs/how-it-works.md#every-wait-is-bounded) end it.
                    self._wait(lambda: False, proc, timeout=BLACKHOLE_LIMIT)
                    if proc.poll() is None:
                        raise CampaignFailure(f"{what} on {SERVICES[service]} from {landed}: the task still waited "
                                              f"after {BLACKHOLE_LIMIT} s ({proc.process_state()})")
                else:
                    self._wait(lambda: False, proc, timeout=60)  # as long as the task runs
                return f"{what} on {SERVICES[service]} from {landed}"
            finally:
                for stream in streams:
                    self.network.remove(proxy, f"{name}-{stream}")
        return strike

    # --- the schema registry's faults (an Avro or Protobuf campaign's) ------------------------------------------------
    def _registry_away(self, task: str) -> Callable[..., str]:
        """The registry SIGKILLed as `task` starts (before it asks the registry anything: its process is still
        importing), and started again once the task ended, so that its retry finds it."""
        def strike(proc: Any, batch_id: int | None = None, attempts_before: int = 0,
                   thread: threading.Thread | None = None) -> str:
            alive = thread if thread is not None else proc
            self._stack("kill-schema-registry")
            self._wait(lambda: False, alive, timeout=300)
            begun = batch_id is not None and self.batch_state(batch_id)[1] > attempts_before
            self._stack("start")
            if batch_id is None:
                # The plan task leaves no mark before it asks, so where the kill landed is not known.
                return f"schema registry SIGKILLed as the {task} started"
            if begun:
                return f"schema registry SIGKILLed as the {task} started: the attempt began all the same (late kill)"
            return f"schema registry SIGKILLed as the {task} started, before the attempt began"
        return strike

    def _registry_restart(self, delay: float) -> Callable[..., str]:
        """The registry stopped and started `delay` seconds after the Spark task started."""
        def strike(proc: Any, batch_id: int, attempts_before: int, thread: threading.Thread | None = None) -> str:
            alive = thread if thread is not None else proc
            running = alive.is_alive if thread is not None else (lambda: proc.poll() is None)
            time.sleep(delay)
            began = self.batch_state(batch_id)[1] > attempts_before
            landed = ((self.phase(batch_id, attempts_before + 1) if began else "before the attempt began")
                      if running() else "after the task ended")
            self._stack("restart-schema-registry")
            # The figures in parentheses: the report groups landings by the words before them.
            return f"schema registry restarted {landed} ({delay}s after the Spark task started)"
        return strike

    def _registry_latency(self, latency: int, task: str) -> Callable[..., str]:
        """Every answer of the registry `latency` ms late, for as long as `task` runs."""
        def strike(proc: Any, batch_id: int | None = None, attempts_before: int = 0,
                   thread: threading.Thread | None = None) -> str:
            alive = thread if thread is not None else proc
            name = f"campaign-latency-registry-{task.replace(' ', '-')}"
            self.network.add(SCHEMA_REGISTRY, name, "latency", {"latency": latency, "jitter": 50})
            try:
                self._wait(lambda: False, alive, timeout=600)
            finally:
                self.network.remove(SCHEMA_REGISTRY, name)
            return f"latency on the schema registry through the {task} ({latency} ms)"
        return strike

    def _new_schema_version(self, delay: float) -> Callable[..., str]:
        """A new version registered `delay` seconds after the Spark task started, the records after it written with
        it (the producer writes all along)."""
        def strike(proc: Any, batch_id: int, attempts_before: int, thread: threading.Thread | None = None) -> str:
            time.sleep(delay)
            schema_id = self.producer.records.evolve()
            began = self.batch_state(batch_id)[1] > attempts_before
            landed = self.phase(batch_id, attempts_before + 1) if began else "before the attempt began"
            return f"a new schema version registered {landed}, the records after it written with it (id {schema_id})"
        return strike

    def _restart_postgres_during(self, point: str) -> Callable[[Any, Path], str]:
        def during(proc: Any, once_dir: Path) -> str:  # a process, or what stands for spark-submit's thread
            # Until the process ends: a spark-submit job on a loaded machine took over 2 minutes to get there (its
            # JVM, its session and the read first). The bound only stops a hung process from holding the campaign.
            deadline = time.monotonic() + 900
            while not (once_dir / point).exists():
                if proc.poll() is not None or time.monotonic() > deadline:
                    return "Postgres restart missed: the commit never reached " + point
                time.sleep(0.02)
            self._stack("restart-postgres")
            (once_dir / f"{point}.resume").touch()
            return f"Postgres restarted with the commit's transaction open at {point}"
        return during

    def _stack(self, command: str) -> None:
        stack_command(command, self.task_log)

    def fault_hooks(self, kind: str) -> tuple[str, RunHooks]:
        rng = self.rng
        low, high = STRIKE_DELAYS[self.runtime]
        if kind in ("kill_spark_submit", "kill_spark_driver"):
            target = "spark-submit" if kind == "kill_spark_submit" else "driver"
            timing = rng.choice(["timed", "first staged rows"])
            delay = round(rng.uniform(low, high), 2)
            variant = _variant(timing, delay)
            return variant, RunHooks(spark_strike=self._strike_spark(target, timing, delay))
        if kind == "two_drivers":
            # The second driver's JVM takes seconds to start: it begins its attempt well after it is launched.
            delay = round(rng.uniform(0.0, 5.0), 2)
            return f"timed ({delay}s after the first attempt began)", RunHooks(spark_strike=self._second_driver(delay))
        if kind in ("kill_task_in_read", "kill_spark_connect", "restart_spark_connect", "racing_attempts"):
            target = {"kill_task_in_read": "task kill", "kill_spark_connect": "server kill",
                      "restart_spark_connect": "server restart", "racing_attempts": "racing attempt"}[kind]
            timing = rng.choice(["timed", "as rows stream"])
            delay = round(rng.uniform(low, high), 2)
            variant = _variant(timing, delay, or_as_rows_stream=True)
            return variant, RunHooks(spark_strike=self._strike_connect(target, timing, delay))
        if kind in NETWORK_FAULTS:
            timing = "as rows stream" if kind == "restart_kafka_streaming" else rng.choice(["timed", "as rows stream"])
            delay = round(rng.uniform(low, high), 2)
            variant = _variant(timing, delay, or_as_rows_stream=True)
            return variant, RunHooks(spark_strike=self._strike_network(kind, timing, delay))
        # An Iceberg sink's commit is lake_publish's, in either runtime: the connect runtime's fail points.
        commit_points = (COMMIT_FAIL_POINTS["connect"] + ICEBERG_FAIL_POINTS if self.iceberg
                         else COMMIT_FAIL_POINTS[self.runtime])
        if kind == "kill_commit":
            point = rng.choice(commit_points)
            return point, RunHooks(commit_failpoints=f"{point}=kill")
        if kind == "restart_postgres_in_commit":
            point = rng.choice(commit_points)
            return point, RunHooks(commit_failpoints=f"{point}=pause",
                                   commit_during=self._restart_postgres_during(point))
        if kind == "restart_kafka_in_read":
            delay = round(rng.uniform(max(low, 0.5) if self.runtime == "connect" else 2.0, high), 2)
            return f"timed ({delay}s after the attempt began)", RunHooks(
                spark_strike=self._strike_stack(delay, "broker restart", ("restart-kafka",), "Kafka broker restarted"))
        if kind == "restart_postgres_in_write":
            return "as the snapshot is written", RunHooks(spark_strike=self._strike_writing(
                "Postgres restart", ("restart-postgres",),
                "the Postgres of the lake's catalog and the ledger restarted"))
        if kind == "kill_registry_in_plan":
            return "as the plan task starts", RunHooks(plan_strike=self._registry_away("plan task"))
        if kind == "kill_registry_in_read":
            return "as the Spark task starts", RunHooks(spark_strike=self._registry_away("Spark task"))
        if kind == "restart_registry":
            delay = round(rng.uniform(0.0, high), 2)
            return f"timed ({delay}s after the Spark task started)", RunHooks(
                spark_strike=self._registry_restart(delay))
        if kind == "latency_registry":
            latency = rng.randrange(100, 800)
            return f"{latency} ms", RunHooks(plan_strike=self._registry_latency(latency, "plan task"),
                                             spark_strike=self._registry_latency(latency, "Spark task"))
        if kind == "new_schema_version":
            delay = round(rng.uniform(0.0, high), 2)
            return f"timed ({delay}s after the Spark task started)", RunHooks(
                spark_strike=self._new_schema_version(delay))
        if kind == "kill_spark_worker":
            delay = round(rng.uniform(low, high), 2)
            return f"timed ({delay}s after the attempt began)", RunHooks(spark_strike=self._strike_stack(
                # A new worker at once: Spark runs the lost tasks there, or the task's retry does.
                delay, "worker kill", ("kill-spark-worker", "cluster"), "Spark worker killed"))
        if kind == "crash_after_plan":
            return "after_plan", RunHooks(plan_failpoints="after_plan=kill")
        if kind == "retry_after_success":
            variant = rng.choice(["spark", "commit", "whole run"])
            return variant, RunHooks(repeat_spark=variant == "spark", repeat_commit=variant == "commit")
        if kind == "racing_runs":
            return rng.choice(["double trigger", "zombie"]), RunHooks()
        raise ValueError(kind)
