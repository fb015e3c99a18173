"""The campaign's command line (`python -m tools.fault_campaign`, run by scripts/fault_campaign.sh): a new
campaign or a resumed one, its console lines, its logs, and the docs it writes; `task` runs one task."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import uuid
from pathlib import Path

import tools.fault_campaign
from kafka_ledger.config.settings import kafka_client, kafka_for, ledger_database
from tools import git_commit
from tools.cdc import TYPED_DEBEZIUM
from tools.fault_campaign import PROJECT_ROOT, CampaignFailure
from tools.fault_campaign.network import proxied_environment
from tools.fault_campaign.report import write_docs
from tools.fault_campaign.runner import NETWORK_DB_STATEMENT_SECONDS, Campaign, task_main
from tools.fault_campaign.strikes import FAULT_KINDS, secured
from tools.fault_campaign.typed_events import TYPED_CAMPAIGN_COLUMNS
from tools.kafka_topics import create_topic
from tools.records import COLUMNS


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["task"]:
        return task_main(argv[1:])
    parser = argparse.ArgumentParser(prog="python -m tools.fault_campaign",
                                     description=tools.fault_campaign.__doc__.split("\n\n")[0],
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
    parser.add_argument("--driver-in-cluster", action="store_true",
                        help="with --cluster and the submit runtime: each batch's driver runs on the cluster's worker "
                             "(the spark_default connection's deploy-mode cluster; scripts/fault_campaign.sh gives "
                             "the worker 4 cores and 6 GB, room for two drivers and their executors)")
    parser.add_argument("--network", action="store_true",
                        help="every task reaches Kafka, the ledger and the Spark Connect server through Toxiproxy "
                             "(scripts/fault_campaign.sh --network starts it), adding the network faults (runtime "
                             "connect)")
    parser.add_argument("--network-weight", type=int, default=1, metavar="N",
                        help="with --network: each network fault N times per round of the other kinds (default 1)")
    parser.add_argument("--secure", action="store_true",
                        help="every Kafka client over the broker's SASL_SSL listener and the ledger over verified TLS "
                             "(scripts/fault_campaign.sh --secure sets them, as scripts/demo.sh --secure does)")
    parser.add_argument("--sink", choices=["postgres", "iceberg"], default="postgres",
                        help="where the pipeline publishes: its Postgres table, or an Iceberg table of the stack's "
                             "lake, adding the lake's faults")
    parser.add_argument("--format", choices=["json", "avro", "protobuf"], default="json",
                        help="the records' values: JSON, or Avro written by confluent-kafka's AvroSerializer (Protobuf "
                             "by its ProtobufSerializer) through the stack's schema registry, which every task reaches "
                             "through Toxiproxy (scripts/fault_campaign.sh --format avro|protobuf starts it), adding "
                             "the registry's faults")
    parser.add_argument("--write", choices=["append", "upsert"], default="append",
                        help="the pipeline's write: append (a row per record) or upsert (an entity table keyed by "
                             "event_id: each record a version of one of 97 entities, some tombstones)")
    parser.add_argument("--envelope", choices=["none", "debezium"], default="none",
                        help="with --write upsert: debezium, each record a Debezium change event (updates of the "
                             "entities' row images, deletes, the Kafka tombstones after them, events not applied)")
    parser.add_argument("--typed", action="store_true",
                        help="with --envelope debezium: the change events of a wide table of PostgreSQL's everyday "
                             "types as Debezium writes them without schemas (dates, timestamps, times, numerics, "
                             "bytea, uuid, json, arrays...), updates among them that leave its TOASTed text and jsonb "
                             "unchanged (Debezium's placeholder in their place): every value compared")
    parser.add_argument("--doorbell", action="store_true",
                        help="the pipeline runs by its doorbell under a dedicated Airflow (scheduler, triggerer), "
                             "whose triggerer and scheduler the faults kill (tools/fault_campaign/doorbell.py)")
    parser.add_argument("--carrier", action="store_true",
                        help="with --doorbell: the pipeline is carried by a carrier (trigger.carrier) with a companion "
                             "member whose topic stays empty; the carrier's DAG, doorbell and task take the faults")
    parser.add_argument("--rate", type=float, metavar="RECORDS_PER_S",
                        help="with --doorbell: records per second the producer writes at (default: a twelfth of "
                             "--records-per-fault), e.g. 6000, the talk's rate")
    parser.add_argument("--write-docs", type=Path, metavar="DIR",
                        help="write reliability.json (and the per-iteration log) into DIR, e.g. docs")
    parser.add_argument("--keep", action="store_true", help="keep the topic, tables and ledger rows afterwards")
    parser.add_argument("--resume", type=Path, metavar="DIR",
                        help="go on with the interrupted campaign saved in DIR (printed when it started)")
    args = parser.parse_args(argv)
    if args.cluster and not os.environ.get("KAFKA_LEDGER_SPARK_MASTER", "").startswith("spark://"):
        parser.error("--cluster: KAFKA_LEDGER_SPARK_MASTER names no cluster: run scripts/fault_campaign.sh --cluster")
    if args.driver_in_cluster and not (args.cluster and args.runtime == "submit"):
        parser.error("--driver-in-cluster: with --cluster --runtime submit (the connect runtime's driver: its server)")
    if args.format != "json" and (args.doorbell or args.write != "append"):
        parser.error(f"--format {args.format}: a campaign of plain runs (no --doorbell) into an append-only table")
    if args.envelope != "none" and args.write != "upsert":
        parser.error("--envelope debezium: change events go into an entity table (--write upsert)")
    if args.typed and (args.envelope != "debezium" or args.doorbell):
        parser.error("--typed: the typed table's change events (--write upsert --envelope debezium), plain runs")
    if args.carrier and not args.doorbell:
        parser.error("--carrier: with --doorbell (a carrier carries doorbell pipelines)")
    if args.rate and not args.doorbell:
        parser.error("--rate: only with --doorbell (the other campaigns produce a twelfth of --records-per-fault a "
                     "second)")
    if args.secure and not secured():
        parser.error("--secure: Kafka is not reached over SASL_SSL, or the ledger's URL does not verify its server: "
                     "run scripts/fault_campaign.sh --secure")

    import psycopg2
    import yaml
    from confluent_kafka.admin import AdminClient

    from kafka_ledger.config.pipeline import get_pipeline, read_pipelines
    from kafka_ledger.config.settings import deployment_spark_runtime
    from kafka_ledger.sinks import IcebergSink, remove_pipeline

    dsn, servers = ledger_database().url, kafka_client().servers
    if args.resume:
        workdir = args.resume.resolve()
        if not (workdir / "state.json").exists():
            parser.error(f"{workdir} holds no saved campaign (state.json): it stopped before its first iteration")
        settings = json.loads((workdir / "campaign.json").read_text())
        # Each session's commit, so that the report names every commit the campaign ran at.
        commit = git_commit()
        if settings.setdefault("commits", [])[-1:] != [commit]:
            settings["commits"].append(commit)
            (workdir / "campaign.json").write_text(json.dumps(settings, indent=2))
    else:
        tag = f"{args.seed}_{uuid.uuid4().hex[:6]}"
        workdir = Path(os.environ.get("KL_STATE", PROJECT_ROOT / ".stack")) / "fault-campaign" / tag
        runtime = args.runtime or deployment_spark_runtime()
        if args.carrier and runtime != "connect":
            parser.error("--carrier: a carrier reads on the Spark Connect server: add --runtime connect")
        command = "bash scripts/fault_campaign.sh " + " ".join(
            f"--{k.replace('_', '-')} {v}" for k, v in (("runtime", runtime), ("faults", args.faults),
                                                        ("seed", args.seed),
                                                        ("records_per_fault", args.records_per_fault),
                                                        ("partitions", args.partitions)))
        if args.secure:
            command += " --secure"
        if args.cluster:
            command += " --cluster"
        if args.driver_in_cluster:
            command += " --driver-in-cluster"
        if args.network:
            command += " --network"
        if args.sink != "postgres":
            command += f" --sink {args.sink}"
        if args.write != "append":
            command += f" --write {args.write}"
        if args.format != "json":
            command += f" --format {args.format}"
        if args.envelope != "none":
            command += f" --envelope {args.envelope}"
        if args.typed:
            command += " --typed"
        if args.doorbell:
            command += " --doorbell"
        if args.carrier:
            command += " --carrier"
        if args.rate:
            command += f" --rate {args.rate:g}"
        if args.network_weight != 1:
            command += f" --network-weight {args.network_weight}"
        if args.write_docs:
            command += f" --write-docs {args.write_docs}"
        if args.cluster and runtime == "connect":
            # The cluster's cores the Spark Connect server holds shape the campaign: the command says how many.
            command = f"KL_SPARK_CONNECT_CORES={os.environ['KL_SPARK_CONNECT_CORES']} {command}"
        settings = {"command": command, "write_docs": str(args.write_docs) if args.write_docs else None,
                    "keep": args.keep, "pipeline": f"fault_campaign_{tag}", "partitions": args.partitions,
                    "runtime": runtime, "network": args.network, "sink": args.sink, "write": args.write,
                    "doorbell": args.doorbell, "carrier": args.carrier, "format": args.format,
                    "envelope": args.envelope, "typed": args.typed,
                    "driver_in_cluster": args.driver_in_cluster,
                    "topic": f"fault-campaign-{tag.replace('_', '-')}", "commits": [git_commit()]}
    if settings.get("driver_in_cluster"):
        # The submit runtime's spark-submit puts the driver on the cluster, as a deployment's connection would.
        os.environ["AIRFLOW_CONN_SPARK_DEFAULT"] = json.dumps({
            "conn_type": "spark", "host": os.environ["KAFKA_LEDGER_SPARK_MASTER"], "extra": {"deploy-mode": "cluster"}})
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
    admin = AdminClient(kafka_for(servers).confluent())
    if args.resume:
        pipeline = get_pipeline(name)
        # A doorbell campaign is taken up under the Airflow it starts below.
        campaign = None if settings.get("doorbell") else Campaign.resume(pipeline, dsn, servers, workdir)
        if campaign is not None:
            say(f"fault campaign resumed from {workdir}: {len(campaign.iterations)} of {campaign.faults} faults done")
    else:
        (workdir / "campaign.json").write_text(json.dumps(settings, indent=2))
        output = ({"sink": {"type": "iceberg", "namespace": "fault_campaign", "table": name}}
                  if settings.get("sink") == "iceberg" else {"output_schema": "fault_campaign", "output_table": name})
        carrier = f"campaign_{tag}" if settings.get("carrier") else None
        companion = {f"{name}_companion": {
            "topics": [f"{topic}-companion"], "output_schema": "fault_campaign", "output_table": f"{name}_companion",
            "columns": COLUMNS, "schedule": None, "spark_runtime": settings["runtime"],
            "trigger": {"type": "doorbell", "poll_seconds": 1, "carrier": carrier}}} if carrier else {}
        config.write_text(yaml.safe_dump({"pipelines": {**companion, name: {
            "topics": [topic], **output, "columns": TYPED_CAMPAIGN_COLUMNS if settings.get("typed") else COLUMNS,
            "value": {"format": settings.get("format", "json"), "envelope": settings.get("envelope", "none"),
                      **({"debezium": TYPED_DEBEZIUM} if settings.get("typed") else {})},
            "max_records_per_partition": max(100, args.records_per_fault // args.partitions), "schedule": None,
            # A driver on the worker holds one of its cores: each application one executor core at most, so that
            # two drivers (a resubmission, racing runs) never hold every core while their executors wait for one.
            "spark_conf": {"spark.sql.shuffle.partitions": "2",
                           **({"spark.cores.max": "1"} if settings.get("driver_in_cluster") else {})},
            "spark_runtime": settings["runtime"],
            **({"write": "upsert", "key": ["event_id"]} if settings.get("write") == "upsert" else {}),
            # A doorbell campaign's killed Spark task is retried within seconds (the default waits a minute).
            **({"trigger": {"type": "doorbell", "poll_seconds": 1, **({"carrier": carrier} if carrier else {})},
                "retry_delay_seconds": 2} if settings.get("doorbell") else {}),
        }}}))
        if carrier:
            create_topic(admin, f"{topic}-companion", 2)
        # Every acknowledged record on disk at once, so a campaign resumed after the machine stopped still has
        # them all (the broker otherwise leaves flushing to the OS).
        create_topic(admin, topic, args.partitions, config={"flush.messages": "1"})
        pipeline = get_pipeline(name)
        campaign = None if args.doorbell else Campaign(pipeline, dsn, servers, args.seed, args.faults,
                                                       args.records_per_fault, workdir, network=settings["network"],
                                                       network_weight=args.network_weight, typed=args.typed)
        say(f"fault campaign ({campaign.shape if campaign else 'doorbell'}): {args.faults} faults, seed {args.seed}, "
            f"{args.records_per_fault} records per fault, "
            f"topic {topic} ({args.partitions} partitions); logs in {workdir}; if it is interrupted, go on with "
            f"`{settings['command']} --resume {workdir}` (the same stack: its flags set it up)")
    try:
        if campaign is None:  # the doorbell's: Airflow's own scheduler and triggerer run the pipeline
            # Imported here: they import Airflow, which every campaign task process (`task`, main's first branch)
            # would otherwise load at its start, changing the timing its faults were drawn for.
            from tools.airflow_server import running_airflow
            from tools.fault_campaign.doorbell import DoorbellCampaign

            if settings["network"]:
                # Airflow's tasks and triggerer reach the services through the proxies; the campaign's own checks
                # and producer do not (dsn and servers were read before).
                os.environ.update(proxied_environment(dict(os.environ)))
                os.environ.setdefault("KAFKA_LEDGER_DB_STATEMENT_TIMEOUT", str(NETWORK_DB_STATEMENT_SECONDS))
            with running_airflow() as airflow:
                if args.resume:
                    campaign = DoorbellCampaign.resume_under(airflow, pipeline, dsn, servers, workdir)
                    say(f"fault campaign resumed from {workdir}: {len(campaign.iterations)} of {campaign.faults} "
                        "faults done")
                else:
                    campaign = DoorbellCampaign(pipeline, dsn, servers, args.seed, args.faults,
                                                args.records_per_fault, workdir, airflow, network=settings["network"],
                                                rate=args.rate)
                report = campaign.run_all(progress=say)
        else:
            report = campaign.run_all(progress=say)
    except CampaignFailure as exc:
        say(f"FAILED: {exc}\nreproduce with: {settings['command']}\nthe topic, tables and ledger rows are kept "
            f"for inspection; logs in {workdir}")
        return 1
    if not settings["keep"]:
        companions = [p for p in read_pipelines(config).valid.values() if p.name != pipeline.name]
        with psycopg2.connect(dsn) as conn, conn.cursor() as cur:
            for declared in [pipeline, *companions]:
                remove_pipeline(cur, declared)
        conn.close()
        for companion in companions:
            admin.delete_topics(companion.topics)[companion.topics[0]].result(timeout=30)
        if campaign.iceberg:
            sink = IcebergSink(pipeline)
            sink.catalog().purge_table(sink.identifier)
        admin.delete_topics([topic])[topic].result(timeout=30)
    # Every session's commit, the last one's also alone (the reports written before the list name only that).
    report["git_commits"] = settings["commits"]
    report["git_commit"] = settings["commits"][-1]
    summary = {k: v for k, v in report.items() if k != "iterations"}
    say(json.dumps(summary, indent=2))
    if settings["write_docs"]:
        write_docs(report, settings["command"], Path(settings["write_docs"]))
    return 0
