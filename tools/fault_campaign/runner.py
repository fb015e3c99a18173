"""The campaign's runs: the Campaign (its iterations, each a run of the pipeline as Airflow would run it with
one fault, then recovery by the next runs and the checks; checkpoints and resume; the final drain and
record-by-record check), and the `task` sub-command that runs one task of a run in its own process."""

from __future__ import annotations

import argparse
import functools
import json
import logging
import os
import random
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from kafka_ledger.config.settings import kafka_for, schema_registry, services_for, task_services
from tools.fault_campaign import CampaignFailure, launcher
from tools.fault_campaign.network import Toxiproxy, proxied_environment, registry_proxied_environment
from tools.fault_campaign.producer import (
    AvroRecords,
    JsonRecords,
    Landed,
    ProtobufRecords,
    SequenceProducer,
    append_journal,
    change_effect,
    change_event_reason,
    entity_of,
    expected_reason,
    read_journal,
    record_value,
    records_by_key,
)
from tools.fault_campaign.strikes import (
    FaultStrikes,
    RunHooks,
    campaign_shape,
    fault_kinds,
    fault_schedule,
    secured,
)
from tools.fault_campaign.tally import Tally
from tools.fault_campaign.typed_events import TOASTED, TYPED_CAMPAIGN_NAMES, typed_held, unavailable_reason

# The ledger's statement bound in the tasks of a campaign through the proxies.
NETWORK_DB_STATEMENT_SECONDS = 30


log = logging.getLogger("fault_campaign")


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


class Campaign(FaultStrikes):
    """One campaign on one pipeline: the faulted runs, the recovery runs and the checks between them.

    Its faults (fault_hooks and the strikes) are FaultStrikes' (strikes.py).
    """

    def __init__(self, pipeline: Any, dsn: str, servers: str, seed: int, faults: int, records_per_fault: int,
                 workdir: Path, rate: float | None = None, network: bool = False,
                 kinds: tuple[str, ...] | None = None, network_weight: int = 1, typed: bool = False):
        from kafka_ledger.runtimes import runtime_for

        self.pipeline, self.dsn, self.servers = pipeline, dsn, servers
        runtime = runtime_for(pipeline)
        self.runtime = runtime.name
        # The connect runtime's Spark task commits the batch itself: the commit's faults strike that task.
        self.spark_task_commits = runtime.commit_task_id is None
        # The stack's cluster serves both runtimes once KAFKA_LEDGER_SPARK_MASTER names it (scripts/stack.sh).
        # An Iceberg sink: its table read back without Spark (pyiceberg) by the checks, and the lake's faults. In
        # either runtime its Spark work commits the batch (lake_publish): the commit's faults strike it there.
        self.iceberg = pipeline.sink.type == "iceberg"
        self.commits_in_spark = self.spark_task_commits or self.iceberg
        # An entity table (write: upsert): checked against a model of the records below the positions, the newest
        # version (or tombstone) of each entity, instead of record by record.
        self.entity = pipeline.is_entity_table
        # Debezium's change events into the entity table (envelope: debezium): a delete event deletes, a Kafka
        # tombstone changes nothing.
        self.change_events = pipeline.value.envelope == "debezium"
        # ... of the wide typed table (typed_events.py), updates among them that leave TOASTed values unchanged: each
        # entity's values compared, the kept ones from its earlier events.
        self.typed = typed
        if typed and not self.change_events:
            raise CampaignFailure("a typed campaign's records are change events (--envelope debezium)")
        # Avro or Protobuf values through the schema registry: its faults among the kinds, every task reaching it
        # through its proxy.
        self.registered = pipeline.value.format if pipeline.value.format in ("avro", "protobuf") else None
        if self.registered and self.entity:
            raise CampaignFailure(f"a {self.registered} campaign writes an append-only table (--write append)")
        self.shape = campaign_shape(self.runtime, os.environ.get("KAFKA_LEDGER_SPARK_MASTER", "").startswith("spark://"),
                                    network, secured(), self.iceberg, self.registered, self.entity, self.change_events,
                                    self.runtime == "submit" and self.submission.outcome_in_ledger, typed)
        # Network faults: every task reaches the services through Toxiproxy; the campaign's own checks do not.
        self.network_faults = network
        self.network = Toxiproxy() if network or self.registered else None
        if network and self.runtime != "connect":
            raise CampaignFailure("network faults are injected in the connect runtime only")
        if self.network is not None:
            if not self.network.available():
                raise CampaignFailure("network and schema registry faults need the stack's proxies: scripts/stack.sh "
                                      "proxies")
            self.network.reset()  # an interrupted campaign's strike (its clean-up never ran) may have left a toxic
        # `kinds`: a subset of the shape's (a short campaign of some kinds only).
        self.kinds = kinds or fault_kinds(self.shape)
        self.seed, self.faults, self.records_per_fault = seed, faults, records_per_fault
        self.rng = random.Random(seed)
        # A network fault `network_weight` times per round: each network kind 20 times without every other kind
        # 20 times too (the network kinds are 13 of the production shape's 24).
        self.network_weight = network_weight
        self.schedule = fault_schedule(faults, self.rng, self.kinds, network_weight)
        self.workdir = workdir
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.task_log = (workdir / "tasks.log").open("a")
        self._look: Any = None  # the connection of _query's look-ups
        self._look_lock = threading.Lock()
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
        self.resumed_landed = Landed()

    # --- the tasks, each in its own process as Airflow runs them --------------------------------------
    def _task_env(self, failpoints: str | None, once_dir: Path | None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("KAFKA_LEDGER_FAILPOINTS")}
        if self.registered:
            env = registry_proxied_environment(env)
        if self.network_faults:
            env = proxied_environment(env)
            # A blackholed ledger ends a task's wait after the statement bound plus 15 s: 45 s here, not the
            # default's 10 minutes per blackhole (docs/how-it-works.md#every-wait-is-bounded).
            env.setdefault("KAFKA_LEDGER_DB_STATEMENT_TIMEOUT", str(NETWORK_DB_STATEMENT_SECONDS))
        if failpoints:
            env["KAFKA_LEDGER_FAILPOINTS"] = failpoints
            env["KAFKA_LEDGER_FAILPOINTS_ONCE_DIR"] = str(once_dir)
            env["KAFKA_LEDGER_FAILPOINTS_PAUSE_SECONDS"] = "120"
        return env

    def _start_task(self, args: list[str], failpoints: str | None = None) -> tuple[launcher.ForkedTask, Path]:
        once_dir = self.workdir / "failpoints" / uuid.uuid4().hex[:8]
        self.task_log.write(f"--- {datetime.now(UTC).isoformat()} {' '.join(args)} failpoints={failpoints}\n")
        self.task_log.flush()
        proc = launcher.start(task_main, [*args, "--pipeline", self.pipeline.name],
                              self._task_env(failpoints, once_dir), Path(self.task_log.name))
        return proc, once_dir

    def _finish_task(self, proc: launcher.ForkedTask, timeout: float = 600) -> dict[str, Any] | None:
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            return None
        if proc.returncode != 0:
            return None
        return task_result(out)

    def plan_try(self, run_id: str, failpoints: str | None = None,
                 strike: Callable[[launcher.ForkedTask], str] | None = None) -> tuple[dict[str, Any] | None, str]:
        """One try of the plan task: (its result, None if it failed; where a fault landed)."""
        proc, _ = self._start_task(["plan", "--dag-id", self.dag_id, "--run-id", run_id], failpoints)
        landed = strike(proc) if strike else ""
        return self._finish_task(proc), landed

    def commit_try(self, batch_id: int, failpoints: str | None = None,
                   during: Callable[[launcher.ForkedTask, Path], str] | None = None) -> tuple[bool, str]:
        proc, once_dir = self._start_task(["commit", "--batch-id", str(batch_id)], failpoints)
        landed = during(proc, once_dir) if during else ""
        return self._finish_task(proc) is not None, landed

    def spark_try(self, batch_id: int, strike: Callable[..., str] | None = None, failpoints: str | None = None,
                  during: Callable[[launcher.ForkedTask, Path], str] | None = None) -> tuple[bool, str]:
        """One try of the run's Spark task, in the pipeline's runtime; (succeeded, where a fault landed)."""
        with self.counter_lock:
            self.spark_tasks += 1
        if self.spark_task_commits:
            return self.read_and_commit_try(batch_id, strike, failpoints, during)
        return self.spark_submit_try(batch_id, strike, failpoints, during)

    def read_and_commit_try(self, batch_id: int, strike: Callable[..., str] | None = None,
                            failpoints: str | None = None,
                            during: Callable[[launcher.ForkedTask, Path], str] | None = None) -> tuple[bool, str]:
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
                         failpoints: str | None = None, during: Callable[[Any, Path], str] | None = None,
                         timeout: float = 600) -> tuple[bool, str]:
        """The submit runtime's Spark task: spark-submit of the batch's job, driven from a thread. `failpoints`
        (an Iceberg sink's commit faults: its job commits) reach the job's environment alone."""

        from kafka_ledger.runtimes.submit.spark_submit import check_driver_outcome, spark_submit_hook

        submission = self.submission
        # The job reaches the registry through its proxy, as the connect runtime's tasks do (the campaign's own
        # producer keeps the client it made with the registry's own address).
        environment = submission.environment
        os.environ.update(registry_proxied_environment(environment) if self.registered else environment)
        hook = spark_submit_hook(self.pipeline, batch_id, submission)
        once_dir = self.workdir / "failpoints" / uuid.uuid4().hex[:8]
        if failpoints:
            # spark-submit's environment, beside the inherited one (no secret among them): a driver here inherits
            # it, and a standalone master's submission client hands it to a driver on the cluster.
            hook._env = {key: value for key, value in self._task_env(failpoints, once_dir).items()
                         if key.startswith("KAFKA_LEDGER_FAILPOINTS")}
        attempts_before = self.batch_state(batch_id)[1]
        outcome: dict[str, str] = {}

        def submit() -> None:
            try:
                hook.submit(submission.application)
                if submission.outcome_in_ledger:
                    check_driver_outcome(services_for(self.dsn, self.servers), self.pipeline, batch_id,
                                         hook._connection["master"])
                outcome["ok"] = "yes"
            except Exception as exc:  # noqa: BLE001 - the Spark task failed, whatever the reason
                outcome["error"] = str(exc)

        thread = threading.Thread(target=submit, name=f"spark-{batch_id}", daemon=True)
        thread.start()
        landed = strike(hook, batch_id, attempts_before, thread) if strike else ""
        if during:
            landed = during(_ThreadTask(thread), once_dir)
        thread.join(timeout)
        if thread.is_alive():
            self._kill_process_tree(hook)
            thread.join()
            outcome["error"] = "timed out"
        if "error" in outcome:
            log.info("spark task of batch %s failed: %s", batch_id, outcome["error"][:200])
        if failpoints and not during:
            point = failpoints.split("=")[0]
            if (once_dir / point).exists():
                landed = f"Spark job died at {point}, inside its transaction"
        return "ok" in outcome, landed

    @functools.cached_property
    def submission(self) -> Any:
        """How a batch's driver is submitted where the `spark_default` connection puts it (on this machine, or on
        the cluster's worker in cluster deploy mode), as the DAG's Spark task submits it: the same for every batch
        of the campaign, so worked out (the package zipped, the hook read) once."""
        from kafka_ledger.runtimes.submit.spark_submit import batch_submission, spark_submit_hook

        return batch_submission(spark_submit_hook(self.pipeline, 0), services_for(self.dsn, self.servers),
                                self.pipeline)

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
        from kafka_ledger.batch.commit import fail_batch

        hooks = hooks or RunHooks()
        landings: list[str] = []
        with self.counter_lock:
            self.runs += 1
        planned = None
        for try_number in range(retries + 1):
            first = try_number == 0
            planned, landed = self.plan_try(run_id, hooks.plan_failpoints if first else None,
                                            hooks.plan_strike if first else None)
            if landed:
                landings.append(landed)
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

        connect = self.spark_task_commits
        for try_number in range(retries + 1):
            first = try_number == 0
            ok, landed = self.spark_try(batch_id, hooks.spark_strike if first else None,
                                        hooks.commit_failpoints if first and self.commits_in_spark else None,
                                        hooks.commit_during if first and self.commits_in_spark else None)
            if landed:
                landings.append(landed)
            if ok:
                break
            if try_number < retries:
                landings.append("retried Spark")
        else:
            fail_batch(services_for(self.dsn, self.servers), self.pipeline.name, batch_id,
                       f"Spark task failed after {retries + 1} tries (fault campaign)")
            return "failed in Spark", batch_id, landings
        if hooks.repeat_spark or (connect and hooks.repeat_commit):
            ok, _ = self.spark_try(batch_id)
            landings.append("Spark task run again after success: " + ("no-op" if ok else "FAILED"))
        if connect:
            return "success", batch_id, landings

        # The commit task: an Iceberg sink's Spark job committed the batch already, and it finds it so.
        faulted = not self.commits_in_spark
        for try_number in range(retries + 1):
            ok, landed = self.commit_try(batch_id, hooks.commit_failpoints if try_number == 0 and faulted else None,
                                         hooks.commit_during if try_number == 0 and faulted else None)
            if landed:
                landings.append(landed)
            if try_number == 0 and not ok and faulted and hooks.commit_failpoints and not landed:
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
        """The rows of one look-up, on the campaign's own connection: the strikes look dozens of times a second,
        and a connection each time cost the machine more than the tasks they watch (a Postgres backend and a
        SCRAM exchange: 9 ms of CPU, 0.15 ms for a query). Made again once after a restart of Postgres broke it."""
        import psycopg2

        with self._look_lock:
            for retry in (False, True):
                try:
                    if self._look is None or self._look.closed:
                        self._look = psycopg2.connect(self.dsn, connect_timeout=10)
                        self._look.autocommit = True
                    with self._look.cursor() as cur:
                        cur.execute(statement, params or {})
                        return cur.fetchall()
                except (psycopg2.OperationalError, psycopg2.InterfaceError):
                    if self._look is not None:
                        self._look.close()
                    self._look = None
                    if retry:
                        raise
        raise AssertionError("unreachable")

    def batch_state(self, batch_id: int) -> tuple[str, int]:
        (row,) = self._query("SELECT status, attempts FROM kafka_ledger.batches WHERE batch_id = %(b)s",
                             {"b": batch_id})
        return row

    def unfinished_batches(self) -> list[int]:
        return [r[0] for r in self._query(
            "SELECT batch_id FROM kafka_ledger.batches WHERE pipeline = %(p)s AND status IN ('planned', 'written', "
            "'failed')", {"p": self.pipeline.name})]

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
        if not landings and kind != "retry_after_success":
            landings = [f"missed: the run found {outcome!r}, no batch for the fault to strike"]
        report = IterationReport(index, kind, variant, retries, outcome, "; ".join(landings), batches=batches)
        if self.network is not None:
            self.network.reset()  # no toxic outlives the faulted run, whatever stopped its strike
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
    def _output_rows(self, names: list[str]) -> list[tuple]:
        """The output's rows, these columns of them: from the Postgres table, or from the Iceberg table read back
        without Spark."""
        from psycopg2 import sql

        from kafka_ledger.sinks import IcebergSink
        from kafka_ledger.sinks.postgres.sql import output_table

        if not self.iceberg:
            return self._query(sql.SQL("SELECT {} FROM {}").format(
                sql.SQL(", ").join(sql.Identifier(n) for n in names), output_table(self.pipeline)))
        table = IcebergSink(self.pipeline).table()
        if table.current_snapshot() is None:
            return []
        rows = table.scan(selected_fields=tuple(names)).to_arrow()
        return list(zip(*(rows.column(n).to_pylist() for n in names), strict=True))

    def _output_chunks(self, names: list[str], size: int = 1_000_000) -> Iterator[list[np.ndarray]]:
        """The output's rows, these columns of them, as arrays of at most `size` rows at a time: a campaign's output
        may be a hundred million rows (from Postgres through a named cursor; an Iceberg table's, small, at once)."""
        import psycopg2
        from psycopg2 import sql

        from kafka_ledger.sinks.postgres.sql import output_table

        def columns(rows: list[tuple]) -> list[np.ndarray]:
            return [np.array(column, dtype=object if isinstance(column[0], str) else None)
                    for column in zip(*rows, strict=True)]

        if self.iceberg:
            rows = self._output_rows(names)
            if rows:
                yield columns(rows)
            return
        with psycopg2.connect(self.dsn) as conn, conn.cursor(name="campaign_output") as cur:
            cur.execute(sql.SQL("SELECT {} FROM {}").format(sql.SQL(", ").join(sql.Identifier(n) for n in names),
                                                            output_table(self.pipeline)))
            while rows := cur.fetchmany(size):
                yield columns(rows)
        conn.close()

    def _partition_stats(self, partitions: list[int], since: dict[int, int]
                         ) -> dict[int, tuple[int, int, int | None, int | None]]:
        """Per partition of these, of the output ∪ the dead letters from the partition's offset in `since` on (0 if
        not in it): records, distinct offsets, the lowest and the highest. Only the rows past the last check's
        positions: over the whole output, each check would read a 60,000 records/s campaign's hundred million rows
        again (the final check reads them all, once)."""
        from psycopg2 import sql

        from kafka_ledger.sinks.postgres.sql import output_table

        if not self.iceberg:  # in Postgres, aggregated there, through the output's key (topic, partition, offset)
            union = sql.SQL(
                "SELECT kafka_partition, count(*), count(DISTINCT kafka_offset), min(kafka_offset), max(kafka_offset) "
                "FROM unnest(%(partitions)s::int[], %(since)s::bigint[]) AS since(kafka_partition, from_offset) "
                "CROSS JOIN LATERAL (SELECT kafka_offset FROM {output} o WHERE o.kafka_topic = %(topic)s "
                "AND o.kafka_partition = since.kafka_partition AND o.kafka_offset >= since.from_offset UNION ALL "
                "SELECT kafka_offset FROM kafka_ledger.dead_letters d WHERE d.pipeline = %(p)s "
                "AND d.kafka_partition = since.kafka_partition AND d.kafka_offset >= since.from_offset) AS got "
                "GROUP BY kafka_partition"
            ).format(output=output_table(self.pipeline))
            rows = self._query(union, {"p": self.pipeline.name, "topic": self.topic, "partitions": partitions,
                                       "since": [since.get(p, 0) for p in partitions]})
            return {p: (n, distinct, lo, hi) for p, n, distinct, lo, hi in rows}
        offsets = defaultdict(list)
        dead = self._query("SELECT kafka_partition, kafka_offset FROM kafka_ledger.dead_letters WHERE pipeline = %(p)s",
                           {"p": self.pipeline.name})
        for p, o in self._output_rows(["kafka_partition", "kafka_offset"]) + dead:
            if p in partitions and o >= since.get(p, 0):
                offsets[p].append(o)
        return {p: (len(o), len(set(o)), min(o), max(o)) for p, o in offsets.items()}

    def check(self, when: str) -> None:
        """output ∪ dead letters == produced below the positions; no duplicate; ledger tiles; no position back."""
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
        if self.entity:
            problems += [f"entity {what}" for what in self._entity_differences(positions)[:5]]
            if problems:
                raise CampaignFailure(f"{when}: " + "; ".join(problems))
            self.positions = positions
            return
        # Since the last check's positions, checked up to them then: the final check reads every row again.
        got = self._partition_stats(sorted(positions), self.positions)
        for p, pos in positions.items():
            n, distinct, lo, hi = got.get(p, (0, 0, None, None))
            old = self.positions.get(p, 0)
            if n != distinct:
                problems.append(f"partition {p}: {n - distinct} offsets published twice")
            # Offsets of a non-transactional producer are contiguous: [old, position) exactly, each once.
            if distinct != pos - old or (pos > old and (lo != old or hi != pos - 1)):
                problems.append(f"partition {p}: {distinct} distinct offsets in [{lo}, {hi}] published since "
                                f"{old}, expected exactly [{old}, {pos})")
        if self.iceberg:
            problems += self._snapshot_problems()
        if problems:
            raise CampaignFailure(f"{when}: " + "; ".join(problems))
        self.positions = positions

    def _snapshot_problems(self) -> list[str]:
        """An Iceberg sink's: every committed batch that published rows recorded a snapshot, and every recorded
        snapshot is in the table's current history, stamped with its batch."""
        from pyiceberg.table.snapshots import ancestors_of

        from kafka_ledger.sinks import IcebergSink
        from kafka_ledger.sinks.iceberg.sink import BATCH_KEY

        table = IcebergSink(self.pipeline).table()
        history = {s.snapshot_id: (s.summary.additional_properties if s.summary else {}).get(BATCH_KEY)
                   for s in ancestors_of(table.current_snapshot(), table.metadata)}
        problems = []
        committed = self._query("SELECT batch_id, snapshot_id FROM kafka_ledger.batches WHERE pipeline = %(p)s AND "
                                "status = 'committed' AND (snapshot_id IS NOT NULL OR records_written > 0)",
                                {"p": self.pipeline.name})
        for batch_id, snapshot_id in committed:
            if snapshot_id not in history:
                problems.append(f"committed batch {batch_id}: its snapshot {snapshot_id} is not in the table's history")
            elif history[snapshot_id] != str(batch_id):
                problems.append(f"committed batch {batch_id}: its snapshot {snapshot_id} was written by batch "
                                f"{history[snapshot_id]}")
        return problems

    def _entity_model(self, positions: dict[int, int]) -> dict[tuple[str, Any], Any]:
        return self._typed_model(positions) if self.typed else self._newest_model(positions)

    def _newest_model(self, positions: dict[int, int]) -> dict[tuple[str, Any], Any]:
        """What an entity campaign's table, tombstones and dead letters must hold once the positions are these: per
        entity its newest record below them (an entity's records share a partition: the highest offset), as a row
        (its content is its sequence number) or a tombstone; every bad record below them as a dead letter."""
        newest: dict[str, tuple[int, int, int]] = {}
        model: dict[tuple[str, Any], Any] = {}
        # A copy: the producer's delivery reports add to it meanwhile (taken in one step under the GIL).
        for (p, o), seq in list(self.producer.landed.items()):
            if o >= positions.get(p, 0):
                continue
            reason = change_event_reason(seq) if self.change_events else expected_reason(seq, entity=True)
            if reason is not None:
                model[("dead letter", (p, o))] = reason
            elif self.change_events and change_effect(seq) == "none":
                continue  # the Kafka tombstone after a delete
            elif entity_of(seq) not in newest or o > newest[entity_of(seq)][1]:
                newest[entity_of(seq)] = (p, o, seq)
        for entity, (p, o, seq) in newest.items():
            if (change_effect(seq) == "delete" if self.change_events else record_value(seq, entity=True) is None):
                model[("tombstone", entity)] = (p, o)
            else:
                model[("row", entity)] = (p, o, seq)
        return model

    def _typed_model(self, positions: dict[int, int]) -> dict[tuple[str, Any], Any]:
        """What a typed change-event campaign's table, tombstones and dead letters must hold once the positions are
        these: each entity's events below them applied in order (an entity's events share a partition), an update
        that leaves values unchanged keeping the entity's (each kept value's row image named by its sequence number),
        or, with no row to keep them from, a dead letter saying so; every bad record a dead letter."""
        events: dict[str, list[tuple[int, int, int]]] = defaultdict(list)
        model: dict[tuple[str, Any], Any] = {}
        for (p, o), seq in list(self.producer.landed.items()):
            if o >= positions.get(p, 0):
                continue
            if (reason := change_event_reason(seq)) is not None:
                model[("dead letter", (p, o))] = reason
            elif change_effect(seq, typed=True) != "none":  # a Kafka tombstone after a delete changes nothing
                events[entity_of(seq)].append((o, p, seq))
        for entity, applied in events.items():
            row: tuple[int, int, int, int, int] | None = None  # (p, o, seq, the note's seq, the jsonb's seq)
            for o, p, seq in sorted(applied):
                effect = change_effect(seq, typed=True)
                if effect == "delete":
                    row = None
                    model[("tombstone", entity)] = (p, o)
                elif effect in TOASTED and row is None:
                    model[("dead letter", (p, o))] = unavailable_reason(TOASTED[effect])
                else:
                    kept = TOASTED.get(effect, ())
                    row = (p, o, seq, row[3] if "note" in kept else seq, row[4] if "jb" in kept else seq)
                    model.pop(("tombstone", entity), None)
            if row is not None:
                model[("row", entity)] = (row[0], row[1], row[2], typed_held(*row[2:]))
        return model

    def _entity_state(self) -> dict[tuple[str, Any], Any]:
        """The entity table, its tombstones and the dead letters, in _entity_model's shape."""
        from psycopg2 import sql

        from kafka_ledger.sinks.postgres.sql import tombstone_table

        state: dict[tuple[str, Any], Any] = {}
        values = list(TYPED_CAMPAIGN_NAMES) if self.typed else []
        for entity, p, o, amount, *held in self._output_rows(["event_id", "kafka_partition", "kafka_offset", "amount",
                                                               *values]):
            state[("row", entity)] = (p, o, amount, *(
                [tuple(bytes(v) if isinstance(v, memoryview) else v for v in held)] if self.typed else []))
        for entity, p, o in self._query(sql.SQL("SELECT event_id, kafka_partition, kafka_offset FROM {}").format(
                tombstone_table(self.pipeline))):
            state[("tombstone", entity)] = (p, o)
        for p, o, error in self._query("SELECT kafka_partition, kafka_offset, error FROM kafka_ledger.dead_letters "
                                       "WHERE pipeline = %(p)s", {"p": self.pipeline.name}):
            state[("dead letter", (p, o))] = error
        return state

    def _entity_differences(self, positions: dict[int, int]) -> list[str]:
        model, state = self._entity_model(positions), self._entity_state()
        return [f"{kind} {name}: {state.get((kind, name), 'absent')}, expected {model.get((kind, name), 'absent')}"
                for kind, name in sorted(model.keys() | state.keys(), key=str)
                if model.get((kind, name)) != state.get((kind, name))]

    def _entity_final_check(self) -> dict[str, int]:
        """An entity campaign's final check: the table, tombstones and dead letters against the model of every record
        produced; then `kafka-ledger verify` (of the ledger: an entity table's rows are not compared there)."""
        from kafka_ledger.ops.verify import verify_pipeline

        positions = {p: pos for p, pos in self._query(
            "SELECT partition, position FROM kafka_ledger.positions WHERE pipeline = %(p)s", {"p": self.pipeline.name})}
        produced = self.producer.landed
        if any(o >= positions.get(p, 0) for p, o in produced):
            raise CampaignFailure(f"final check: records produced past the positions {positions}")
        model, state = self._entity_model(positions), self._entity_state()
        report = verify_pipeline(services_for(self.dsn, self.servers), self.pipeline, full=True)
        figures = {"records_produced": len(produced), "entities": sum(k == "row" for k, _ in model),
                   "output_rows": sum(k == "row" for k, _ in state),
                   "tombstones": sum(k == "tombstone" for k, _ in state),
                   "dead_letters": sum(k == "dead letter" for k, _ in state),
                   "lost": len(model.keys() - state.keys()), "duplicated": 0,
                   "unexpected": len(state.keys() - model.keys()),
                   "wrong_content": sum(model[k] != state[k] for k in model.keys() & state.keys()),
                   "verify_ok": report.ok}
        if figures["lost"] or figures["unexpected"] or figures["wrong_content"] or not report.ok:
            raise CampaignFailure(f"final check: {figures}; {self._entity_differences(positions)[:5]}, verify "
                                  f"{report.problems[:3]}")
        return figures

    def final_check(self) -> dict[str, int]:
        """Every record produced, by sequence number: good ones in the output with their content, bad ones
        in the dead letters with their reason; then `kafka-ledger verify` against Kafka itself."""
        from kafka_ledger.ops.verify import verify_pipeline

        if self.entity:
            return self._entity_final_check()

        tally = Tally(self.producer.landed.partitions(), self.producer.records.reason)
        for chunk in self._output_chunks(["kafka_partition", "kafka_offset", "event_id", "amount"]):
            tally.output(*chunk)
        tally.dead_letters(self._query("SELECT kafka_partition, kafka_offset, error FROM kafka_ledger.dead_letters "
                                       "WHERE pipeline = %(p)s", {"p": self.pipeline.name}))
        report = verify_pipeline(services_for(self.dsn, self.servers), self.pipeline, full=True)
        figures = tally.figures()
        examples = figures.pop("examples")
        figures["verify_ok"] = report.ok
        if figures["lost"] or figures["duplicated"] or figures["unexpected"] or figures["wrong_content"] or \
                not report.ok:
            raise CampaignFailure(f"final check: {figures}; lost {examples['lost']}, duplicated "
                                  f"{examples['duplicated']}, unexpected {examples['unexpected']}, wrong "
                                  f"{examples['wrong']}, verify {report.problems[:3]}")
        return figures

    # --- the campaign --------------------------------------------------------------------------------------
    # --- checkpoints: a campaign longer than a working session goes on in the next one ----------------
    def elapsed(self) -> float:
        return round(self.elapsed_before + time.monotonic() - self.session_started, 1)

    def checkpoint(self) -> None:
        """After an iteration: the records produced so far (appended to landed.tsv) and the state (state.json)."""
        self.journal_landed()
        version, internal, gauss = self.rng.getstate()
        state = {
            "seed": self.seed, "faults": self.faults, "records_per_fault": self.records_per_fault,
            "network_weight": self.network_weight, "rate": self.rate,
            "pipeline": self.pipeline.name, "rng": [version, list(internal), gauss],
            "iterations": [asdict(it) for it in self.iterations],
            "positions": {str(p): pos for p, pos in self.positions.items()},
            "runs": self.runs, "spark_tasks": self.spark_tasks, "runtime": self.runtime, "shape": self.shape,
            "variants": {k: dict(v) for k, v in self.variants.items()},
            "started_at": self.started_at, "elapsed_seconds": self.elapsed(), "sessions": self.sessions,
            "interruptions": self.interruptions, **self.saved_extra(),
        }
        partial = self.workdir / "state.json.partial"
        partial.write_text(json.dumps(state))
        os.replace(partial, self.workdir / "state.json")

    def journal_landed(self) -> None:
        """Wait until every record produced so far has landed, and append where to the journal (landed.tsv)."""
        append_journal(self.workdir / "landed.tsv", self.producer.settle())

    def saved_extra(self) -> dict[str, Any]:
        """What a kind of campaign saves at a checkpoint beside the state every campaign saves."""
        return {}

    @staticmethod
    def saved_state(workdir: Path) -> dict[str, Any]:
        """What the campaign saved in `workdir` at its last checkpoint."""
        return json.loads((workdir / "state.json").read_text())

    @classmethod
    def resume(cls, pipeline: Any, dsn: str, servers: str, workdir: Path) -> Campaign:
        """The campaign saved in `workdir`, ready to go on after its last completed iteration."""
        state = cls.saved_state(workdir)
        campaign = cls(pipeline, dsn, servers, state["seed"], state["faults"], state["records_per_fault"], workdir,
                       network="network" in state.get("shape", "").split("-"),
                       network_weight=state.get("network_weight", 1),
                       typed="typed" in state.get("shape", "").split("-"))
        campaign.restore(state)
        return campaign

    def restore(self, state: dict[str, Any]) -> None:
        """Take up the saved campaign `state` (saved_state): its random draws, iterations, positions and counts,
        and where every record produced so far landed."""
        from kafka_ledger.kafka.offsets import partition_offsets

        version, internal, gauss = state["rng"]
        self.rng.setstate((version, tuple(internal), gauss))
        self.iterations = [IterationReport(**it) for it in state["iterations"]]
        self.positions = {int(p): pos for p, pos in state["positions"].items()}
        self.runs, self.spark_tasks = state["runs"], state["spark_tasks"]
        for kind, variants in state["variants"].items():
            self.variants[kind] = Counter(variants)
        self.started_at, self.elapsed_before = state["started_at"], state["elapsed_seconds"]
        self.sessions, self.interruptions = state["sessions"], state["interruptions"]
        landed = read_journal(self.workdir / "landed.tsv")
        # Records produced after the last checkpoint lost their delivery reports with the process: Kafka has
        # them after the journal's last offsets, and each record's key carries its sequence number.
        journaled = landed.next_offsets()
        # Kafka must still hold what it acknowledged before the interruption (a machine stopped before the broker
        # flushed): every partition still starting at 0 and ending at or after the journal's last offset. The
        # records themselves are compared with Kafka by the final check's `kafka-ledger verify --full`.
        offsets = partition_offsets(kafka_for(self.servers), [self.topic])
        ends = {tp.partition: o for tp, o in offsets.items()}
        short = {p: (ends[p].log_start, ends[p].end) if p in ends else None for p, after in journaled.items()
                 if p not in ends or ends[p].log_start > 0 or ends[p].end < after}
        if short:
            raise CampaignFailure(f"Kafka no longer holds the records it acknowledged before the interruption: "
                                  f"partitions {short} (log start, end) short of the journal's "
                                  f"{ {p: journaled[p] for p in short} }; the campaign cannot go on, start a new one")
        in_kafka = records_by_key(self.servers, self.topic, after=journaled, offsets=offsets)
        for (partition, offset), seq in in_kafka.items():
            landed[partition, offset] = seq
        # Journaled now: a second interruption reads Kafka only after the journal's last offsets, past these.
        append_journal(self.workdir / "landed.tsv", [(p, o, seq) for (p, o), seq in sorted(in_kafka.items())])
        self.resumed_landed = landed

    def run_all(self, progress: Callable[[str], None] = print) -> dict[str, Any]:
        self.session_started = time.monotonic()
        self.sessions += 1
        self.started_at = self.started_at or datetime.now(UTC).isoformat(timespec="seconds")
        partitions = None
        if self.entity:
            from kafka_ledger.kafka.offsets import partition_offsets

            partitions = len(partition_offsets(kafka_for(self.servers), [self.topic]))
        records = ({"avro": AvroRecords, "protobuf": ProtobufRecords}[self.registered](schema_registry().client(),
                                                                                     self.topic)
                   if self.registered else JsonRecords())
        self.producer = SequenceProducer(self.servers, self.topic, self.rate, landed=self.resumed_landed,
                                         entity_partitions=partitions, records=records,
                                         change_events=self.change_events, typed=self.typed)
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
                if index == 1:
                    # A first run before the producer's first deliveries (a TLS handshake, SASL) would find
                    # nothing to read, and its fault nothing to strike.
                    self.producer.wait_delivered_some(self.records_per_fault // 10)
                report = self.run_iteration(index, kind)
                self.iterations.append(report)
                redone = len(self.producer.notes)
                self.checkpoint()
                for note in self.producer.notes[redone:]:
                    progress(f"[{index}] producer: {note}")
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
            # The campaign's own producer's failed deliveries, written again (the pipeline is not what failed).
            "producer_redeliveries": self.producer.notes,
            "iterations": [asdict(it) for it in self.iterations],
        }


class _ThreadTask:
    """The thread driving a spark-submit, as a process to a fault that waits while the task runs (poll())."""

    def __init__(self, thread: threading.Thread):
        self.thread = thread

    def poll(self) -> int | None:
        return None if self.thread.is_alive() else 0


# --- the task processes -------------------------------------------------------------------------------------
# A task prints its result on a line of its own that starts with this: its log (Airflow's, PySpark's releases of
# finished operations in threads of their own) may write to the same stdout, also after the result.
RESULT_PREFIX = "kafka-ledger task result: "


def task_result(out: str) -> dict[str, Any] | None:
    """The result a task printed (task_main), from its whole stdout; None if it printed none."""
    lines = [line for line in out.splitlines() if line.startswith(RESULT_PREFIX)]
    return json.loads(lines[-1][len(RESULT_PREFIX):]) if lines else None


def _print_result(result: dict[str, Any]) -> None:
    print(RESULT_PREFIX + json.dumps(result), flush=True)


def task_main(argv: list[str]) -> int:
    """One task of a pipeline run, in its own process: `task plan|commit|read_and_commit ...`.

    read_and_commit is the connect runtime's Spark task (ReadAndCommitOperator's work).
    """
    parser = argparse.ArgumentParser(prog="python -m tools.fault_campaign task")
    parser.add_argument("task", choices=["plan", "commit", "read_and_commit"])
    parser.add_argument("--pipeline", required=True)
    parser.add_argument("--dag-id")
    parser.add_argument("--run-id")
    parser.add_argument("--batch-id", type=int)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s %(message)s")
    from kafka_ledger.batch import commit
    from kafka_ledger.batch import plan as planner
    from kafka_ledger.config.pipeline import get_pipeline


    pipeline = get_pipeline(args.pipeline)
    if args.task == "plan":
        planned = planner.plan_batch(task_services(), pipeline, dag_id=args.dag_id,
                                     run_id=args.run_id)
        _print_result({"batch_id": planned.batch_id, "resumed": planned.resumed, "offsets": planned.offsets})
    elif args.task == "read_and_commit":
        from kafka_ledger.runtimes.connect.batch import ConnectBatch

        result = ConnectBatch(pipeline, args.batch_id).run(task_services())
        _print_result({"batch_id": result.batch_id, "already_committed": result.already_committed})
    else:
        result = commit.commit(task_services(), pipeline, args.batch_id, commit.Written())
        _print_result({"batch_id": result.batch_id, "already_committed": result.already_committed})
    return 0
