"""Many pipelines on one Airflow (`python -m tools.benchmark --pipelines 200`): what declaring them costs before any
record arrives.

PIPELINES pipelines of --partitions partitions each (a topic each, doorbells on, polling every 5 s, the default) are
declared, and a dedicated Airflow (tools/airflow_server.py) runs them: every DAG must parse (no import error), the
DAG file's processing time is the dag-processor's own figure (`last_parse_duration`); all are unpaused, and once
their doorbells are registered the CPU of the triggerer, the dag-processor and the scheduler (their processes, user
and system time) is measured while nothing arrives; `kafka-ledger status` of all of them and the Kafka Ledger page
(`/kafka-ledger/`, through the api-server with a token, as the UI loads it) are timed `--rounds` times, medians
printed, against the issue's 2 s.

Not yet here (issue 42, item 3): the load (50 records/s a pipeline) with its triggerer CPU and freshness p99. Two
hundred carrying runs cannot each hold a task process (about 300 MB each) on one machine: that needs a design first.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import psutil
import psycopg2
import yaml
from confluent_kafka.admin import AdminClient

from kafka_ledger.config.pipeline import DAG_ID_PREFIX, PipelineConfig, read_pipelines
from kafka_ledger.config.services import LedgerDatabase
from kafka_ledger.config.settings import env_name, kafka_for
from kafka_ledger.ledger import db as ledger
from kafka_ledger.sinks import remove_pipeline
from tools import git_commit
from tools.airflow_server import AirflowClient, component_processes, running_airflow
from tools.benchmark_peers import COLUMNS
from tools.kafka_topics import create_topic

SCHEMA = "benchmark"
ANSWER_TARGET_SECONDS = 2.0  # `kafka-ledger status` and the page, for all the pipelines
SETTLE_SECONDS = 60  # after unpausing: every doorbell registered with the triggerer, its first polls done
IDLE_SECONDS = 60  # the triggerer's CPU measured over this long


def declare(workdir: Path, run_id: str, pipelines: int) -> list[PipelineConfig]:
    """The pipelines file: PIPELINES doorbell pipelines, a topic and an output table each."""
    config = workdir / "pipelines.yaml"
    config.write_text(yaml.safe_dump({"pipelines": {
        f"fleet_{run_id}_{n}": {"topics": [f"fleet-{run_id}-{n}"], "output_table": f"fleet_{run_id}_{n}",
                                "output_schema": SCHEMA, "columns": COLUMNS, "schedule": None,
                                "trigger": {"type": "doorbell"}, "spark_runtime": "connect"}
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


def _cpu_seconds(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        try:
            times = psutil.Process(pid).cpu_times()
        except psutil.Error:  # ended meanwhile
            continue
        total += times.user + times.system
    return total


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


def run_pipelines_benchmark(servers: str, dsn: str, pipelines: int, partitions: int, rounds: int) -> dict[str, Any]:
    """The whole benchmark (see the module); returns its summary."""
    run_id = uuid.uuid4().hex[:6]
    workdir = Path(tempfile.mkdtemp(prefix="kl-pipelines-"))
    declared = declare(workdir, run_id, pipelines)
    admin = AdminClient(kafka_for(servers).confluent())
    for pipeline in declared:
        create_topic(admin, pipeline.topics[0], partitions)
    load_before = os.getloadavg()[0]
    summary: dict[str, Any] = {"pipelines": pipelines, "partitions": partitions, "rounds": rounds}
    try:
        with running_airflow() as client:
            started = time.monotonic()
            while len(dags := _dags(client, run_id)) < pipelines:
                if time.monotonic() - started > 600:
                    raise RuntimeError(f"{len(dags)} of {pipelines} DAGs parsed after 600 s (log: {client.log_path})")
                time.sleep(2)
            # An earlier run's DAGs stay in Airflow's database (stale, their pipelines no longer declared) with
            # their doorbells still watched: they would count in the triggerer's CPU.
            for dag in _dags(client, stale_too=True):
                if not dag["dag_id"].startswith(f"{DAG_ID_PREFIX}fleet_{run_id}_"):
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
            before = {name: _cpu_seconds(pids) for name, pids in components.items()}
            time.sleep(IDLE_SECONDS)
            summary["idle_cpu_cores"] = {name: round((_cpu_seconds(pids) - before[name]) / IDLE_SECONDS, 3)
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
            for dag in dags:
                client.set_paused(dag["dag_id"], True)
            runs = sum(len(client.runs(dag["dag_id"])) for dag in dags)
            summary["runs_while_idle"] = runs
        # Every DAG parsed, and nothing ran: no record arrived, so no doorbell may ring.
        summary["ok"] = summary["dags"]["parsed"] == pipelines and summary["dags"]["import_errors"] == 0 \
            and runs == 0
    finally:
        with ledger.transaction(LedgerDatabase(dsn)) as cur:
            for pipeline in declared:
                remove_pipeline(cur, pipeline)
        for future in admin.delete_topics([p.topics[0] for p in declared]).values():
            future.result(60)
    summary["load_average"] = [round(load_before, 2), round(os.getloadavg()[0], 2)]
    summary["commit"] = git_commit()
    return summary
