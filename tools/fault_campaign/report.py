"""The reliability docs a campaign writes with --write-docs: reliability-<shape>.json and its iterations, then
docs/reliability.json and docs/reliability.md from the last campaign of every shape found there."""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from tools.fault_campaign.producer import BAD_EVERY
from tools.fault_campaign.strikes import fault_kinds

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
    "submit-cluster-driver": "Spark 4.0.0 through one spark-submit per batch in cluster deploy mode on the local "
                             "standalone cluster (one master, one worker running the batch's driver and its "
                             "executor), staging then committing",
}

# How an Iceberg sink's batch is published, in either runtime (lake_publish.py).
ICEBERG_PUBLISH = ("Spark writing each batch as one Iceberg snapshot (Iceberg 1.11.0, its JDBC catalog in the stack's "
                   "Postgres), then the ledger's transaction recording that snapshot and moving the offsets")


def cell(counter: dict[str, int], separator: str = "<br>") -> str:
    """A table cell of counts, the largest first."""
    return separator.join(f"{name}: {n}" for name, n in sorted(counter.items(), key=lambda kv: -kv[1]))


def render_campaign(data: dict[str, Any], iterations: list[dict[str, Any]]) -> list[str]:
    """The section of docs/reliability.md for one runtime's last campaign."""
    shape = data.get("shape", data.get("runtime", "submit"))
    full = data["faults_injected"] >= 200 and data["records_produced"] >= 1_000_000
    hours, rest = divmod(int(data["elapsed_seconds"]), 3600)
    took = f"{hours} h {rest // 60} min" if hours else f"{rest // 60} min {rest % 60} s"
    recovered: dict[str, Counter] = defaultdict(Counter)
    for it in iterations:
        recovered[it["fault"]][it["recovered_by"]] += 1
    runtime, *traits = shape.split("-")
    network, secure, iceberg = "network" in traits, "secure" in traits, "iceberg" in traits
    doorbell, avro, protobuf = "doorbell" in traits, "avro" in traits, "protobuf" in traits
    change_events, entity = "cdc" in traits, "entity" in traits or "cdc" in traits
    spark = runtime + ("-cluster" if "cluster" in traits else "") + ("-driver" if "driver" in traits else "")
    lines = [f"## Runtime `{runtime}`" + (" on a Spark cluster" if "cluster" in traits else "")
             + (", its driver on the cluster's worker (cluster deploy mode)" if "driver" in traits else "")
             + (", Kafka over SASL_SSL and the ledger over verified TLS" if secure else "")
             + (", through network proxies" if network else "")
             + (", into an Iceberg table" if iceberg else "")
             + (", Avro values through the schema registry" if avro else "")
             + (", Protobuf values through the schema registry" if protobuf else "")
             + (", Debezium change events into an entity table" if change_events
                else ", into an entity table" if entity else "")
             + (" (a wide table of PostgreSQL's everyday types without the JsonConverter's schemas, updates that "
                "leave its TOASTed text and jsonb unchanged)" if "typed" in traits else "")
             + (", run by its doorbell under Airflow" if doorbell else ""), ""]
    if not full:
        lines += ["**This is not a full campaign** (at least 200 faults over at least 1,000,000 records): "
                  "it is the last shorter one.", ""]
    sessions = data.get("sessions", 1)
    commits = data.get("git_commits", [data.get("git_commit", "?")])
    lines += [
        (f"Commit `{commits[0]}`" if len(commits) == 1 else
         f"Commits `{commits[0]}` (started), then " + ", then ".join(f"`{c}`" for c in commits[1:]) + " (resumed)")
        + f", started {data['started_at']}, took {took} "
        f"on a 2-core machine (Kafka 4.1.1 KRaft, PostgreSQL 15, "
        + (f"{RUNTIMES[spark].split(', ')[0]}, {ICEBERG_PUBLISH}" if iceberg else RUNTIMES[spark])
        + (", every Kafka client over the broker's SASL_SSL listener (SCRAM-SHA-512), the ledger over TLS with "
           "sslmode=verify-full" if secure else "")
        + (", every task reaching Kafka, the ledger and the Spark Connect server through Toxiproxy 2.5.0" if network
           else "")
        + (", the values Avro written by confluent-kafka's AvroSerializer through Apicurio Registry 2.6.13 (its "
           "Confluent API), which every task reaches through Toxiproxy 2.5.0; one bad record in "
           f"{BAD_EVERY}: a value not in the wire format, an unknown schema id, a payload that does not decode, a "
           "missing required field, a tombstone" if avro else "")
        + (", the values Protobuf written by confluent-kafka's ProtobufSerializer through Apicurio Registry 2.6.13 "
           "(its Confluent API), which every task reaches through Toxiproxy 2.5.0; one bad record in "
           f"{BAD_EVERY}: a value not in the wire format, an unknown schema id, a message index naming no message, a "
           "payload cut short, a missing required field, a tombstone" if protobuf else "")
        + (f", the runs started by the pipeline's doorbell under Airflow {data.get('airflow', '3')}'s own scheduler "
           f"and triggerer, each run carrying batch after batch, {data['records_per_fault']:,} records per fault "
           f"produced at {data.get('rate', 0):,.0f} records/s and more while a strike waits for its moment"
           if doorbell else "") + ")"
        + (f", over {sessions} working sessions: the campaign was resumed from its "
           "last checkpoint, every process of the interrupted iteration having been "
           "killed and the services restarted; the next runs recovered and the checks "
           "passed before it went on (" + "; ".join(data.get("interruptions", [])) + ")"
           if sessions > 1 else "") + ".",
        "",
        "| | |",
        "| --- | --- |",
        f"| faults injected | {data['faults_injected']} |",
        f"| {'events' if change_events else 'records'} produced | {data['records_produced']:,} |",
        *([f"| entities in the table (each its newest version) | {data['output_rows']:,} |",
           f"| entities deleted (their deletes kept as tombstones) | {data['tombstones']:,} |"] if entity else
          [f"| published rows | {data['output_rows']:,} |"]),
        f"| dead letters (bad records, each with its expected reason) | {data['dead_letters']:,} |",
        f"| **lost** | **{data['lost']}** |",
        f"| **duplicated** | **{data['duplicated']}** |",
        f"| rows for records never produced | {data['unexpected']} |",
        f"| rows or dead letters with the wrong content | {data['wrong_content']} |",
        f"| `kafka-ledger verify` against Kafka | {'OK' if data['verify_ok'] else 'FAILED'} |",
        (f"| pipeline runs (by state) | {data['pipeline_runs']} ({cell(data.get('runs_by_state', {}), ', ')}) |"
         if doorbell else f"| pipeline runs / Spark task tries | {data['pipeline_runs']} / "
                          f"{data.get('spark_tasks', data.get('spark_submits'))} |"),
        "",
        ("Every check passed after every fault: the table, its tombstones and the dead letters equal to the model "
         "of the records produced below the positions (per entity its newest "
         + ("applied event: its row image, or its delete; the Kafka tombstones after deletes change nothing"
            if change_events else "record: its version, or its tombstone")
         + ("; every value of every column equal to its event's, an unchanged TOASTed value equal to the entity's "
            "value before the event, and such an event of an entity without a row a dead letter saying so"
            if "typed" in traits else "")
         + "; every bad record a dead letter with its reason), committed ranges tiling each partition without gap "
         "or overlap, no position moving back." if entity else
         "Every check passed after every fault: output ∪ dead letters equal to the records produced below the "
         "positions as sets of (topic, partition, offset), no record twice, committed ranges tiling each "
         "partition without gap or overlap, no position moving back"
         + (" (the output: the Iceberg table as pyiceberg reads it, without Spark; and every committed batch's "
            "snapshot in the table's current history)." if iceberg else ".")),
        "",
        "| fault | injected | variants | where it landed | recovered by |",
        "| --- | --- | --- | --- | --- |",
    ]

    for kind in (data["faults_by_kind"] if doorbell else fault_kinds(shape)):
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
        "Generated by the fault campaign (`tools/fault_campaign/`) with `--write-docs` from the last campaign of "
        "each shape it ran on (the Spark runtime; on the local cluster or not; Kafka over SASL_SSL and the ledger "
        "over verified TLS or not; through the network proxies or not; into a Postgres table, an entity table or "
        "an Iceberg table; JSON, Avro or Protobuf values, or Debezium's change events), the production shape first; "
        "the same "
        "figures are in [reliability.json](reliability.json), every iteration in "
        "`reliability-<shape>-iterations.json`. How the campaign works: "
        "[testing.md](testing.md#fault-campaign).",
        "",
    ]
    for shape in campaigns:
        lines += render_campaign(*campaigns[shape])
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
    regenerate(docs)


def regenerate(docs: Path) -> None:
    """reliability.json and reliability.md again, from the last campaign of every shape found in `docs`."""
    campaigns = {}
    # Every shape's last campaign; the production shape (most traits) first.
    shapes = [path.stem.removeprefix("reliability-") for path in docs.glob("reliability-*.json")
              if not path.stem.endswith("-iterations")]
    for name in sorted(shapes, key=lambda shape: (-shape.count("-"), shape)):
        campaigns[name] = (json.loads((docs / f"reliability-{name}.json").read_text()),
                           json.loads((docs / f"reliability-{name}-iterations.json").read_text()))
    (docs / "reliability.json").write_text(json.dumps({name: c[0] for name, c in campaigns.items()}, indent=2) + "\n")
    (docs / "reliability.md").write_text(render_report(campaigns))
