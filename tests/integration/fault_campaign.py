"""Fault-injection campaign: sequence-numbered records flow into Kafka while pipeline runs repeat, one fault each.

    bash scripts/fault_campaign.sh --faults 200 --seed 20261121      # sets up the stack, then runs this file

Each iteration runs the pipeline as Airflow runs its DAG, in the Spark runtime under test (`--runtime`):
every task in its own process, task retries, and a Spark task that fails for good marking its batch failed
(the DAG's on_failure_callback). With `connect` the tasks are plan, then read_and_commit (a Spark Connect
client of the warm server that publishes and commits in one transaction); with `submit` they are plan,
the Spark task through the Spark provider's SparkSubmitHook, then commit. One fault, drawn from the seed,
is injected into the iteration's run. The pipeline then recovers by its normal means only (a task
retry, or the next run), and the harness checks, from the ledger and the published tables:

- output ∪ dead letters == the records produced below the positions, as sets of (topic, partition, offset);
- no record twice;
- the committed ranges tile every partition from its start to its position, without gap or overlap;
- no position ever moved back.

At the end the producer stops, runs drain the backlog, every record produced is looked up by its sequence
number (good ones in the output with their content, bad ones in the dead letters with their reason), and
`kafka-ledger verify` reads Kafka back independently. The seed fixes the fault sequence, the variants and
the delays; where a timed kill lands depends on the machine, so the phase each fault hit is reported.
A checkpoint after every iteration lets an interrupted campaign go on with `--resume DIR`.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
PROJECT_ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))

from integration_support import BAD_VALUES, COLUMNS  # noqa: E402

log = logging.getLogger("fault_campaign")

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
        *COMMON_FAULTS,
    ),
}
# On a Spark cluster (KAFKA_LEDGER_SPARK_MASTER=spark://...): the machine running the executors is lost.
CLUSTER_FAULTS = (
    "kill_spark_worker",          # SIGKILL of the worker and its executors mid-read, then a new worker started
)


def campaign_shape(runtime: str, on_cluster: bool) -> str:
    """What a campaign ran on: the Spark runtime, and whether on the local standalone cluster."""
    return f"{runtime}-cluster" if on_cluster else runtime


def fault_kinds(shape: str) -> tuple[str, ...]:
    runtime, _, cluster = shape.partition("-")
    return FAULT_KINDS[runtime] + (CLUSTER_FAULTS if cluster else ())


BAD_EVERY = 50  # every 50th sequence number is a bad record, cycling through BAD_VALUES
# Where the committing task dies: in `connect` its one transaction also holds the freshly copied rows.
COMMIT_FAIL_POINTS = {"connect": ("after_staging", "commit_after_publish", "commit_before_end"),
                      "submit": ("commit_after_publish", "commit_before_end")}
# When a timed fault strikes, after the attempt began: spark-submit spends its first seconds starting a JVM.
STRIKE_DELAYS = {"connect": (0.2, 4.0), "submit": (1.0, 15.0)}


class CampaignFailure(AssertionError):
    """A check failed: a record lost or doubled, a ledger gap or overlap, or a position moving back."""


def fault_schedule(faults: int, rng: random.Random, kinds: tuple[str, ...]) -> list[str]:
    """`faults` fault kinds: every kind once per round of len(kinds), in a seeded order."""
    schedule: list[str] = []
    while len(schedule) < faults:
        round_ = list(kinds)
        rng.shuffle(round_)
        schedule.extend(round_)
    return schedule[:faults]


def record_value(seq: int) -> bytes | None:
    """The value of record `seq`: a good impression, or (every BAD_EVERY-th) one of the bad records."""
    if seq % BAD_EVERY == 0:
        return BAD_VALUES[(seq // BAD_EVERY) % len(BAD_VALUES)][0]
    return json.dumps({"event_id": f"s{seq}", "amount": seq, "price": seq / 4, "ok": seq % 2 == 0,
                       "event_time": "2026-11-21T10:00:00Z"}).encode()


def expected_reason(seq: int) -> str | None:
    return BAD_VALUES[(seq // BAD_EVERY) % len(BAD_VALUES)][1] if seq % BAD_EVERY == 0 else None


class SequenceProducer:
    """Background producer of sequence-numbered records; remembers where each one landed."""

    def __init__(self, servers: str, topic: str, rate: float, landed: dict[tuple[int, int], int] | None = None):
        from confluent_kafka import Producer

        from kafka_ledger.settings import kafka_config

        self.topic = topic
        self.rate = rate
        # With the deployment's Kafka settings (security), as every client of the project; log_level 2: no
        # connection errors while a broker restarts.
        self.producer = Producer(kafka_config(servers, **{"enable.idempotence": True, "acks": "all", "linger.ms": 20,
                                                          "log_level": 2}))
        # (partition, offset) -> seq; a resumed campaign starts from what earlier sessions produced.
        self.landed: dict[tuple[int, int], int] = dict(landed or {})
        self.delivered: Counter = Counter(p for p, _ in self.landed)  # partition -> records delivered
        self.journal: list[tuple[int, int, int]] = []  # landed since the last checkpoint
        self.errors: list[str] = []
        self.next_seq = max(self.landed.values(), default=-1) + 1
        self.quota = self.next_seq
        self.produced_here = self.reports_here = 0
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._produce, name="sequence-producer", daemon=True)
        self.thread.start()

    def allow(self, records: int) -> None:
        """Let the producer write `records` more, at its rate, while runs go on."""
        with self.lock:
            self.quota += records

    def _report(self, seq: int):
        def on_delivery(err, msg) -> None:  # noqa: ANN001 - confluent-kafka callback
            self.reports_here += 1
            if err is not None:
                self.errors.append(f"record {seq}: {err}")
            else:
                self.landed[(msg.partition(), msg.offset())] = seq
                self.delivered[msg.partition()] += 1
                self.journal.append((msg.partition(), msg.offset(), seq))
        return on_delivery

    def _produce(self) -> None:
        started, sent = time.monotonic(), 0
        while not self.stopping.is_set() or self.next_seq < self.quota:
            with self.lock:
                todo = min(self.quota - self.next_seq, 50)
            if todo <= 0:
                self.producer.poll(0.05)
                started, sent = time.monotonic(), 0
                continue
            for _ in range(todo):
                seq = self.next_seq
                while True:
                    try:
                        self.producer.produce(self.topic, key=f"k{seq}".encode(), value=record_value(seq),
                                              on_delivery=self._report(seq))
                        self.produced_here += 1
                        break
                    except BufferError:
                        self.producer.poll(0.1)
                self.next_seq += 1
            sent += todo
            self.producer.poll(0)
            # Keep to the rate, so records keep arriving while the runs read.
            ahead = sent / self.rate - (time.monotonic() - started)
            if ahead > 0:
                time.sleep(min(ahead, 0.5))
        self.producer.flush(300)

    def wait_delivered(self, positions: dict[int, int], timeout: float = 300) -> None:
        """Wait until every offset below `positions` has its delivery report."""
        deadline = time.monotonic() + timeout
        while True:
            self.producer.poll(0)
            counts = dict(self.delivered)
            if all(counts.get(p, 0) >= pos for p, pos in positions.items()):
                return
            if time.monotonic() > deadline:
                raise CampaignFailure(f"delivery reports missing below positions {positions}: have {counts}")
            time.sleep(0.1)

    def settle(self, timeout: float = 300) -> list[tuple[int, int, int]]:
        """Wait until the quota is produced and every record has its report; return (and forget) the new ones."""
        deadline = time.monotonic() + timeout
        while self.next_seq < self.quota or self.reports_here < self.produced_here:
            if time.monotonic() > deadline:
                raise CampaignFailure(f"producer did not settle: {self.next_seq} of {self.quota} produced, "
                                      f"{sum(self.delivered.values())} delivered")
            self.producer.poll(0.1)
        new, self.journal = self.journal, []
        return new

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join()
        if self.errors:
            raise CampaignFailure(f"{len(self.errors)} records were not delivered: {self.errors[:5]}")


def records_by_key(servers: str, topic: str, timeout: float = 300) -> dict[tuple[int, int], int]:
    """Every record of `topic` read back from Kafka: (partition, offset) -> the sequence number in its key."""
    from kafka_ledger.audit import read_back

    return {(m.partition(), m.offset()): int(m.key().decode()[1:]) for m in read_back(servers, [topic], timeout)}


@dataclass
class IterationReport:
    index: int
    fault: str
    variant: str
    retries: int
    outcome: str
    landed: str = ""
    recovery_runs: int = 0
    recovered_by: str = ""
    batches: list[int] = field(default_factory=list)
    produced_so_far: int = 0
    committed_offsets: int = 0
    seconds: float = 0.0


@dataclass
class RunHooks:
    """What to break in a run's first try of each task (later tries run clean, as retries do)."""

    plan_failpoints: str | None = None
    spark_strike: Callable[..., str] | None = None
    commit_failpoints: str | None = None
    commit_during: Callable[[subprocess.Popen, Path], str] | None = None
    repeat_spark: bool = False
    repeat_commit: bool = False


class Campaign:
    """One campaign on one pipeline: the faulted runs, the recovery runs and the checks between them."""

    def __init__(self, pipeline: Any, dsn: str, servers: str, seed: int, faults: int, records_per_fault: int,
                 workdir: Path, rate: float | None = None):
        from kafka_ledger.runtimes import runtime_for

        self.pipeline, self.dsn, self.servers = pipeline, dsn, servers
        self.runtime = runtime_for(pipeline).name
        # The stack's cluster serves both runtimes once KAFKA_LEDGER_SPARK_MASTER names it (scripts/stack.sh).
        self.shape = campaign_shape(self.runtime, os.environ.get("KAFKA_LEDGER_SPARK_MASTER", "").startswith("spark://"))
        self.kinds = fault_kinds(self.shape)
        self.seed, self.faults, self.records_per_fault = seed, faults, records_per_fault
        self.rng = random.Random(seed)
        self.schedule = fault_schedule(faults, self.rng, self.kinds)
        self.workdir = workdir
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.task_log = (workdir / "tasks.log").open("a")
        self.rate = rate or max(records_per_fault / 12.0, 50.0)
        self.topic = pipeline.topics[0]
        self.dag_id = f"kafka_ledger_{pipeline.name}"
        self.positions: dict[int, int] = {}
        self.spark_tasks = 0
        self.runs = 0
        self.variants: dict[str, Counter] = defaultdict(Counter)
        self.iterations: list[IterationReport] = []
        self.counter_lock = threading.Lock()
        # Carried over when a campaign is resumed in a later session (see checkpoint and resume).
        self.started_at: str | None = None
        self.elapsed_before = 0.0
        self.session_started = time.monotonic()
        self.sessions = 0
        self.interruptions: list[str] = []
        self.resumed_landed: dict[tuple[int, int], int] = {}

    # --- the tasks, each in its own process as Airflow runs them --------------------------------------
    def _task_env(self, failpoints: str | None, once_dir: Path | None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("KAFKA_LEDGER_FAILPOINTS")}
        if failpoints:
            env["KAFKA_LEDGER_FAILPOINTS"] = failpoints
            env["KAFKA_LEDGER_FAILPOINTS_ONCE_DIR"] = str(once_dir)
            env["KAFKA_LEDGER_FAILPOINTS_PAUSE_SECONDS"] = "120"
        return env

    def _start_task(self, args: list[str], failpoints: str | None = None) -> tuple[subprocess.Popen, Path]:
        once_dir = self.workdir / "failpoints" / uuid.uuid4().hex[:8]
        cmd = [sys.executable, str(Path(__file__).resolve()), "task", *args, "--pipeline", self.pipeline.name]
        self.task_log.write(f"--- {datetime.now(UTC).isoformat()} {' '.join(args)} failpoints={failpoints}\n")
        self.task_log.flush()
        proc = subprocess.Popen(cmd, env=self._task_env(failpoints, once_dir), stdout=subprocess.PIPE,
                                stderr=self.task_log, text=True)
        return proc, once_dir

    def _finish_task(self, proc: subprocess.Popen, timeout: float = 600) -> dict[str, Any] | None:
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            return None
        if proc.returncode != 0:
            return None
        return json.loads(out.strip().splitlines()[-1])

    def plan_try(self, run_id: str, failpoints: str | None = None) -> dict[str, Any] | None:
        proc, _ = self._start_task(["plan", "--dag-id", self.dag_id, "--run-id", run_id], failpoints)
        return self._finish_task(proc)

    def commit_try(self, batch_id: int, failpoints: str | None = None,
                   during: Callable[[subprocess.Popen, Path], str] | None = None) -> tuple[bool, str]:
        proc, once_dir = self._start_task(["commit", "--batch-id", str(batch_id)], failpoints)
        landed = during(proc, once_dir) if during else ""
        return self._finish_task(proc) is not None, landed

    def spark_try(self, batch_id: int, strike: Callable[..., str] | None = None, failpoints: str | None = None,
                  during: Callable[[subprocess.Popen, Path], str] | None = None) -> tuple[bool, str]:
        """One try of the run's Spark task, in the pipeline's runtime; (succeeded, where a fault landed)."""
        with self.counter_lock:
            self.spark_tasks += 1
        if self.runtime == "connect":
            return self.read_and_commit_try(batch_id, strike, failpoints, during)
        return self.spark_submit_try(batch_id, strike)

    def read_and_commit_try(self, batch_id: int, strike: Callable[..., str] | None = None,
                            failpoints: str | None = None,
                            during: Callable[[subprocess.Popen, Path], str] | None = None) -> tuple[bool, str]:
        """The connect runtime's Spark task: read on the warm server, publish and commit, in its own process."""
        attempts_before = self.batch_state(batch_id)[1]
        proc, once_dir = self._start_task(["read_and_commit", "--batch-id", str(batch_id)], failpoints)
        landed = strike(proc, batch_id, attempts_before) if strike else ""
        if during:
            landed = during(proc, once_dir)
        ok = self._finish_task(proc) is not None
        if failpoints and not during:
            point = failpoints.split("=")[0]
            if (once_dir / point).exists():
                landed = f"task died at {point}, inside its transaction"
        return ok, landed

    def spark_submit_try(self, batch_id: int, strike: Callable[..., str] | None = None,
                         timeout: float = 600) -> tuple[bool, str]:
        from kafka_ledger.runtimes.submit import SPARK_APPLICATION, spark_job_environment, spark_submit_hook
        from kafka_ledger.settings import kafka_settings

        os.environ.update(spark_job_environment(self.dsn, self.servers, kafka_settings()))
        hook = spark_submit_hook(self.pipeline, batch_id)
        attempts_before = self.batch_state(batch_id)[1]
        outcome: dict[str, str] = {}

        def submit() -> None:
            try:
                hook.submit(str(SPARK_APPLICATION))
                outcome["ok"] = "yes"
            except Exception as exc:  # noqa: BLE001 - the Spark task failed, whatever the reason
                outcome["error"] = str(exc)

        thread = threading.Thread(target=submit, name=f"spark-{batch_id}", daemon=True)
        thread.start()
        landed = strike(hook, batch_id, attempts_before, thread) if strike else ""
        thread.join(timeout)
        if thread.is_alive():
            self._kill_process_tree(hook)
            thread.join()
            outcome["error"] = "timed out"
        if "error" in outcome:
            log.info("spark task of batch %s failed: %s", batch_id, outcome["error"][:200])
        return "ok" in outcome, landed

    @staticmethod
    def _kill_process_tree(hook: Any) -> None:
        import psutil

        proc = getattr(hook, "_submit_sp", None)
        if proc is None or proc.poll() is not None:
            return
        for child in psutil.Process(proc.pid).children(recursive=True):
            try:
                child.kill()
            except psutil.Error:
                continue
        proc.kill()

    # --- one run of the DAG -----------------------------------------------------------------------------
    def run(self, run_id: str, retries: int, hooks: RunHooks | None = None) -> tuple[str, int | None, list[str]]:
        """plan -> Spark -> commit with `retries` retries per task; returns (outcome, batch id, landings).

        A task try that failed and was retried adds "retried <task>" to the landings.
        """
        from kafka_ledger.commit import fail_batch

        hooks = hooks or RunHooks()
        landings: list[str] = []
        with self.counter_lock:
            self.runs += 1
        planned = None
        for try_number in range(retries + 1):
            planned = self.plan_try(run_id, hooks.plan_failpoints if try_number == 0 else None)
            if planned is not None:
                break
            if try_number == 0 and hooks.plan_failpoints:
                landings.append("plan task killed after recording its batch")
            if try_number < retries:
                landings.append("retried plan")
        if planned is None:
            return "failed in plan", None, landings
        batch_id = planned["batch_id"]
        if batch_id is None:
            return "nothing to read", None, landings

        connect = self.runtime == "connect"  # the Spark task commits: the commit's faults strike it
        for try_number in range(retries + 1):
            first = try_number == 0
            ok, landed = self.spark_try(batch_id, hooks.spark_strike if first else None,
                                        hooks.commit_failpoints if first and connect else None,
                                        hooks.commit_during if first and connect else None)
            if landed:
                landings.append(landed)
            if ok:
                break
            if try_number < retries:
                landings.append("retried Spark")
        else:
            fail_batch(self.dsn, batch_id, f"Spark task failed after {retries + 1} tries (fault campaign)")
            return "failed in Spark", batch_id, landings
        if hooks.repeat_spark or (connect and hooks.repeat_commit):
            ok, _ = self.spark_try(batch_id)
            landings.append("Spark task run again after success: " + ("no-op" if ok else "FAILED"))
        if connect:
            return "success", batch_id, landings

        for try_number in range(retries + 1):
            ok, landed = self.commit_try(batch_id, hooks.commit_failpoints if try_number == 0 else None,
                                         hooks.commit_during if try_number == 0 else None)
            if landed:
                landings.append(landed)
            if try_number == 0 and not ok and hooks.commit_failpoints and not landed:
                landings.append(f"commit task died at {hooks.commit_failpoints}")
            if ok:
                break
            if try_number < retries:
                landings.append("retried commit")
        else:
            return "failed in commit", batch_id, landings
        if hooks.repeat_commit:
            result = self.commit_try(batch_id)
            landings.append("commit task run again after success: " + ("no-op" if result[0] else "FAILED"))
        return "success", batch_id, landings

    # --- looking at the ledger --------------------------------------------------------------------------
    def _query(self, statement: str, params: dict[str, Any] | None = None) -> list[tuple]:
        import psycopg2

        with psycopg2.connect(self.dsn, connect_timeout=10) as conn, conn.cursor() as cur:
            cur.execute(statement, params or {})
            rows = cur.fetchall()
        conn.close()
        return rows

    def batch_state(self, batch_id: int) -> tuple[str, int]:
        (row,) = self._query("SELECT status, attempts FROM kafka_ledger.batches WHERE batch_id = %(b)s",
                             {"b": batch_id})
        return row

    def staged_rows(self, batch_id: int, attempt: int) -> int:
        from psycopg2 import sql

        from kafka_ledger.sql import staging_table

        statement = sql.SQL("SELECT count(*) FROM {} WHERE batch_id = %(b)s AND attempt = %(a)s").format(
            staging_table(self.pipeline))
        return self._query(statement, {"b": batch_id, "a": attempt})[0][0]

    def copying(self) -> bool:
        """Whether a task is copying rows into the output table (connect: the query runs, rows stream)."""
        return bool(self._query("SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'COPY%%' AND query LIKE "
                                "%(t)s", {"t": f"%{self.pipeline.output_table}%"})[0][0])

    def phase(self, batch_id: int, attempt: int) -> str:
        status, attempts = self.batch_state(batch_id)
        if self.runtime == "connect":
            if status == "committed" or attempts != attempt:
                return "after the batch was committed (the task was finishing)"
            return "mid-streaming (rows flowing into COPY)" if self.copying() else "before streaming (connect or read)"
        if status in ("written", "committed") or attempts != attempt:
            return "after staging (the job was finishing)"
        return "mid-staging" if self.staged_rows(batch_id, attempt) else "before staging (session start or read)"

    def unfinished_batches(self) -> list[int]:
        return [r[0] for r in self._query(
            "SELECT batch_id FROM kafka_ledger.batches WHERE pipeline = %(p)s AND status IN ('planned', 'written', "
            "'failed')", {"p": self.pipeline.name})]

    # --- faults -------------------------------------------------------------------------------------------
    def _wait(self, condition: Callable[[], bool], alive: threading.Thread | subprocess.Popen,
              timeout: float = 300) -> bool:
        """Wait for `condition` while the Spark task (a thread driving spark-submit, or a process) is alive."""
        is_alive = alive.is_alive if isinstance(alive, threading.Thread) else (lambda: alive.poll() is None)
        deadline = time.monotonic() + timeout
        while is_alive() and time.monotonic() < deadline:
            if condition():
                return True
            time.sleep(0.02)
        return False

    def _strike_spark(self, target: str, timing: str, delay: float) -> Callable[..., str]:
        def strike(hook: Any, batch_id: int, attempts_before: int, thread: threading.Thread) -> str:
            import psutil

            attempt = attempts_before + 1
            if not self._wait(lambda: self.batch_state(batch_id)[1] >= attempt, thread):
                return f"{target} kill missed: the job ended before its attempt began"
            if timing == "first staged rows":
                self._wait(lambda: self.staged_rows(batch_id, attempt) > 0
                           or self.batch_state(batch_id)[0] != "planned", thread)
            else:
                time.sleep(delay)
            landed = self.phase(batch_id, attempt)
            proc = hook._submit_sp
            if proc is None or proc.poll() is not None:
                return f"{target} kill missed: spark-submit had exited ({landed})"
            if target == "spark-submit":
                os.kill(proc.pid, signal.SIGKILL)
            else:
                drivers = []
                for child in psutil.Process(proc.pid).children(recursive=True):
                    try:
                        if any("ingest_batch.py" in part for part in child.cmdline()):
                            drivers.append(child)
                    except psutil.Error:  # exited meanwhile
                        continue
                if not drivers:
                    return f"driver kill missed: no driver process ({landed})"
                for driver in drivers:
                    driver.kill()
            return f"{target} SIGKILLed {landed}"
        return strike

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

    def _strike_connect(self, target: str, timing: str, delay: float) -> Callable[..., str]:
        """A fault of the connect runtime, once the task's attempt began: after `delay`, or as rows stream."""
        def strike(proc: subprocess.Popen, batch_id: int, attempts_before: int) -> str:
            attempt = attempts_before + 1
            if not self._wait(lambda: self.batch_state(batch_id)[1] >= attempt, proc):
                return f"{target} missed: the task ended before its attempt began"
            if timing == "as rows stream":
                self._wait(lambda: self.copying() or self.batch_state(batch_id)[0] != "planned", proc)
            else:
                time.sleep(delay)
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

    def _restart_postgres_during(self, point: str) -> Callable[[subprocess.Popen, Path], str]:
        def during(proc: subprocess.Popen, once_dir: Path) -> str:
            deadline = time.monotonic() + 120
            while not (once_dir / point).exists():
                if proc.poll() is not None or time.monotonic() > deadline:
                    return "Postgres restart missed: the commit never reached " + point
                time.sleep(0.02)
            self._stack("restart-postgres")
            (once_dir / f"{point}.resume").touch()
            return f"Postgres restarted with the commit's transaction open at {point}"
        return during

    def _stack(self, command: str) -> None:
        subprocess.run(["bash", str(PROJECT_ROOT / "scripts" / "stack.sh"), command], check=True,
                       stdout=self.task_log, stderr=self.task_log)

    def fault_hooks(self, kind: str) -> tuple[str, RunHooks]:
        rng = self.rng
        low, high = STRIKE_DELAYS[self.runtime]
        if kind in ("kill_spark_submit", "kill_spark_driver"):
            target = "spark-submit" if kind == "kill_spark_submit" else "driver"
            timing = rng.choice(["timed", "first staged rows"])
            delay = round(rng.uniform(low, high), 2)
            variant = f"{timing}" + (f" ({delay}s after the attempt began)" if timing == "timed" else "")
            return variant, RunHooks(spark_strike=self._strike_spark(target, timing, delay))
        if kind in ("kill_task_in_read", "kill_spark_connect", "restart_spark_connect", "racing_attempts"):
            target = {"kill_task_in_read": "task kill", "kill_spark_connect": "server kill",
                      "restart_spark_connect": "server restart", "racing_attempts": "racing attempt"}[kind]
            timing = rng.choice(["timed", "as rows stream"])
            delay = round(rng.uniform(low, high), 2)
            variant = f"{timing}" + (f" ({delay}s after the attempt began)" if timing == "timed" else "")
            return variant, RunHooks(spark_strike=self._strike_connect(target, timing, delay))
        if kind == "kill_commit":
            point = rng.choice(COMMIT_FAIL_POINTS[self.runtime])
            return point, RunHooks(commit_failpoints=f"{point}=kill")
        if kind == "restart_postgres_in_commit":
            point = rng.choice(COMMIT_FAIL_POINTS[self.runtime])
            return point, RunHooks(commit_failpoints=f"{point}=pause",
                                   commit_during=self._restart_postgres_during(point))
        if kind == "restart_kafka_in_read":
            delay = round(rng.uniform(max(low, 0.5) if self.runtime == "connect" else 2.0, high), 2)
            return f"timed ({delay}s after the attempt began)", RunHooks(
                spark_strike=self._strike_stack(delay, "broker restart", ("restart-kafka",), "Kafka broker restarted"))
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

    def run_iteration(self, index: int, kind: str) -> IterationReport:
        started = time.monotonic()
        variant, hooks = self.fault_hooks(kind)
        retries = self.rng.choice([0, 1, 1])
        run_id = f"campaign__{self.seed}_{index}"
        batches: list[int] = []
        landings: list[str] = []
        if kind == "racing_runs":
            other = run_id if variant == "zombie" else run_id + "_twin"
            results: list[tuple[str, int | None, list[str]]] = []

            def race(racer_run_id: str) -> None:
                try:
                    results.append(self.run(racer_run_id, retries))
                except Exception as exc:  # noqa: BLE001 - reported as the run's outcome, then checked
                    results.append((f"raised {type(exc).__name__}: {exc}", None, []))

            threads = [threading.Thread(target=race, args=(r,)) for r in (run_id, other)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            outcome = " / ".join(r[0] for r in results)
            landings = [landing for r in results for landing in r[2]]
            batches = sorted({r[1] for r in results if r[1] is not None})
            landings.insert(0, f"two runs raced ({variant})")
        else:
            outcome, batch_id, landings = self.run(run_id, retries, hooks)
            batches = [batch_id] if batch_id is not None else []
            if kind == "retry_after_success" and variant == "whole run" and outcome == "success":
                again = self.run(run_id, retries)
                landings.append(f"whole run cleared and run again: {again[0]}")
                batches += [again[1]] if again[1] is not None else []
        retried = [landing for landing in landings if landing.startswith("retried ")]
        landings = [landing for landing in landings if not landing.startswith("retried ")]
        report = IterationReport(index, kind, variant, retries, outcome, "; ".join(landings), batches=batches)
        report.recovery_runs = self.recover(run_id, batches)
        if report.recovery_runs:
            report.recovered_by = "next run"
        elif retried:
            report.recovered_by = "task retry (" + ", ".join(sorted({r.split()[1] for r in retried})) + ")"
        else:
            report.recovered_by = "nothing to recover"
        report.batches = sorted(set(batches))
        self.check(f"after iteration {index} ({kind}, {variant})")
        report.produced_so_far = self.producer.next_seq
        report.committed_offsets = sum(self.positions.values())
        report.seconds = round(time.monotonic() - started, 1)
        self.variants[kind][variant.split(" (")[0]] += 1
        return report

    def recover(self, run_id: str, batches: list[int]) -> int:
        """Recovery by normal means only: next runs of the pipeline resume what a fault left open."""
        runs = 0
        while self.unfinished_batches():
            runs += 1
            if runs > 3:
                raise CampaignFailure(f"{run_id}: batches {self.unfinished_batches()} still open after 3 recovery runs")
            _, batch_id, _ = self.run(f"{run_id}_recovery{runs}", 1)
            batches += [batch_id] if batch_id is not None else []
        return runs

    # --- checks -------------------------------------------------------------------------------------------
    def check(self, when: str) -> None:
        """output ∪ dead letters == produced below the positions; no duplicate; ledger tiles; no position back."""
        from psycopg2 import sql

        from kafka_ledger.sql import output_table

        rows = self._query("SELECT partition, position, start_offset FROM kafka_ledger.positions "
                           "WHERE pipeline = %(p)s", {"p": self.pipeline.name})
        positions = {p: pos for p, pos, _ in rows}
        starts = {p: start for p, _, start in rows}
        problems = []
        for p, old in self.positions.items():
            if positions.get(p, -1) < old:
                problems.append(f"partition {p}: position moved back from {old} to {positions.get(p)}")
        ranges = defaultdict(list)
        for _, p, start, until in self._query(
            "SELECT topic, partition, from_offset, until_offset FROM kafka_ledger.committed_ranges "
            "WHERE pipeline = %(p)s ORDER BY partition, from_offset", {"p": self.pipeline.name}
        ):
            ranges[p].append((start, until))
        for p, pos in positions.items():
            expected_start = starts[p] or 0
            for start, until in ranges[p]:
                if start != expected_start:
                    what = "gap" if start > expected_start else "overlap"
                    problems.append(f"partition {p}: committed ranges have a {what} at {expected_start}..{start}")
                expected_start = until
            if expected_start != pos:
                problems.append(f"partition {p}: committed ranges end at {expected_start}, position is {pos}")
        self.producer.wait_delivered(positions)
        union = sql.SQL(
            "SELECT kafka_partition, count(*), count(DISTINCT kafka_offset), min(kafka_offset), max(kafka_offset) "
            "FROM (SELECT kafka_partition, kafka_offset FROM {output} UNION ALL SELECT kafka_partition, kafka_offset "
            "FROM kafka_ledger.dead_letters WHERE pipeline = %(p)s) AS got GROUP BY kafka_partition"
        ).format(output=output_table(self.pipeline))
        got = {p: (n, distinct, lo, hi) for p, n, distinct, lo, hi in self._query(union, {"p": self.pipeline.name})}
        for p, pos in positions.items():
            n, distinct, lo, hi = got.get(p, (0, 0, None, None))
            if n != distinct:
                problems.append(f"partition {p}: {n - distinct} offsets published twice")
            # Offsets of a non-transactional producer are contiguous: [0, position) exactly, each once.
            if distinct != pos or (pos and (lo != 0 or hi != pos - 1)):
                problems.append(f"partition {p}: {distinct} distinct offsets in [{lo}, {hi}] published, "
                                f"expected exactly [0, {pos})")
        if problems:
            raise CampaignFailure(f"{when}: " + "; ".join(problems))
        self.positions = positions

    def final_check(self) -> dict[str, int]:
        """Every record produced, by sequence number: good ones in the output with their content, bad ones
        in the dead letters with their reason; then `kafka-ledger verify` against Kafka itself."""
        from psycopg2 import sql

        from kafka_ledger.sql import output_table
        from kafka_ledger.verify import verify_pipeline

        output = self._query(sql.SQL("SELECT kafka_partition, kafka_offset, event_id, amount FROM {}").format(
            output_table(self.pipeline)))
        dead = self._query("SELECT kafka_partition, kafka_offset, error FROM kafka_ledger.dead_letters "
                           "WHERE pipeline = %(p)s", {"p": self.pipeline.name})
        seen = Counter([(p, o) for p, o, _, _ in output] + [(p, o) for p, o, _ in dead])
        produced = self.producer.landed
        lost = [rid for rid in produced if rid not in seen]
        duplicated = [rid for rid, n in seen.items() if n > 1]
        unexpected = [rid for rid in seen if rid not in produced]
        wrong = []
        for p, o, event_id, amount in output:
            seq = produced.get((p, o))
            if seq is not None and (expected_reason(seq) is not None or (event_id, amount) != (f"s{seq}", seq)):
                wrong.append(f"{p}/{o}: row {event_id},{amount} for record {seq}")
        for p, o, error in dead:
            seq = produced.get((p, o))
            if seq is not None and expected_reason(seq) != error:
                wrong.append(f"{p}/{o}: dead letter {error!r} for record {seq}")
        report = verify_pipeline(self.dsn, self.servers, self.pipeline, full=True)
        figures = {"records_produced": len(produced), "output_rows": len(output), "dead_letters": len(dead),
                   "lost": len(lost), "duplicated": len(duplicated), "unexpected": len(unexpected),
                   "wrong_content": len(wrong), "verify_ok": report.ok}
        if lost or duplicated or unexpected or wrong or not report.ok:
            raise CampaignFailure(f"final check: {figures}; lost {lost[:5]}, duplicated {duplicated[:5]}, "
                                  f"unexpected {unexpected[:5]}, wrong {wrong[:5]}, verify {report.problems[:3]}")
        return figures

    # --- the campaign --------------------------------------------------------------------------------------
    # --- checkpoints: a campaign longer than a working session goes on in the next one ----------------
    def elapsed(self) -> float:
        return round(self.elapsed_before + time.monotonic() - self.session_started, 1)

    def checkpoint(self) -> None:
        """After an iteration: the records produced so far (appended to landed.tsv) and the state (state.json)."""
        new = self.producer.settle()
        with (self.workdir / "landed.tsv").open("a") as journal:
            journal.writelines(f"{p}\t{o}\t{seq}\n" for p, o, seq in new)
        version, internal, gauss = self.rng.getstate()
        state = {
            "seed": self.seed, "faults": self.faults, "records_per_fault": self.records_per_fault,
            "pipeline": self.pipeline.name, "rng": [version, list(internal), gauss],
            "iterations": [asdict(it) for it in self.iterations],
            "positions": {str(p): pos for p, pos in self.positions.items()},
            "runs": self.runs, "spark_tasks": self.spark_tasks, "runtime": self.runtime, "shape": self.shape,
            "variants": {k: dict(v) for k, v in self.variants.items()},
            "started_at": self.started_at, "elapsed_seconds": self.elapsed(), "sessions": self.sessions,
            "interruptions": self.interruptions,
        }
        partial = self.workdir / "state.json.partial"
        partial.write_text(json.dumps(state))
        os.replace(partial, self.workdir / "state.json")

    @classmethod
    def resume(cls, pipeline: Any, dsn: str, servers: str, workdir: Path) -> Campaign:
        """The campaign saved in `workdir`, ready to go on after its last completed iteration."""
        state = json.loads((workdir / "state.json").read_text())
        campaign = cls(pipeline, dsn, servers, state["seed"], state["faults"], state["records_per_fault"], workdir)
        version, internal, gauss = state["rng"]
        campaign.rng.setstate((version, tuple(internal), gauss))
        campaign.iterations = [IterationReport(**it) for it in state["iterations"]]
        campaign.positions = {int(p): pos for p, pos in state["positions"].items()}
        campaign.runs, campaign.spark_tasks = state["runs"], state["spark_tasks"]
        for kind, variants in state["variants"].items():
            campaign.variants[kind] = Counter(variants)
        campaign.started_at, campaign.elapsed_before = state["started_at"], state["elapsed_seconds"]
        campaign.sessions, campaign.interruptions = state["sessions"], state["interruptions"]
        landed: dict[tuple[int, int], int] = {}
        for line in (workdir / "landed.tsv").read_text().splitlines():
            fields = line.split("\t")
            if len(fields) == 3:  # a line cut short by the interruption is read back from Kafka below
                landed[(int(fields[0]), int(fields[1]))] = int(fields[2])
        # Records produced after the last checkpoint lost their delivery reports with the process: Kafka
        # has them, and each record's key carries its sequence number.
        in_kafka = records_by_key(servers, campaign.topic)
        conflicts = [rid for rid, seq in landed.items() if in_kafka.get(rid, seq) != seq]
        vanished = sorted(rid for rid in landed if rid not in in_kafka)
        if conflicts or vanished:
            raise CampaignFailure(f"Kafka no longer holds the records it acknowledged before the interruption: "
                                  f"{len(vanished)} gone (e.g. {vanished[:5]}), {len(conflicts)} replaced "
                                  f"(e.g. {conflicts[:5]}); the campaign cannot go on, start a new one")
        campaign.resumed_landed = {**in_kafka, **landed}
        return campaign

    def run_all(self, progress: Callable[[str], None] = print) -> dict[str, Any]:
        self.session_started = time.monotonic()
        self.sessions += 1
        self.started_at = self.started_at or datetime.now(UTC).isoformat(timespec="seconds")
        self.producer = SequenceProducer(self.servers, self.topic, self.rate, landed=self.resumed_landed)
        try:
            if self.iterations:
                # Resumed: the interruption (processes killed mid-iteration, services restarted) is recovered
                # by the next runs, like any fault, and checked before the campaign goes on.
                runs = self.recover(f"campaign__{self.seed}_session{self.sessions}", [])
                self.check(f"after resuming in session {self.sessions}")
                note = (f"session {self.sessions} resumed after iteration {len(self.iterations)}: "
                        f"{runs} recovery run(s), checks OK")
                self.interruptions.append(note)
                progress(note)
            for index, kind in enumerate(self.schedule, start=1):
                if index <= len(self.iterations):
                    continue  # done in an earlier session
                self.producer.allow(self.records_per_fault)
                report = self.run_iteration(index, kind)
                self.iterations.append(report)
                self.checkpoint()
                progress(f"[{index}/{self.faults}] {kind} ({report.variant}): {report.outcome}; {report.landed}; "
                         f"recovered by {report.recovered_by}; checks OK; {report.produced_so_far} produced, "
                         f"{report.committed_offsets} committed, {report.seconds}s")
        finally:
            self.producer.stop()
        # Drain: plain runs until nothing is left to read, then the full record-by-record check.
        drain_runs = 0
        while True:
            drain_runs += 1
            outcome, batch_id, _ = self.run(f"campaign__{self.seed}_drain{drain_runs}", 1)
            if batch_id is None and outcome == "nothing to read":
                break
            if drain_runs > 50:
                raise CampaignFailure("the backlog did not drain in 50 runs")
            self.check(f"after drain run {drain_runs}")
        figures = self.final_check()
        progress(f"final check OK: {figures}")
        phases: dict[str, Counter] = defaultdict(Counter)
        for it in self.iterations:
            for landing in it.landed.split("; "):
                if landing:
                    phases[it.fault][landing.split(" (")[0] if "missed" not in landing else landing] += 1
        return {
            "seed": self.seed,
            "faults_injected": len(self.iterations),
            "faults_by_kind": dict(Counter(it.fault for it in self.iterations)),
            "fault_variants": {k: dict(v) for k, v in self.variants.items()},
            "fault_landings": {k: dict(v) for k, v in phases.items()},
            "recovered_by": dict(Counter(it.recovered_by for it in self.iterations)),
            **figures,
            "records_per_fault": self.records_per_fault,
            "partitions": len(self.positions),
            "pipeline_runs": self.runs,
            "spark_tasks": self.spark_tasks,
            "runtime": self.runtime,
            "shape": self.shape,
            "drain_runs": drain_runs,
            "started_at": self.started_at,
            "elapsed_seconds": self.elapsed(),
            "sessions": self.sessions,
            "interruptions": self.interruptions,
            "iterations": [asdict(it) for it in self.iterations],
        }


# --- the task processes -------------------------------------------------------------------------------------
def task_main(argv: list[str]) -> int:
    """One task of a pipeline run, in its own process: `task plan|commit|read_and_commit ...`.

    read_and_commit is the connect runtime's Spark task (ReadAndCommitOperator's work).
    """
    parser = argparse.ArgumentParser(prog="fault_campaign.py task")
    parser.add_argument("task", choices=["plan", "commit", "read_and_commit"])
    parser.add_argument("--pipeline", required=True)
    parser.add_argument("--dag-id")
    parser.add_argument("--run-id")
    parser.add_argument("--batch-id", type=int)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s %(message)s")
    from kafka_ledger import commit, planner
    from kafka_ledger.config import get_pipeline
    from kafka_ledger.settings import bootstrap_servers, ledger_dsn

    pipeline = get_pipeline(args.pipeline)
    if args.task == "plan":
        planned = planner.plan_batch(ledger_dsn(), bootstrap_servers(), pipeline, dag_id=args.dag_id,
                                     run_id=args.run_id)
        print(json.dumps({"batch_id": planned.batch_id, "resumed": planned.resumed, "offsets": planned.offsets}))
    elif args.task == "read_and_commit":
        from kafka_ledger.runtimes.connect import ConnectBatch

        result = ConnectBatch(pipeline, args.batch_id).run(ledger_dsn(), bootstrap_servers())
        print(json.dumps({"batch_id": result.batch_id, "already_committed": result.already_committed}))
    else:
        result = commit.commit_batch(ledger_dsn(), pipeline, args.batch_id)
        print(json.dumps({"batch_id": result.batch_id, "already_committed": result.already_committed}))
    return 0


HOSTILE_CASES = [
    ("a transactional producer with an aborted transaction: commit markers at range edges, a batch whose "
     "range holds no data record at all", "test_hostile_topics.py"),
    ("a compacted topic: gaps at and inside ranges, a batch of compacted-away offsets, records compacted "
     "away after they were read", "test_hostile_topics.py"),
    ("retention deleting unread data: the plan fails naming the lost ranges; with `on_data_loss: skip` "
     "they are recorded as skipped and shown by `kafka-ledger status`", "test_pipeline_dag.py, test_hostile_topics.py"),
    ("partitions added between runs", "test_ledger.py"),
    ("a topic deleted: the plan fails naming it, nothing moves", "test_hostile_topics.py"),
    ("an empty topic", "test_hostile_topics.py"),
    ("a batch failing after staging, the pipeline's code changing, the resumed batch published with the new "
     "code (upgrade safety)", "test_upgrade_safety.py"),
]
BAD_RECORDS = ("malformed JSON, non-UTF-8 bytes, a null value (tombstone), a null key (published: ordinary "
               "Kafka), a missing required field, a wrong type, an object where a string is declared, "
               "unexpected extra fields (`extra_fields: dead_letter`), values near the broker's maximum "
               "message size (valid: published; malformed: dead-lettered with the raw bytes kept), deeply "
               "nested JSON, a huge number and an invalid timestamp: each checked by its exact reason in "
               "`test_bad_records.py`")


RUNTIMES = {
    "connect": "Spark 4.0.0 on the warm Spark Connect server (local[*]), the task publishing and committing in "
               "one transaction",
    "submit": "Spark 4.0.0 local[*] through one spark-submit per batch, staging then committing",
    "connect-cluster": "Spark 4.0.0 on the Spark Connect server whose executors run on the local standalone "
                       "cluster (one master, one worker), the task publishing and committing in one transaction",
    "submit-cluster": "Spark 4.0.0 through one spark-submit per batch on the local standalone cluster (one master, "
                      "one worker), staging then committing",
}


def render_campaign(data: dict[str, Any], iterations: list[dict[str, Any]]) -> list[str]:
    """The section of docs/reliability.md for one runtime's last campaign."""
    shape = data.get("shape", data.get("runtime", "submit"))
    full = data["faults_injected"] >= 200 and data["records_produced"] >= 1_000_000
    hours, rest = divmod(int(data["elapsed_seconds"]), 3600)
    took = f"{hours} h {rest // 60} min" if hours else f"{rest // 60} min {rest % 60} s"
    recovered: dict[str, Counter] = defaultdict(Counter)
    for it in iterations:
        recovered[it["fault"]][it["recovered_by"]] += 1
    runtime, _, cluster = shape.partition("-")
    lines = [f"## Runtime `{runtime}`" + (" on a Spark cluster" if cluster else ""), ""]
    if not full:
        lines += ["**This is not a full campaign** (at least 200 faults over at least 1,000,000 records): "
                  "it is the last shorter one.", ""]
    sessions = data.get("sessions", 1)
    lines += [
        f"Commit `{data.get('git_commit', '?')}`, started {data['started_at']}, took {took} "
        f"on a 2-core machine (Kafka 4.1.1 KRaft, PostgreSQL 15, {RUNTIMES[shape]})"
        + (f", over {sessions} working sessions: the campaign was resumed from its "
           "last checkpoint, every process of the interrupted iteration having been "
           "killed and the services restarted; the next runs recovered and the checks "
           "passed before it went on (" + "; ".join(data.get("interruptions", [])) + ")"
           if sessions > 1 else "") + ".",
        "",
        "| | |",
        "| --- | --- |",
        f"| faults injected | {data['faults_injected']} |",
        f"| records produced | {data['records_produced']:,} |",
        f"| published rows | {data['output_rows']:,} |",
        f"| dead letters (bad records, each with its expected reason) | {data['dead_letters']:,} |",
        f"| **lost** | **{data['lost']}** |",
        f"| **duplicated** | **{data['duplicated']}** |",
        f"| rows for records never produced | {data['unexpected']} |",
        f"| rows or dead letters with the wrong content | {data['wrong_content']} |",
        f"| `kafka-ledger verify` against Kafka | {'OK' if data['verify_ok'] else 'FAILED'} |",
        f"| pipeline runs / Spark task tries | {data['pipeline_runs']} / "
        f"{data.get('spark_tasks', data.get('spark_submits'))} |",
        "",
        "Every check passed after every fault: output ∪ dead letters equal to the records produced below the "
        "positions as sets of (topic, partition, offset), no record twice, committed ranges tiling each "
        "partition without gap or overlap, no position moving back.",
        "",
        "| fault | injected | variants | where it landed | recovered by |",
        "| --- | --- | --- | --- | --- |",
    ]

    def cell(counter: dict[str, int]) -> str:
        return "<br>".join(f"{name}: {n}" for name, n in sorted(counter.items(), key=lambda kv: -kv[1]))

    for kind in fault_kinds(shape):
        lines.append(f"| `{kind}` | {data['faults_by_kind'].get(kind, 0)} | "
                     f"{cell(data['fault_variants'].get(kind, {}))} | {cell(data['fault_landings'].get(kind, {}))} "
                     f"| {cell(recovered.get(kind, {}))} |")
    lines += [
        "",
        "Reproduce:",
        "",
        "```bash",
        data["command"],
        "```",
        "",
    ]
    return lines


def render_report(campaigns: dict[str, tuple[dict[str, Any], list[dict[str, Any]]]]) -> str:
    """docs/reliability.md: each runtime's last campaign, how to reproduce it, and what else is tested."""
    lines = [
        "# Reliability report",
        "",
        "Generated by `tests/integration/fault_campaign.py --write-docs` from the last campaign of each Spark "
        "runtime; the same figures are in [reliability.json](reliability.json), every iteration in "
        "`reliability-<runtime>-iterations.json`. How the campaign works: "
        "[testing.md](testing.md#fault-campaign).",
        "",
    ]
    for runtime in sorted(campaigns, key=list(RUNTIMES).index):
        lines += render_campaign(*campaigns[runtime])
    lines += [
        "\"Where it landed\" is the phase of the batch the fault found; a timed fault that found the job "
        "already finishing is listed as such. \"Recovered by\" is what completed the batch the fault hit: the "
        "failed task's retry, the next run (when the faulted run had no retries left), or nothing (the fault "
        "did no harm, as a retry after success should). The seed fixes the fault sequence, variants and "
        "delays; where a timed fault lands depends on the machine's speed.",
        "",
        "## Hostile topics and bad records",
        "",
        "Each has its own test in `tests/integration/`, run in CI with exact (topic, partition, offset) sets:",
        "",
        *[f"- {case} (`{where}`)" for case, where in HOSTILE_CASES],
        f"- bad records: {BAD_RECORDS}.",
        "",
        f"The campaign's own producer also writes one bad record in {BAD_EVERY}, cycling through malformed "
        "JSON, a missing required field, a wrong type, non-UTF-8 bytes and a tombstone.",
        "",
    ]
    return "\n".join(lines)


def write_docs(report: dict[str, Any], command: str, docs: Path) -> None:
    """A campaign's figures into `docs` (reliability-<runtime>.json and -iterations.json), then
    reliability.json and reliability.md again, from the last campaign of every runtime found there."""
    shape = report.get("shape", report["runtime"])
    data = {"command": command, **{k: v for k, v in report.items() if k != "iterations"}}
    docs.mkdir(parents=True, exist_ok=True)
    (docs / f"reliability-{shape}.json").write_text(json.dumps(data, indent=2) + "\n")
    (docs / f"reliability-{shape}-iterations.json").write_text(json.dumps(report["iterations"], indent=1) + "\n")
    campaigns = {}
    for name in RUNTIMES:
        figures = docs / f"reliability-{name}.json"
        if figures.exists():
            campaigns[name] = (json.loads(figures.read_text()),
                               json.loads((docs / f"reliability-{name}-iterations.json").read_text()))
    (docs / "reliability.json").write_text(json.dumps({name: c[0] for name, c in campaigns.items()}, indent=2) + "\n")
    (docs / "reliability.md").write_text(render_report(campaigns))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["task"]:
        return task_main(argv[1:])
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--faults", type=int, default=16, help="iterations, one fault each (default 16)")
    parser.add_argument("--seed", type=int, default=20261121, help="random seed of the fault sequence")
    parser.add_argument("--records-per-fault", type=int, default=5000,
                        help="records produced during each iteration (default 5000)")
    parser.add_argument("--partitions", type=int, default=4, help="partitions of the campaign's topic (default 4)")
    parser.add_argument("--runtime", choices=list(FAULT_KINDS),
                        help="Spark runtime under test (default: the deployment's, $KAFKA_LEDGER_SPARK_RUNTIME)")
    parser.add_argument("--cluster", action="store_true",
                        help="on the local Spark standalone cluster (scripts/fault_campaign.sh --cluster starts it and "
                             "sets KAFKA_LEDGER_SPARK_MASTER), adding the fault kill_spark_worker")
    parser.add_argument("--write-docs", type=Path, metavar="DIR",
                        help="write reliability.json (and the per-iteration log) into DIR, e.g. docs")
    parser.add_argument("--keep", action="store_true", help="keep the topic, tables and ledger rows afterwards")
    parser.add_argument("--resume", type=Path, metavar="DIR",
                        help="go on with the interrupted campaign saved in DIR (printed when it started)")
    args = parser.parse_args(argv)
    if args.cluster and not os.environ.get("KAFKA_LEDGER_SPARK_MASTER", "").startswith("spark://"):
        parser.error("--cluster: KAFKA_LEDGER_SPARK_MASTER names no cluster: run scripts/fault_campaign.sh --cluster")

    import psycopg2
    import yaml
    from confluent_kafka.admin import AdminClient, NewTopic

    from kafka_ledger.config import get_pipeline
    from kafka_ledger.ledger import delete_pipeline
    from kafka_ledger.settings import bootstrap_servers, deployment_spark_runtime, kafka_config, ledger_dsn

    dsn, servers = ledger_dsn(), bootstrap_servers()
    if args.resume:
        workdir = args.resume.resolve()
        if not (workdir / "state.json").exists():
            parser.error(f"{workdir} holds no saved campaign (state.json): it stopped before its first iteration")
        settings = json.loads((workdir / "campaign.json").read_text())
    else:
        tag = f"{args.seed}_{uuid.uuid4().hex[:6]}"
        workdir = Path(os.environ.get("KL_STATE", PROJECT_ROOT / ".stack")) / "fault-campaign" / tag
        runtime = args.runtime or deployment_spark_runtime()
        command = "bash scripts/fault_campaign.sh " + " ".join(
            f"--{k.replace('_', '-')} {v}" for k, v in (("runtime", runtime), ("faults", args.faults),
                                                        ("seed", args.seed),
                                                        ("records_per_fault", args.records_per_fault),
                                                        ("partitions", args.partitions)))
        if args.cluster:
            command += " --cluster"
        if args.write_docs:
            command += f" --write-docs {args.write_docs}"
        settings = {"command": command, "write_docs": str(args.write_docs) if args.write_docs else None,
                    "keep": args.keep, "pipeline": f"fault_campaign_{tag}", "partitions": args.partitions,
                    "runtime": runtime,
                    "topic": f"fault-campaign-{tag.replace('_', '-')}"}
    workdir.mkdir(parents=True, exist_ok=True)
    # Airflow's logging (which relays the Spark jobs' output) writes to stdout: point stdout at a log file,
    # and keep the console for the progress lines.
    console = os.fdopen(os.dup(sys.stdout.fileno()), "w", buffering=1)
    sys.stdout.flush()
    with (workdir / "campaign.log").open("a") as campaign_log:
        os.dup2(campaign_log.fileno(), sys.stdout.fileno())
    logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    def say(line: str) -> None:
        print(line, file=console, flush=True)

    name, topic, config = settings["pipeline"], settings["topic"], workdir / "pipelines.yaml"
    os.environ["KAFKA_LEDGER_PIPELINES"] = str(config)
    admin = AdminClient(kafka_config(servers))
    if args.resume:
        pipeline = get_pipeline(name)
        campaign = Campaign.resume(pipeline, dsn, servers, workdir)
        say(f"fault campaign resumed from {workdir}: {len(campaign.iterations)} of {campaign.faults} faults done")
    else:
        (workdir / "campaign.json").write_text(json.dumps(settings, indent=2))
        config.write_text(yaml.safe_dump({"pipelines": {name: {
            "topics": [topic], "output_schema": "fault_campaign", "output_table": name, "columns": COLUMNS,
            "max_records_per_partition": max(100, args.records_per_fault // args.partitions), "schedule": None,
            "spark_conf": {"spark.sql.shuffle.partitions": "2"}, "spark_runtime": settings["runtime"],
        }}}))
        # Every acknowledged record on disk at once, so a campaign resumed after the machine stopped still has
        # them all (the broker otherwise leaves flushing to the OS).
        new_topic = NewTopic(topic, num_partitions=args.partitions, replication_factor=1,
                             config={"flush.messages": "1"})
        admin.create_topics([new_topic])[topic].result()
        pipeline = get_pipeline(name)
        campaign = Campaign(pipeline, dsn, servers, args.seed, args.faults, args.records_per_fault, workdir)
        say(f"fault campaign ({campaign.shape}): {args.faults} faults, seed {args.seed}, "
            f"{args.records_per_fault} records per fault, "
            f"topic {topic} ({args.partitions} partitions); logs in {workdir}; if it is interrupted, go on with "
            f"`bash scripts/fault_campaign.sh --resume {workdir}`")
    try:
        report = campaign.run_all(progress=say)
    except CampaignFailure as exc:
        say(f"FAILED: {exc}\nreproduce with: {settings['command']}\nthe topic, tables and ledger rows are kept "
            f"for inspection; logs in {workdir}")
        return 1
    if not settings["keep"]:
        with psycopg2.connect(dsn) as conn, conn.cursor() as cur:
            delete_pipeline(cur, pipeline)
        conn.close()
        admin.delete_topics([topic])[topic].result(timeout=30)
    report["git_commit"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=PROJECT_ROOT,
                                          capture_output=True, text=True).stdout.strip()
    summary = {k: v for k, v in report.items() if k != "iterations"}
    say(json.dumps(summary, indent=2))
    if settings["write_docs"]:
        write_docs(report, settings["command"], Path(settings["write_docs"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
