"""The freshness benchmark: a steady load while the pipeline runs by its doorbell under Airflow, and the streaming peer.

    python -m tools.benchmark --freshness --rate 6000 --minutes 10      # from the project root, after scripts/env.sh

Records are produced at `rate` per second for `minutes` into a fresh topic. Meanwhile a dedicated Airflow (scheduler,
triggerer, dag-processor, api-server: tools/airflow_server.py, the tests' own) runs the pipeline by its doorbell,
and the peer a data engineer would pick for freshness, Spark Structured Streaming with a processing-time trigger
appending by foreachBatch over JDBC (tools/benchmark_peers.py), reads the same topic into a table of its own. A
warm-up of WARM_UP_RECORDS records, which both must have published first, keeps their start-up (the doorbell's watcher
registered at the DAG's first parse, the peer's JVM) out of the measured load. Once the load stops, both must catch
up; then, per record, the delay from its Kafka timestamp (the producer's clock) to
the commit that published it: kafka-ledger's batch `committed_at`, the peer's batch commit as its driver recorded it.
Reported: p50, p95, p99 and max of that delay, over the whole run and over its first and last thirds (a lag that
grows shows there), the records per second kept up with, and for kafka-ledger where each run's time went; and the
private memory of every long-lived process during the load (tools/process_memory.py): each one's peak in the first and
the last third, flat when the last is within 10 % of the first. With `--peer-after` the peer does not run beside
kafka-ledger but in a turn of its own right after it (run_peer_after), so that each has the machine to itself.
"""

from __future__ import annotations

import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

import numpy as np
import psycopg2
import yaml
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient

from kafka_ledger.airflow.dags import PLAN_TASK, SPARK_TASK
from kafka_ledger.config.pipeline import get_pipeline
from kafka_ledger.config.services import LedgerDatabase, jdbc_target
from kafka_ledger.config.settings import deployment_settings, env_name, kafka_for
from kafka_ledger.ledger import db as ledger
from kafka_ledger.runtimes.submit.spark_submit import BASE_SPARK_CONF, spark_jars
from kafka_ledger.sinks import remove_pipeline
from tools import benchmark_peers, git_commit
from tools.airflow_server import component_processes, running_airflow
from tools.benchmark_peers import COLUMNS
from tools.kafka_topics import create_topic
from tools.process_memory import MemoryWatch, with_children
from tools.stack import service_pids, stack_command

log = logging.getLogger("tools.freshness")

SCHEMA = "benchmark"
# The doorbell looks every POLL_SECONDS; the peer's trigger fires every PEER_TRIGGER_SECONDS.
POLL_SECONDS = 1.0
PEER_TRIGGER_SECONDS = 5
# How long both may take to catch up once the load stops.
CATCH_UP_SECONDS = 600
# Before the load: this many records, which both must have published (the doorbell's watcher registered, the
# peer's JVM started and its first micro-batch committed) before the measured records come; not measured.
WARM_UP_RECORDS = 1_000


def produce_steadily(servers: str, topics: list[str], rate: float, seconds: float, partitions: int
                     ) -> dict[str, Any]:
    """`rate` records per second for `seconds`, in ticks of a tenth of a second, the topics and their partitions in
    turn (record i into topic i mod T, partition i // T mod `partitions`); Kafka stamps each with the producer's
    clock (CreateTime). Returns what was produced and the rate achieved."""
    # Produce requests of 20 ms of records: at 60,000 records/s, 5 ms ones cost the broker (TLS, SASL) half as much
    # CPU again, on the machine the benchmark measures. A record's delay counts its wait in the producer.
    producer = Producer(kafka_for(servers).confluent(**{"enable.idempotence": True, "linger.ms": 20}))
    started = time.monotonic()
    sent = 0
    while (elapsed := time.monotonic() - started) < seconds:
        due = int(min(elapsed + 0.1, seconds) * rate)
        while sent < due:
            try:
                producer.produce(topics[sent % len(topics)], value=benchmark_peers.record_value(sent),
                                 partition=sent // len(topics) % partitions)
                sent += 1
            except BufferError:
                producer.poll(0.05)
        producer.poll(0)
        time.sleep(max(0.0, started + (sent / rate) - time.monotonic()))
    producer.flush(120)
    took = time.monotonic() - started
    return {"records": sent, "seconds": round(took, 1), "records_per_s": round(sent / took)}


def _percentiles(delays: np.ndarray) -> dict[str, float | None]:
    """p50, p95, p99 and max of the delays (each the value at index q·n of the sorted delays)."""
    if not len(delays):
        return {"p50": None, "p95": None, "p99": None, "max": None}
    ordered = np.sort(delays)

    def at(q: float) -> float:
        return round(float(ordered[min(len(ordered) - 1, int(q * len(ordered)))]), 2)

    return {"p50": at(0.50), "p95": at(0.95), "p99": at(0.99), "max": round(float(ordered[-1]), 2)}


def record_delays(dsn: str, source: str, load_started: datetime) -> tuple[np.ndarray, np.ndarray]:
    """For every record of the load (its Kafka timestamp at or after `load_started`), in two float arrays: the seconds
    from `load_started` to its Kafka timestamp, and from that to the commit that published it. `source` joins a
    table's rows `o` to their batches `b`. Fetched a million rows at a time: as Python tuples, the 36 M records of a
    60,000 records/s run filled 15 GB."""
    chunks = []
    with psycopg2.connect(dsn) as conn, conn.cursor(name="freshness_delays") as cur:
        cur.execute(f"SELECT extract(epoch FROM o.kafka_timestamp - %(started)s)::float8, "
                    f"extract(epoch FROM b.committed_at - o.kafka_timestamp)::float8 FROM {source} "
                    f"WHERE o.kafka_timestamp >= %(started)s", {"started": load_started})
        while rows := cur.fetchmany(1_000_000):
            chunks.append(np.array(rows, dtype=np.float64).reshape(-1, 2))
    conn.close()
    both = np.concatenate(chunks) if chunks else np.empty((0, 2))
    return both[:, 0], both[:, 1]


def scalar(dsn: str, query: str) -> int:
    with psycopg2.connect(dsn) as conn, conn.cursor() as cur:
        cur.execute(query)
        (value,) = cur.fetchone()
    conn.close()
    return value


def published_once(dsn: str, source: str, table: str, total: int) -> bool:
    """Whether `total` records were published, each once: as many rows in `source` (the table's rows joined to their
    batches), and as many distinct (partition, offset) in the table."""
    return (scalar(dsn, f"SELECT count(*) FROM {source}") == total and scalar(
        dsn, f"SELECT count(DISTINCT (kafka_partition, kafka_offset)) FROM {SCHEMA}.{table}") == total)


def delay_report(at_seconds: np.ndarray, delays: np.ndarray) -> dict[str, Any]:
    """The delays' percentiles over the whole run and its first and last thirds (by Kafka timestamp: `at_seconds`
    from the load's start)."""
    if not len(delays):
        return {"records": 0}
    order = np.lexsort((delays, at_seconds))
    ordered = delays[order]
    third = max(1, len(ordered) // 3)
    return {"records": len(ordered), **_percentiles(ordered),
            "first_third": _percentiles(ordered[:third]),
            "last_third": _percentiles(ordered[-third:]),
            # Records per second from the load's start to the last record's commit.
            "records_per_s_kept_up": round(len(ordered) / max(float(at_seconds[order[-1]] + ordered[-1]), 1e-9))}


def _kafka_ledger_rows(table: str) -> str:
    return f"{SCHEMA}.{table} o JOIN kafka_ledger.batches b USING (batch_id)"


def _peer_rows(table: str) -> str:
    return f"{SCHEMA}.{table} o JOIN {SCHEMA}.{table}_batches b USING (spark_batch_id)"


def _seconds(later: str | None, earlier: str | None) -> float | None:
    if not later or not earlier:
        return None
    return (datetime.fromisoformat(later) - datetime.fromisoformat(earlier)).total_seconds()


def _run_parts(client: Any, dag_id: str, run: dict[str, Any]) -> tuple[str | None, dict[str, Any], dict[str, Any]]:
    """A run's first triggering asset event's time (the doorbell's ring), its plan task and its Spark task."""
    tasks = {t["task_id"]: t for t in client.task_instances(dag_id, run["dag_run_id"])}
    events = client.request("GET", f"/api/v2/dags/{dag_id}/dagRuns/{run['dag_run_id']}/upstreamAssetEvents",
                            expect=(200, 404)).json().get("asset_events", [])
    return (min((e["timestamp"] for e in events), default=None), tasks.get(PLAN_TASK) or {},
            tasks.get(SPARK_TASK["connect"]) or {})


def first_run_stages(client: Any, dag_id: str, unpaused_at: str) -> dict[str, float | None]:
    """When the first run's steps began, in seconds from the unpause (`unpaused_at`, ISO): the doorbell's first ring
    (its asset event), the run's start, its plan task's start and end, its Spark task's start."""
    runs = client.runs(dag_id)
    if not runs:
        return {}
    run = runs[0]
    ring, plan, spark = _run_parts(client, dag_id, run)
    steps = {"ring": ring, "run_start": run.get("start_date"),
             "plan_task_start": plan.get("start_date"), "plan_task_end": plan.get("end_date"),
             "spark_task_start": spark.get("start_date")}
    return {name: (None if (took := _seconds(at, unpaused_at)) is None else round(took, 2))
            for name, at in steps.items()}


def run_stages(client: Any, dag_id: str, dsn: str, pipeline: str) -> dict[str, Any]:
    """Where kafka-ledger's runs spent their time, medians over the runs that committed a batch: from the doorbell's
    event to the run's start, from the run's start to its plan task's, the plan task, the gap to the Spark task,
    the Spark task (its batches: batch_stages), the run's end after it, and the run's time outside its batches'
    (each from its plan to its commit): Airflow's cost of the run, and a carrying run's waits between batches."""
    with psycopg2.connect(dsn) as conn, conn.cursor() as cur:
        cur.execute("SELECT run_id, count(*), sum(extract(epoch FROM committed_at - planned_at)) "
                    "FROM kafka_ledger.batches WHERE pipeline = %s AND status = 'committed' GROUP BY run_id",
                    (pipeline,))
        in_batches = {run_id: float(seconds) for run_id, _, seconds in cur.fetchall()}
    conn.close()
    stages: dict[str, list[float]] = {}
    runs = client.runs(dag_id)
    for run in runs:
        if run["dag_run_id"] not in in_batches or run.get("state") != "success":
            continue
        ring, plan, spark = _run_parts(client, dag_id, run)
        took = _seconds(run.get("end_date"), run.get("start_date"))
        measured = {
            "event_to_run_start": _seconds(run.get("start_date"), ring),
            "run_start_to_plan_task": _seconds(plan.get("start_date"), run.get("start_date")),
            "plan_task": _seconds(plan.get("end_date"), plan.get("start_date")),
            "plan_to_spark_task": _seconds(spark.get("start_date"), plan.get("end_date")),
            "spark_task": _seconds(spark.get("end_date"), spark.get("start_date")),
            "spark_task_to_run_end": _seconds(run.get("end_date"), spark.get("end_date")),
            "run": took,
            "outside_batches": None if took is None else took - in_batches[run["dag_run_id"]],
        }
        for name, value in measured.items():
            if value is not None:
                stages.setdefault(name, []).append(float(value))
    return {"runs": len(runs), "runs_with_a_batch": len(in_batches),
            "median_seconds": {name: round(statistics.median(values), 2) for name, values in stages.items()}}


def batch_stages(dsn: str, pipeline: str) -> dict[str, Any]:
    """Where the batches' time went, medians over the committed catch-up batches: the batches a run carried, each
    batch from its plan to its commit, its read and commit (the ledger's: they overlap, rows streaming into COPY),
    and everything else (`fixed`: the batch from plan to commit less the longer of read and commit)."""
    with psycopg2.connect(dsn) as conn, conn.cursor() as cur:
        cur.execute("SELECT run_id, extract(epoch FROM committed_at - planned_at), read_seconds, commit_seconds, "
                    "records_read FROM kafka_ledger.batches WHERE pipeline = %s AND status = 'committed' "
                    "AND kind = 'catch_up' ORDER BY batch_id", (pipeline,))
        rows = cur.fetchall()
    conn.close()
    if not rows:
        return {"batches": 0}
    per_run: dict[str, int] = {}
    for run_id, *_ in rows:
        per_run[run_id] = per_run.get(run_id, 0) + 1
    measured = {
        "batches_per_run": list(per_run.values()),
        "records": [records or 0 for *_, records in rows],
        "planned_to_committed": [float(span) for _, span, *_ in rows],
        "read": [float(read or 0) for _, _, read, _, _ in rows],
        "commit": [float(commit or 0) for _, _, _, commit, _ in rows],
        "fixed": [float(span) - max(float(read or 0), float(commit or 0)) for _, span, read, commit, _ in rows],
    }
    return {"batches": len(rows), "runs": len(per_run),
            "median": {name: round(statistics.median(values), 2) for name, values in measured.items()}}


def start_busy_cores(count: int) -> list[subprocess.Popen]:
    """`count` processes that each keep a core busy (a shared machine's neighbours) until stopped."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)
            for _ in range(count)]


def start_peer(servers: str, dsn: str, topic: str, table: str, workdir: Path) -> subprocess.Popen:
    """The streaming peer in spark-submit, from the topic's start, every PEER_TRIGGER_SECONDS, until stopped."""
    benchmark_peers.create_table(dsn, SCHEMA, table, freshness=True)
    target = jdbc_target(dsn)
    conf = [part for key, value in BASE_SPARK_CONF.items() for part in ("--conf", f"{key}={value}")]
    command = ["spark-submit", "--master", deployment_settings().spark_master or "local[*]", *conf,
               "--jars", spark_jars(), benchmark_peers.__file__, "spark", "--servers", servers, "--topic", topic,
               "--schema", SCHEMA, "--table", table, "--jdbc-url", target.url,
               "--checkpoint", str(workdir / "peer-checkpoint"), "--processing-time", str(PEER_TRIGGER_SECONDS)]
    # Credentials reach the job through its environment, never its command line.
    env = {**os.environ, "BENCHMARK_DB_USER": target.user, "BENCHMARK_DB_PASSWORD": target.password}
    env.pop("SPARK_CONNECT_MODE_ENABLED", None)
    return subprocess.Popen(command, env=env, stdout=(workdir / "peer.out").open("w"),
                            stderr=(workdir / "peer.err").open("w"), start_new_session=True)


def _wait(what: str, done: Any, timeout: float) -> float:
    started = time.monotonic()
    while not done():
        if time.monotonic() - started > timeout:
            raise TimeoutError(f"{what} did not happen within {timeout:.0f} s")
        time.sleep(1)
    return time.monotonic() - started


def long_lived_processes(airflow_session: int, peer_process: subprocess.Popen | None) -> dict[str, list[int]]:
    """The processes whose memory must stay flat under the load: every service of the stack with the processes under
    it (Postgres's backends, the Spark worker's executors), Airflow's components (with their workers and task
    processes) and the peer's."""
    groups = {name: with_children(pid) for name, pid in service_pids().items() if name != "supervisord"}
    for component in ("scheduler", "triggerer", "dag-processor"):
        groups[f"airflow_{component}"] = component_processes(airflow_session, component)
    if peer_process is not None:
        groups["spark_streaming_peer"] = with_children(peer_process.pid)
    return {name: pids for name, pids in groups.items() if pids}


def run_peer_after(servers: str, dsn: str, rate: float, minutes: float, partitions: int, tag: str,
                   workdir: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """The streaming peer's own turn, after kafka-ledger's: the same warm-up and load into a topic of its own, the
    stack's Spark Connect server stopped meanwhile so that the peer has every core of the cluster, as kafka-ledger had
    (on a 2-core machine the two cannot each keep up with 60,000 records/s side by side). Returns the peer's run
    (records, catch-up, exact, memory) and its delay report."""
    topic, table = f"fresh-{tag}-peer", f"fresh_peer_{tag}"
    admin = AdminClient(kafka_for(servers).confluent())
    create_topic(admin, topic, partitions)
    run: dict[str, Any] = {"after_kafka_ledger": True}
    process = None
    stack_command("stop-spark-connect")
    try:
        process = start_peer(servers, dsn, topic, table, workdir)
        started = time.monotonic()
        produce_steadily(servers, [topic], WARM_UP_RECORDS, 1.0, partitions)

        def published(total: int) -> bool:
            if process.poll() is not None:
                raise RuntimeError(f"the streaming peer ended (exit {process.returncode}): see {workdir}/peer.err")
            return benchmark_peers.count_rows(dsn, SCHEMA, table) >= total

        _wait("the peer's warm-up", lambda: published(WARM_UP_RECORDS), CATCH_UP_SECONDS)
        run["warm_up_published_after_start_s"] = round(time.monotonic() - started, 1)
        load_started = datetime.now().astimezone()
        groups = {name: pid for name, pid in service_pids().items() if name != "supervisord"}
        watch = MemoryWatch(lambda: {**{name: with_children(pid) for name, pid in groups.items()},
                                     "spark_streaming_peer": with_children(process.pid)}).start()
        try:
            run["produced"] = produce_steadily(servers, [topic], rate, minutes * 60, partitions)
        finally:
            run["memory"] = watch.stop()
        total = WARM_UP_RECORDS + run["produced"]["records"]
        try:
            run["caught_up_after_load_s"] = round(_wait("the peer's catch-up", lambda: published(total),
                                                        CATCH_UP_SECONDS), 1)
        except TimeoutError:
            # A stream that fell behind by more than it drains in CATCH_UP_SECONDS: its delays are those of the
            # records it published, a lower bound (the rest waited longer), and it is said.
            run["caught_up_after_load_s"] = None
            run["published_within_catch_up"] = benchmark_peers.count_rows(dsn, SCHEMA, table)
        if run["caught_up_after_load_s"] is not None:
            # Caught up counts the table's rows; the driver records a micro-batch's commit just after its rows, and
            # the delays and the exactness join the two.
            _wait("the peer's last commit", lambda: scalar(dsn, f"SELECT count(*) FROM {_peer_rows(table)}") >= total,
                  60)
        run["exact"] = (published_once(dsn, _peer_rows(table), table, total)
                        if run["caught_up_after_load_s"] is not None else None)
        delays = delay_report(*record_delays(dsn, _peer_rows(table), load_started))
    finally:
        if process is not None and process.poll() is None:
            os.killpg(process.pid, 15)
            process.wait(60)
        stack_command("restart-spark-connect")
        with psycopg2.connect(dsn) as conn, conn.cursor() as cur:
            cur.execute(f"DROP TABLE IF EXISTS {SCHEMA}.{table}, {SCHEMA}.{table}_batches")
        conn.close()
        admin.delete_topics([topic])[topic].result(30)
    return run, delays


def run_freshness(servers: str, dsn: str, rate: float, minutes: float, partitions: int,
                  peer: Literal["beside", "after", "none"] = "beside", busy_cores: int = 0) -> dict[str, Any]:
    """The whole benchmark (see the module), with `busy_cores` cores kept busy beside it all along; returns its
    summary. `peer`: "beside" (the streaming peer reads the same topic at the same time), "after" (its own turn once
    kafka-ledger's is over: `run_peer_after`) or "none"."""
    tag = uuid.uuid4().hex[:8]
    topic, name = f"fresh-{tag}", f"fresh_{tag}"
    workdir = Path(tempfile.mkdtemp(prefix="kl-freshness-"))
    admin = AdminClient(kafka_for(servers).confluent())
    create_topic(admin, topic, partitions)
    config = workdir / "pipelines.yaml"
    config.write_text(yaml.safe_dump({"pipelines": {name: {
        "topics": [topic], "output_table": name, "output_schema": SCHEMA, "columns": COLUMNS,
        "schedule": None, "trigger": {"type": "doorbell", "poll_seconds": POLL_SECONDS},
        "max_records_per_partition": 1_000_000, "spark_runtime": "connect",
    }}}))
    os.environ[env_name("pipelines")] = str(config)
    pipeline = get_pipeline(name)
    peer_table = f"fresh_peer_{tag}"
    load_before = os.getloadavg()[0]
    summary: dict[str, Any] = {"rate": rate, "minutes": minutes, "partitions": partitions,
                               "doorbell_poll_seconds": POLL_SECONDS, "carry_seconds": pipeline.doorbell.carry_seconds,
                               "peer_trigger_seconds": PEER_TRIGGER_SECONDS, "busy_cores": busy_cores}
    peer_process = None
    hogs = start_busy_cores(busy_cores)
    try:
        with running_airflow() as client:
            client.wait_for_dag(pipeline.dag_id, timeout=180)
            client.set_paused(pipeline.dag_id, False)
            unpaused, unpaused_at = time.monotonic(), datetime.now(UTC).isoformat()
            if peer == "beside":
                peer_process = start_peer(servers, dsn, topic, peer_table, workdir)

            def caught_up(total: int, since: float | None = None) -> dict[str, float]:
                """Wait until both have published `total` records; returns how long each took (since `since`,
                monotonic, else since the call)."""
                since = time.monotonic() if since is None else since
                def ledger_has() -> bool:
                    with ledger.transaction(LedgerDatabase(dsn)) as cur:
                        return sum(ledger.positions(cur, name).values()) >= total

                _wait("kafka-ledger's catch-up", ledger_has, CATCH_UP_SECONDS)
                took = {"kafka_ledger": round(time.monotonic() - since, 1)}
                if peer_process is not None:
                    _wait("the peer's catch-up", lambda: benchmark_peers.count_rows(dsn, SCHEMA, peer_table) >= total,
                          CATCH_UP_SECONDS)
                    took["peer"] = round(time.monotonic() - since, 1)
                return took

            produce_steadily(servers, [topic], WARM_UP_RECORDS, 1.0, partitions)
            # From the unpause (the peer: from its start, a moment later) to the warm-up's records all published.
            summary["warm_up"] = {"records": WARM_UP_RECORDS,
                                  "published_after_unpause_s": caught_up(WARM_UP_RECORDS, since=unpaused),
                                  "first_run_after_unpause_s": first_run_stages(client, pipeline.dag_id, unpaused_at)}
            load_started = datetime.now().astimezone()
            watch = MemoryWatch(lambda: long_lived_processes(client.session_id, peer_process)).start()
            try:
                produced = produce_steadily(servers, [topic], rate, minutes * 60, partitions)
            finally:
                summary["memory"] = watch.stop()
            summary["produced"] = produced
            total = WARM_UP_RECORDS + produced["records"]
            summary["caught_up_after_load_s"] = caught_up(total)
            # Wait for the last run to end before reading the runs' stages.
            client.wait_until_idle(pipeline.dag_id, timeout=300)
            summary["kafka_ledger_runs"] = run_stages(client, pipeline.dag_id, dsn, name)
            summary["kafka_ledger_batches"] = batch_stages(dsn, name)
            client.set_paused(pipeline.dag_id, True)
        # Exact: every record (warm-up included) published once; the delays are the load's records'.
        summary["exact"] = published_once(dsn, _kafka_ledger_rows(name), name, total)
        summary["kafka_ledger"] = delay_report(*record_delays(dsn, _kafka_ledger_rows(name), load_started))
        if peer_process is not None:
            peer_rows = scalar(dsn, f"SELECT count(*) FROM {_peer_rows(peer_table)}")
            summary["exact"] = summary["exact"] and peer_rows == total
            summary["spark_streaming_peer"] = delay_report(*record_delays(dsn, _peer_rows(peer_table), load_started))
        if peer == "after":
            summary["spark_streaming_peer_run"], summary["spark_streaming_peer"] = run_peer_after(
                servers, dsn, rate, minutes, partitions, tag, workdir)
            # A peer that did not catch up is not inexact: it is slower (said in its run).
            summary["exact"] = summary["exact"] and summary["spark_streaming_peer_run"]["exact"] is not False
        if summary.get("spark_streaming_peer", {}).get("p99"):
            summary["p99_vs_peer"] = round(summary["kafka_ledger"]["p99"] / summary["spark_streaming_peer"]["p99"], 3)
    finally:
        for hog in hogs:
            hog.kill()
        if peer_process is not None and peer_process.poll() is None:
            os.killpg(peer_process.pid, 15)
            peer_process.wait(60)
        with ledger.transaction(LedgerDatabase(dsn)) as cur:
            remove_pipeline(cur, pipeline)
            cur.execute(f"DROP TABLE IF EXISTS {SCHEMA}.{peer_table}, {SCHEMA}.{peer_table}_batches")
        admin.delete_topics([topic])[topic].result(30)
    summary["load_average"] = [round(load_before, 2), round(os.getloadavg()[0], 2)]
    summary["cores"] = os.cpu_count()
    summary["commit"] = git_commit()
    return summary


if __name__ == "__main__":
    sys.exit("run it as: python -m tools.benchmark --freshness --rate 6000 --minutes 10")
