"""Many pipelines on one Airflow (`python -m tools.benchmark --pipelines 200 [--load-minutes 10]`): what declaring
them costs before any record arrives, and what carrying a little data into each of them costs.

PIPELINES pipelines of --partitions partitions each (a topic each, doorbells on, all carried by one carrier, polling
every 5 s, the default) are declared, and a dedicated Airflow (tools/airflow_server.py) runs them: every DAG must
parse (no import error), the DAG file's processing time is the dag-processor's own figure (`last_parse_duration`);
all are unpaused, and once their doorbell is registered the CPU of the triggerer, the dag-processor and the scheduler
(their processes, user and system time) is measured while nothing arrives; `kafka-ledger status` of all of them and
the Kafka Ledger page (`/kafka-ledger/`, through the api-server with a token, as the UI loads it) are timed `--rounds`
times, medians printed, against the issue's 2 s.

With --load-minutes, then: WARM_UP_PER_PIPELINE records into each topic, which must be published first, and
--rate-per-pipeline records per second into every topic for that long (tools/freshness.produce_steadily), carried
by the carrier (runtimes/connect/carrier.py). Measured: the triggerer's and the Spark Connect server's CPU during
the load, and the whole machine's; each record's delay from its Kafka timestamp to its batch's commit (p50, p95, p99,
max; the first and last thirds), against the issue's 30 s at p99; and whether every pipeline's table holds its topic's
records, each once.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import tempfile
import time
import uuid
from collections import Counter
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import psycopg2
import yaml
from confluent_kafka.admin import AdminClient

from kafka_ledger.config.pipeline import CARRIER_DAG_ID_PREFIX, DAG_ID_PREFIX, PipelineConfig, read_pipelines
from kafka_ledger.config.services import LedgerDatabase
from kafka_ledger.config.settings import env_name, kafka_for
from kafka_ledger.kafka import offsets as kafka_offsets
from kafka_ledger.ledger import db as ledger
from kafka_ledger.sinks import remove_pipeline
from tools import git_commit
from tools.airflow_server import AirflowClient, component_processes, running_airflow
from tools.benchmark_peers import COLUMNS
from tools.freshness import delay_report, produce_steadily, record_delays, scalar
from tools.kafka_topics import create_topic
from tools.process_memory import with_children
from tools.stack import service_pids

SCHEMA = "benchmark"
ANSWER_TARGET_SECONDS = 2.0  # `kafka-ledger status` and the page, for all the pipelines
SETTLE_SECONDS = 60  # after unpausing: every doorbell registered with the triggerer, its first polls done
IDLE_SECONDS = 60  # the triggerer's CPU measured over this long
# The load (--load-minutes): records per second into each pipeline's topic, and the freshness p99 it must keep.
LOAD_RATE_PER_PIPELINE = 50.0
LOAD_P99_TARGET_SECONDS = 30.0
# Before the load, each pipeline gets this many records, which must be published first (the carrier's doorbell
# registered, its first run done); not measured.
WARM_UP_PER_PIPELINE = 10
LOAD_CATCH_UP_SECONDS = 600


def declare(workdir: Path, run_id: str, pipelines: int, carrier: str | None = None) -> list[PipelineConfig]:
    """The pipelines file: PIPELINES doorbell pipelines, a topic and an output table each; carried by `carrier` if
    given."""
    config = workdir / "pipelines.yaml"
    trigger = {"type": "doorbell", **({"carrier": carrier} if carrier else {})}
    config.write_text(yaml.safe_dump({"pipelines": {
        f"fleet_{run_id}_{n}": {"topics": [f"fleet-{run_id}-{n}"], "output_table": f"fleet_{run_id}_{n}",
                                "output_schema": SCHEMA, "columns": COLUMNS, "schedule": None,
                                "trigger": trigger, "spark_runtime": "connect"}
        for n in range(pipelines)}}))
    os.environ[env_name("pipelines")] = str(config)
    return list(read_pipelines(config).all_valid().values())


def _dags(client: AirflowClient, run_id: str = "", stale_too: bool = False) -> list[dict[str, Any]]:
    """The DAGs of this run's pipelines (of every run's, without `run_id`)."""
    dags: list[dict[str, Any]] = []
    while True:
        page = client.request("GET", "/api/v2/dags", params={
            "dag_id_pattern": f"fleet_{run_id}", "exclude_stale": not stale_too, "limit": 100,
            "offset": len(dags)}).json()["dags"]
        dags.extend(page)
        if len(page) < 100:
            return dags


def cpu_seconds(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        try:
            times = psutil.Process(pid).cpu_times()
        except psutil.Error:  # ended meanwhile
            continue
        total += times.user + times.system
    return total


def machine_cpu_seconds() -> float:
    """The whole machine's CPU seconds so far (user and system, every core)."""
    times = psutil.cpu_times()
    return times.user + times.system


def _status_of_all() -> None:
    done = subprocess.run(["kafka-ledger", "status"], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"kafka-ledger status exited {done.returncode}: {done.stderr.strip()[-2000:]}")


def _timed(call: Any, rounds: int) -> list[float]:
    seconds = []
    for _ in range(rounds):
        started = time.monotonic()
        call()
        seconds.append(round(time.monotonic() - started, 3))
    return seconds


def _published(dsn: str, pipelines: list[PipelineConfig]) -> int:
    with ledger.transaction(LedgerDatabase(dsn)) as cur:
        return sum(sum(ledger.positions(cur, p.name).values()) for p in pipelines)


def _wait_published(dsn: str, pipelines: list[PipelineConfig], total: int, timeout: float) -> float:
    started = time.monotonic()
    while (published := _published(dsn, pipelines)) < total:
        if time.monotonic() - started > timeout:
            raise RuntimeError(f"{published} of {total} records published after {timeout:.0f} s")
        time.sleep(1)
    return round(time.monotonic() - started, 1)


def load(client: AirflowClient, servers: str, dsn: str, declared: list[PipelineConfig], carrier_dag_id: str,
         rate_per_pipeline: float, minutes: float, partitions: int) -> dict[str, Any]:
    """The load: `rate_per_pipeline` records per second into every pipeline's topic for `minutes`, carried by the
    carrier; the triggerer's and the Spark Connect server's CPU meanwhile, each record's delay from its Kafka
    timestamp to the commit that published it, and whether every pipeline published its topic's records exactly."""
    topics = [p.topics[0] for p in declared]
    warm_up = WARM_UP_PER_PIPELINE * len(topics)
    unpaused = time.monotonic()
    produce_steadily(servers, topics, warm_up, 1.0, partitions)
    result: dict[str, Any] = {"rate_per_pipeline": rate_per_pipeline, "minutes": minutes,
                              "warm_up": {"records": warm_up, "published_after_s": round(
                                  _wait_published(dsn, declared, warm_up, LOAD_CATCH_UP_SECONDS)
                                  + time.monotonic() - unpaused, 1)}}
    load_started = datetime.now().astimezone()
    watched = {"triggerer": component_processes(client.session_id, "triggerer"),
               "spark_connect_server": with_children(service_pids()["spark-connect"])}
    before = {name: cpu_seconds(pids) for name, pids in watched.items()}
    machine_before, started = machine_cpu_seconds(), time.monotonic()
    produced = produce_steadily(servers, topics, rate_per_pipeline * len(topics), minutes * 60, partitions)
    took = time.monotonic() - started
    machine_after = machine_cpu_seconds()
    result["cpu_cores_under_load"] = {
        **{name: round((cpu_seconds(pids) - before[name]) / took, 3) for name, pids in watched.items()},
        "machine": round((machine_after - machine_before) / took, 2)}
    result["produced"] = produced
    total = warm_up + produced["records"]
    result["caught_up_after_load_s"] = _wait_published(dsn, declared, total, LOAD_CATCH_UP_SECONDS)
    runs = client.wait_until_idle(carrier_dag_id, timeout=LOAD_CATCH_UP_SECONDS)
    result["carrier_runs"] = dict(Counter(run["state"] for run in runs))
    # Exact: each pipeline's table holds its topic's records, each once; the delays are the load's records'.
    ends = kafka_offsets.partition_offsets(kafka_for(servers), topics)
    exact = True
    at_seconds, delays = [], []
    for pipeline in declared:
        table = f"{SCHEMA}.{pipeline.output_table}"
        in_kafka = sum(o.end for tp, o in ends.items() if tp.topic == pipeline.topics[0])
        rows = scalar(dsn, f"SELECT count(*) FROM {table} o JOIN kafka_ledger.batches b USING (batch_id)")
        distinct = scalar(dsn, f"SELECT count(DISTINCT (kafka_partition, kafka_offset)) FROM {table}")
        exact = exact and rows == distinct == in_kafka
        at, delay = record_delays(dsn, f"{table} o JOIN kafka_ledger.batches b USING (batch_id)", load_started)
        at_seconds.append(at)
        delays.append(delay)
    result["exact"] = exact
    result["kafka_ledger"] = delay_report(np.concatenate(at_seconds), np.concatenate(delays))
    return result


def run_pipelines_benchmark(servers: str, dsn: str, pipelines: int, partitions: int, rounds: int,
                            load_minutes: float = 0.0, rate_per_pipeline: float = LOAD_RATE_PER_PIPELINE
                            ) -> dict[str, Any]:
    """The whole benchmark (see the module); returns its summary."""
    run_id = uuid.uuid4().hex[:6]
    workdir = Path(tempfile.mkdtemp(prefix="kl-pipelines-"))
    carrier = f"fleet_{run_id}"
    declared = declare(workdir, run_id, pipelines, carrier)
    carrier_dag_id = f"{CARRIER_DAG_ID_PREFIX}{carrier}"
    admin = AdminClient(kafka_for(servers).confluent())
    for pipeline in declared:
        create_topic(admin, pipeline.topics[0], partitions)
    load_before = os.getloadavg()[0]
    summary: dict[str, Any] = {"pipelines": pipelines, "partitions": partitions, "rounds": rounds}
    try:
        with running_airflow() as client:
            started = time.monotonic()
            while len(dags := _dags(client, run_id)) < pipelines + 1:
                if time.monotonic() - started > 600:
                    raise RuntimeError(f"{len(dags)} of {pipelines} DAGs parsed after 600 s (log: {client.log_path})")
                time.sleep(2)
            # An earlier run's DAGs stay in Airflow's database (stale, their pipelines no longer declared) with
            # their doorbells still watched: they would count in the triggerer's CPU.
            for dag in _dags(client, stale_too=True):
                if not dag["dag_id"].startswith((f"{DAG_ID_PREFIX}fleet_{run_id}_", carrier_dag_id)):
                    client.request("DELETE", f"/api/v2/dags/{dag['dag_id']}", expect=(200, 204, 404))
            errors = client.request("GET", "/api/v2/importErrors").json()["total_entries"]
            durations = [d["last_parse_duration"] for d in dags if d.get("last_parse_duration") is not None]
            summary["dags"] = {"parsed": len(dags), "import_errors": errors, "seen_after_s": round(
                time.monotonic() - started, 1), "dag_file_processing_s": max(durations) if durations else None}
            for dag in dags:
                client.set_paused(dag["dag_id"], False)
            time.sleep(SETTLE_SECONDS)
            # The triggerer polls the doorbells; the dag-processor re-parses the DAG file (every 5 s here, as in
            # the stack's Airflow) and the scheduler looks for work: each one's share of a core while idle.
            components = {name: component_processes(client.session_id, name)
                          for name in ("triggerer", "dag-processor", "scheduler")}
            before = {name: cpu_seconds(pids) for name, pids in components.items()}
            time.sleep(IDLE_SECONDS)
            summary["idle_cpu_cores"] = {name: round((cpu_seconds(pids) - before[name]) / IDLE_SECONDS, 3)
                                         for name, pids in components.items()}
            summary["idle_over_s"] = IDLE_SECONDS
            # The doorbells of a triggerer share one ledger connection (airflow/doorbell.py Lookout). One each,
            # before, left Postgres (max_connections 200) none for `kafka-ledger status` at 200 pipelines.
            with psycopg2.connect(dsn) as conn, conn.cursor() as cur:
                cur.execute("SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend'")
                summary["postgres_connections_while_idle"] = cur.fetchone()[0]
            conn.close()
            status = _timed(_status_of_all, rounds)
            page = _timed(lambda: client.request("GET", "/kafka-ledger/"), rounds)
            summary["status_s"] = {"median": statistics.median(status), "rounds": status}
            summary["page_s"] = {"median": statistics.median(page), "rounds": page}
            summary["answers_within_target"] = max(statistics.median(status), statistics.median(page)) \
                <= ANSWER_TARGET_SECONDS
            runs = sum(len(client.runs(dag["dag_id"])) for dag in dags)
            summary["runs_while_idle"] = runs
            if load_minutes:
                summary["load"] = load(client, servers, dsn, declared, carrier_dag_id, rate_per_pipeline,
                                       load_minutes, partitions)
            for dag in dags:
                client.set_paused(dag["dag_id"], True)
        # Every DAG parsed, and nothing ran: no record arrived, so no doorbell may ring.
        summary["ok"] = summary["dags"]["parsed"] == pipelines + 1 and summary["dags"]["import_errors"] == 0 \
            and runs == 0 and (not load_minutes or (summary["load"]["exact"] and summary["load"]["kafka_ledger"][
                "p99"] <= LOAD_P99_TARGET_SECONDS))
    finally:
        with ledger.transaction(LedgerDatabase(dsn)) as cur:
            for pipeline in declared:
                remove_pipeline(cur, pipeline)
        for future in admin.delete_topics([p.topics[0] for p in declared]).values():
            future.result(60)
    summary["load_average"] = [round(load_before, 2), round(os.getloadavg()[0], 2)]
    summary["commit"] = git_commit()
    return summary
