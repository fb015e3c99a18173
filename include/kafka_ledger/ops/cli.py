"""The `kafka-ledger` command: status, batches, plan, replay, reset and verify of declared pipelines, and more.

Exit codes: 0 success; 1 verify found problems; 2 bad command line; 3 refused (invalid request or ledger
state: nothing was written); 4 failed (Kafka or Postgres unreachable, the Spark job or the commit failed);
5 verify could not check the data (Kafka unreachable, a topic gone, the deadline passed): nothing concluded.
"""

from __future__ import annotations

import argparse
import getpass
import json
import logging
import os
import subprocess
import sys
import tempfile
from datetime import datetime
from typing import Any

import psycopg2

from kafka_ledger.batch import commit
from kafka_ledger.batch import plan as planner
from kafka_ledger.batch.columns import ColumnSourcesOf
from kafka_ledger.batch.commit import CommitError
from kafka_ledger.batch.requests import BatchRequest, RequestError, as_utc, parse_request
from kafka_ledger.config import settings
from kafka_ledger.config.pipeline import ConfigError, PipelineConfig, get_pipeline, read_pipelines
from kafka_ledger.config.services import Services, SettingsError
from kafka_ledger.formats import known, schema_registry
from kafka_ledger.kafka import offsets as kafka_offsets
from kafka_ledger.kafka.headroom import duration, headroom_text
from kafka_ledger.ledger import db as ledger
from kafka_ledger.model import ranges as planning
from kafka_ledger.ops import metrics, overview
from kafka_ledger.ops.resets import reset_positions
from kafka_ledger.ops.verify import DEADLINE_FLOOR_SECONDS, DEADLINE_OFFSETS_PER_SECOND, VerifyReport, verify_pipeline
from kafka_ledger.runtimes import runtime_for
from kafka_ledger.runtimes.connect.warm_up import (
    WARM_UP_PIPELINE_PARTITIONS,
    WARM_UP_PIPELINE_RECORDS,
    WARM_UP_RECORDS,
    warm_up,
)
from kafka_ledger.sinks import ArtifactSink, sink_for
from kafka_ledger.spark.connect import SparkServerError, without_secrets

EXIT_OK, EXIT_PROBLEMS, EXIT_USAGE, EXIT_REFUSED, EXIT_FAILED, EXIT_UNVERIFIED = 0, 1, 2, 3, 4, 5

log = logging.getLogger("kafka_ledger.ops.cli")


# The Kubernetes Secret `spark-secret` writes when neither --name nor the setting names one.
DEFAULT_DRIVER_SECRET = "kafka-ledger"


class Failed(RuntimeError):
    """An operation started and failed (as opposed to being refused before anything was written)."""


def _print(text: str) -> None:
    """Print, and when the reader went away (`kafka-ledger batches … | head`) carry on quietly as Unix tools do."""
    try:
        print(text, flush=True)
    except BrokenPipeError:
        # Python's own flush at exit would fail on the closed pipe again and print a traceback: point stdout
        # at /dev/null instead. What the command does (a replay running its batch) goes on regardless.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def _emit(args: argparse.Namespace, data: Any, text: str) -> None:
    _print(json.dumps(data, indent=2, default=str) if args.json else text)


def _table(headers: list[str], rows: list[list[Any]]) -> str:
    cells = [headers] + [["-" if v is None else str(v) for v in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    return "\n".join("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip() for row in cells)


def _services() -> Services:
    return settings.task_services()


def _pipelines(names: list[str]) -> list[PipelineConfig]:
    """The named pipelines, or every valid one (saying on stderr which entries are left out as invalid)."""
    if names:
        return [get_pipeline(n) for n in names]
    declarations = read_pipelines()
    for name in declarations.invalid:
        print(f"kafka-ledger: left out: {declarations.problem(name)}", file=sys.stderr)
    return list(declarations.valid.values())


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of at least 1")
    return value


def _range_arg(text: str) -> dict[str, Any]:
    try:
        topic, partition, lo, hi = text.rsplit(":", 3)
        return {"topic": topic, "partition": int(partition), "from": int(lo), "until": int(hi)}
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not TOPIC:PARTITION:FROM:UNTIL") from None


def _offset_arg(text: str) -> tuple[planning.TopicPartition, int]:
    try:
        where, offset = text.rsplit("=", 1)
        topic, partition = where.rsplit(":", 1)
        return planning.TopicPartition(topic, int(partition)), int(offset)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not TOPIC:PARTITION=OFFSET") from None


def _datetime_arg(text: str) -> datetime:
    """An ISO date-time; one without a zone is UTC, as everywhere in kafka-ledger (never the machine's zone)."""
    try:
        return as_utc(datetime.fromisoformat(text.replace("Z", "+00:00")))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an ISO date-time such as 2026-11-20T10:00:00Z") from None


def _request(args: argparse.Namespace, default_mode: str | None) -> BatchRequest:
    given = [name for name, value in (("--batch", args.batch), ("--range", args.range),
                                      ("--from/--to", args.window_from or args.window_to)) if value]
    if len(given) > 1:
        raise RequestError(f"choose one of --batch, --range or --from/--to (got {', '.join(given)})")
    if args.batch is not None:
        mode = "replay_batch"
    elif args.range:
        mode = "offset_ranges"
    elif args.window_from or args.window_to:
        mode = "time_window"
    elif default_mode:
        mode = default_mode
    else:
        raise RequestError("say what to replay: --batch ID, --range TOPIC:PARTITION:FROM:UNTIL or --from/--to")
    return parse_request({"mode": mode, "batch_id": args.batch, "ranges": args.range or [],
                          "window_from": args.window_from, "window_to": args.window_to,
                          "reason": getattr(args, "reason", "") or "", "reader_schema": args.reader_schema})


def _ranges_text(ranges: list[dict[str, Any]]) -> str:
    if not ranges:
        return "  (none)"
    return "\n".join(
        f"  {r['topic']}-{r['partition']} [{r['from']}, {r['until']})  {r['until'] - r['from']} offsets"
        + (f", skipping [{r['skipped_from']}, {r['from']})" if r.get("skipped_from") is not None else "")
        for r in ranges
    )


# --- commands ----------------------------------------------------------------------------------------------


def cmd_status(args: argparse.Namespace) -> int:
    pipelines = _pipelines(args.pipelines)
    services = _services()
    report, lines = [], []
    for pipeline, status in zip(pipelines, overview.pipelines_status(services, pipelines), strict=True):
        try:
            entry = overview.partition_page(status, args.page, None if args.all else args.page_size)
        except overview.PageError as exc:
            print(f"kafka-ledger: {exc}", file=sys.stderr)
            return EXIT_USAGE
        report.append(entry)
        holds = sink_for(pipeline).describe()
        lines.append(f"pipeline {pipeline.name} ({pipeline.delivery_mode}{', ' + holds if holds else ''}, "
                     f"{pipeline.subscription}): "
                     f"total lag {entry['lag']}, {duration(entry['lag_seconds'])} behind")
        lines.append(_table(
            ["TOPIC", "PARTITION", "POSITION", "LOG-START", "END-OFFSET", "LAG", "LAG-TIME", "NEWEST PUBLISHED",
             "AGE", "SKIPPED", "RETENTION HEADROOM", "NOTE"],
            [[p["topic"], p["partition"], p["position"], p["log_start"], p["end_offset"], p["lag"],
              duration(p["lag_seconds"]), overview.instant(p["newest_published_at"]), duration(p["age_seconds"]),
              p["skipped_offsets"], headroom_text(p["headroom"]), p["note"]] for p in entry["partitions"]],
        ))
        if entry["pages"] > 1:
            behind = ", ".join(f"{p['topic']}-{p['partition']} ({p['lag']}, {duration(p['lag_seconds'])})"
                               for p in entry["most_behind"])
            lines.append(f"page {entry['page']} of {entry['pages']} ({entry['partitions_total']} partitions, "
                         f"{entry['partitions_lagging']} lagging{': most behind ' + behind if behind else ''}); "
                         "--page N for another, --all for every partition")
        for message in (entry["retention_warning"], entry["headroom_error"], entry["freshness_error"]):
            if message:
                lines.append(message)
        for b in entry["unfinished_batches"]:
            lines.append(f"unfinished batch {b['batch_id']} ({b['kind']}, {b['status']}, {b['attempts']} attempt(s))"
                         + (f": {b['last_error']}" if b["last_error"] else ""))
        lines.append("")
    _emit(args, report if len(report) != 1 else report[0], "\n".join(lines).rstrip())
    return EXIT_OK


def cmd_batches(args: argparse.Namespace) -> int:
    pipeline = get_pipeline(args.pipeline)
    with ledger.transaction(settings.ledger_database()) as cur:
        if args.batch_id is not None:
            found = [ledger.pipeline_batch(cur, pipeline.name, args.batch_id)]
        else:
            found = ledger.list_batches(cur, pipeline.name, args.limit, args.status)
    data = [overview.batch_summary(b) for b in found]
    if args.batch_id is not None:
        d = data[0]
        text = "\n".join(
            [f"batch {d['batch_id']} of {d['pipeline']}: {d['kind']}, {d['status']}, {d['attempts']} attempt(s)"]
            + [f"  {key}: {d[key]}" for key in ("replay_of", "requested_by", "reason", "window_start", "window_end",
                                                "dag_id", "run_id", "planned_at", "written_at", "committed_at",
                                                "records_read", "records_written", "records_dead_lettered",
                                                "read_seconds", "commit_seconds", "snapshot_id", "last_error")
                                     if d[key] is not None]
            + ["  ranges:", _ranges_text(d["ranges"])]
        )
        _emit(args, d, text)
    else:
        sink = sink_for(pipeline)
        artifact = sink.artifact_noun.upper() if isinstance(sink, ArtifactSink) else None  # what batches record
        _emit(args, data, _table(
            ["BATCH", "KIND", "STATUS", "ATTEMPTS", "OFFSETS", "READ", "WRITTEN", "DEAD", "PLANNED", "REWRITES",
             "RUN / REQUESTED BY", *([artifact] if artifact else [])],
            [[d["batch_id"], d["kind"], d["status"], d["attempts"], d["offsets"], d["records_read"],
              d["records_written"], d["records_dead_lettered"], f"{d['planned_at']:%Y-%m-%d %H:%M:%S}",
              d["rewrites"], d["run_id"] or d["requested_by"], *([d["snapshot_id"]] if artifact else [])]
             for d in data],
        ))
    return EXIT_OK


def _plan_text(planned: dict[str, Any], pipeline: str) -> str:
    if planned["batch_id"] is None and not planned["ranges"]:
        head = f"nothing to read for {pipeline} ({planned['kind']})"
    elif planned["dry_run"] and not planned["resumed"]:
        head = f"dry run: a {planned['kind']} batch of {pipeline} would read {planned['offsets']} offsets"
    else:
        verb = "resumes" if planned["resumed"] else "reads"
        head = f"batch {planned['batch_id']} ({planned['kind']}) of {pipeline} {verb} {planned['offsets']} offsets"
    lines = [head, _ranges_text(planned["ranges"])]
    if planned["pending"]:
        lines += ["not ingested yet (the catch-up runs read these):", _ranges_text(planned["pending"])]
    if planned["backlog_after"]:
        lines.append(f"{planned['backlog_after']} offsets remain for later batches (per-partition cap)")
    return "\n".join(lines)


def cmd_plan(args: argparse.Namespace) -> int:
    pipeline = get_pipeline(args.pipeline)
    # Always a dry run: batches are recorded by the DAG's plan task (or `replay`).
    planned = planner.plan_batch(_services(), pipeline, _request(args, "catch_up"), requested_by=getpass.getuser(),
                                 dry_run=True)
    _emit(args, planned.as_dict(), _plan_text(planned.as_dict(), pipeline.name))
    return EXIT_OK


def cmd_replay(args: argparse.Namespace) -> int:
    pipeline = get_pipeline(args.pipeline)
    request = _request(args, None)  # refused before anything is looked up
    services = _services()
    planned = planner.plan_batch(services, pipeline, request, requested_by=getpass.getuser(),
                                 dry_run=args.dry_run)
    out: dict[str, Any] = {"plan": planned.as_dict()}
    if args.dry_run or planned.batch_id is None:
        _emit(args, out, _plan_text(planned.as_dict(), pipeline.name))
        return EXIT_OK
    if not args.json:
        _print(_plan_text(planned.as_dict(), pipeline.name))
    # Airflow's logging (imported by the Spark hooks) writes to stdout: keep stdout for our own output.
    stdout, sys.stdout = sys.stdout, sys.stderr
    try:
        result = runtime_for(pipeline).run_batch(pipeline, planned.batch_id, services)
    except Exception as exc:
        commit.fail_batch(services, pipeline.name, planned.batch_id,
                          f"reading or committing failed (kafka-ledger replay): {exc}")
        raise Failed(f"batch {planned.batch_id} failed: {exc}. Nothing was published; resume it "
                     f"with `kafka-ledger replay {pipeline.name} --batch {planned.batch_id}`") from exc
    finally:
        sys.stdout = stdout
    out["commit"] = commit.after_commit(services, pipeline, result)
    _emit(args, out, f"committed batch {result.batch_id}: {result.records_written} rows, "
                     f"{result.records_dead_lettered} dead letters")
    return EXIT_OK


def cmd_reset(args: argparse.Namespace) -> int:
    targets = [t for t in (args.to_earliest and "earliest", args.to_latest and "latest", args.to_datetime,
                           args.to_offset) if t]
    if len(targets) != 1:
        raise RequestError("choose exactly one of --to-earliest, --to-latest, --to-datetime or --to-offset")
    target = dict(args.to_offset) if args.to_offset else targets[0]
    pipeline = get_pipeline(args.pipeline)
    result = reset_positions(_services(), pipeline, target, requested_by=args.requested_by or getpass.getuser(),
                             reason=args.reason or "", dry_run=not args.execute,
                             abandon_open_batches=args.abandon_open_batches)
    data = result.as_dict()
    head = (f"DRY RUN (add --execute to apply): reset of {pipeline.name} to {result.target}" if result.dry_run
            else f"reset {result.reset_id} of {pipeline.name} to {result.target} applied")
    lines = [head, _table(
        ["TOPIC", "PARTITION", "BEFORE", "AFTER", "SKIPPED (never read)", "READ AGAIN (rows replaced)"],
        [[p["topic"], p["partition"], p["before"], p["after"],
          f"[{p['skipped'][0]}, {p['skipped'][1]})" if p["skipped"] else "",
          f"[{p['reread'][0]}, {p['reread'][1]})" if p["reread"] else ""] for p in data["partitions"]],
    ), f"{result.skipped_offsets} offsets skipped, {result.reread_offsets} offsets to read again"]
    if result.blocking_batches and result.dry_run:
        lines.append(f"unfinished batch(es) {result.blocking_batches} block this reset: they must finish, or be "
                     "abandoned with --abandon-open-batches")
    if result.abandoned_batches:
        lines.append(f"abandoned batch(es): {result.abandoned_batches}")
    for topic, (before, after) in sorted(result.reanchored.items()):
        lines.append(f"topic {topic} {'is re-anchored' if result.dry_run else 're-anchored'} from topic id {before} "
                     f"(recreated, or another cluster's) to {after}")
    if result.kept_from_earlier_topic:
        lines.append(
            f"{sum(r.span for r in result.kept_from_earlier_topic)} offsets read from the earlier topic stay in the "
            "output under offsets that name other records now (verify reports them until they are read again: "
            "reset --to-earliest, or replay them): " + ", ".join(r.describe() for r in result.kept_from_earlier_topic)
        )
    _emit(args, data, "\n".join(lines))
    return EXIT_OK


def _verify_text(r: VerifyReport) -> list[str]:
    """Lines of one pipeline's verify report."""
    head = "OK  " if r.ok else ("FAIL" if r.problems else "UNVERIFIED")
    if r.mode == "full":
        scope = "full"
    else:
        scope = (f"incremental: {r.checked_batches} batch(es) committed after batch {r.checked_after_batch}, "
                 f"{len(r.checked_ranges)} range(s)")
    point = r.verified_point
    lines = [
        f"{head} {r.pipeline} ({scope}): {r.partitions} partition(s), {r.committed_offsets} committed offsets, "
        f"{r.kafka_records} records in Kafka = {r.output_rows} rows + {r.dead_letters} dead letters; "
        f"missing {r.missing}, duplicates {r.duplicates}, unexpected {r.unexpected}; {r.seconds:.1f} s; "
        + (f"verified point now batch {point['after']}" if point.get("advanced") else
           f"verified point unchanged ({point.get('after')})")
    ]
    if r.unverified:
        lines.append(f"  could not verify: {r.unverified}")
    return lines + [f"  problem: {p}" for p in r.problems] + [f"  note: {w}" for w in r.warnings]


def cmd_verify(args: argparse.Namespace) -> int:
    if args.full or args.verbose:
        # Per partition: records compared and the rate, on stderr (a full check of a big topic takes minutes).
        logging.getLogger("kafka_ledger.ops.verify").setLevel(logging.INFO)
    services = _services()
    reports = [verify_pipeline(services, p, full=args.full, timeout=args.timeout)
               for p in _pipelines(args.pipelines)]
    lines = [line for r in reports for line in _verify_text(r)]
    ok = all(r.ok for r in reports)
    data = {"ok": ok, "mode": "full" if args.full else "incremental", "pipelines": [r.as_dict() for r in reports]}
    _emit(args, data, "\n".join(lines))
    if any(r.problems for r in reports):
        return EXIT_PROBLEMS
    return EXIT_OK if ok else EXIT_UNVERIFIED


def cmd_maintain(args: argparse.Namespace) -> int:
    pipeline = get_pipeline(args.pipeline)
    sink = sink_for(pipeline)
    if sink.maintenance() is None:
        raise RequestError(f"pipeline {pipeline.name!r} publishes into {pipeline.sink.type}, not Iceberg: it has "
                           "no lake table to maintain")
    result = sink.maintain(settings.ledger_database(), runtime_for(pipeline).spark_sessions())
    unfinished = ", ".join(map(str, result["kept_for_batches"]))
    kept = f"; kept every snapshot since that of unfinished batch(es) {unfinished}" if unfinished else ""
    _emit(args, result,
          f"maintained {result['table']} in {result['seconds']:.1f} s: {result['data_files_before']} -> "
          f"{result['data_files_after']} data files, {result['snapshots_before']} -> {result['snapshots_after']} "
          f"snapshots (expired those before {result['expired_before']}{kept})")
    return EXIT_OK


# Kafka's own command-line tools (kafka-tools jar): the class, and the option that takes a client properties file.
KAFKA_TOOLS: dict[str, tuple[str, str]] = {
    "consumer-groups": ("org.apache.kafka.tools.consumer.group.ConsumerGroupCommand", "--command-config"),
    "console-consumer": ("org.apache.kafka.tools.consumer.ConsoleConsumer", "--consumer.config"),
    "console-producer": ("org.apache.kafka.tools.ConsoleProducer", "--producer.config"),
    "topics": ("org.apache.kafka.tools.TopicCommand", "--command-config"),
    "get-offsets": ("org.apache.kafka.tools.GetOffsetShell", "--command-config"),
    "consumer-perf-test": ("org.apache.kafka.tools.ConsumerPerformance", "--consumer.config"),
}


def cmd_kafka(args: argparse.Namespace) -> int:
    libs = settings.deployment_settings().kafka_tools_dir
    variable = settings.env_name("kafka_tools_dir")
    if libs is None:
        raise Failed(f"Kafka's tools need Kafka's jars: set {variable} to their folder (scripts/env.sh sets it "
                     "for the local stack, and `scripts/stack.sh install` puts them in .stack/cache/kafka-libs)")
    if not libs.is_dir() or not any(libs.glob("kafka-tools-*.jar")):
        raise Failed(f"Kafka's tools need Kafka's jars: {variable}={str(libs)!r} holds no kafka-tools jar "
                     "(`scripts/stack.sh install` puts them in .stack/cache/kafka-libs)")
    tool_class, config_option = KAFKA_TOOLS[args.tool]
    # The deployment's security settings reach the tool in a file only this user can read, never in argv.
    with tempfile.NamedTemporaryFile("w", prefix="kafka-ledger-", suffix=".properties") as properties:
        kafka = settings.kafka_client()
        properties.write(kafka.java_properties())
        properties.flush()
        command = ["java", "-cp", f"{libs}/*", tool_class, "--bootstrap-server", kafka.servers,
                   config_option, properties.name, *args.args]
        return subprocess.run(command, check=False).returncode


def cmd_columns(args: argparse.Namespace) -> int:
    if (args.subject is None) == (args.topic is None):
        raise Failed("name a subject of the schema registry, or a topic (--topic) of change events written with the "
                     "JsonConverter's schemas")
    sources = ColumnSourcesOf(settings.schema_registry, settings.kafka_client)
    if args.topic is not None:
        # The JsonConverter's schema of the topic's newest change event.
        fmt, subject, envelope = known.format_named("json"), args.topic, "debezium"
    else:
        _, _, schema = schema_registry.newest_schema(sources.registry().client(), args.subject)
        try:
            fmt = known.for_schema_type(schema.schema_type)
        except ValueError as exc:
            raise schema_registry.SchemaRefused(f"subject {args.subject}: {exc}") from None
        subject, envelope = args.subject, args.envelope
    derived = fmt.derived_columns(sources, subject, envelope)
    schema_id, version, columns = derived.schema_id, derived.version, derived.columns
    fields = "every field of the row image (after)" if envelope == "debezium" else "every top-level field"
    lines = [f"# {fields} of {fmt.columns_origin(subject, schema_id, version)}",
             "columns:", *("  - {" + ", ".join(f"{k}: {json.dumps(v) if k == 'type' else v}" for k, v in c.items())
                           + "}" for c in columns)]
    _emit(args, {"subject" if args.topic is None else "topic": subject, "version": version, "schema_id": schema_id,
                 "columns": columns},
          "\n".join(lines))
    return 0


def cmd_warm_up(args: argparse.Namespace) -> int:
    # PySpark loads only for this command, not for every use of the CLI.
    from pyspark.errors import PySparkException

    url = without_secrets(settings.spark_connect_url())
    pipelines = [] if args.no_pipelines else _pipelines(args.pipelines)
    try:
        done = warm_up(args.records, pipelines, _services() if pipelines else None)
    except (PySparkException, SparkServerError) as exc:
        raise Failed(f"could not warm up the Spark Connect server at {url} ({str(exc).splitlines()[0]}): is it "
                     "running (`scripts/stack.sh status` for the local stack)?") from exc
    read_lines = [f"  {name}: read and decoded its newest {n:,} records" for name, n in done.pipeline_records.items()]
    skipped_lines = [f"  {name}: not read ({reason})" for name, reason in done.skipped.items()]
    _emit(args, {"spark_connect": url, "records": done.made_up_records, "pipelines": done.pipeline_records,
                 "skipped": done.skipped, "seconds": round(done.seconds, 3)},
          "\n".join([f"warmed up the Spark Connect server at {url} in {done.seconds:.1f} s: a made-up batch of "
                     f"{done.made_up_records:,} records decoded and received", *read_lines, *skipped_lines]))
    return 0


def cmd_spark_secret(args: argparse.Namespace) -> int:
    from kafka_ledger.runtimes.submit.spark_submit import driver_secret

    name = args.name or settings.deployment_settings().spark_driver_secret or DEFAULT_DRIVER_SECRET
    manifest = driver_secret(_services(), _pipelines(args.pipelines), name, args.namespace)
    try:
        # Created for its owner alone, never over an existing file: it holds the deployment's secrets.
        descriptor = os.open(args.output, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as exc:
        raise Failed(f"cannot write {args.output}: {exc.strerror} (it must not exist yet)") from exc
    with os.fdopen(descriptor, "w") as out:
        json.dump(manifest, out, indent=2)
        out.write("\n")
    keys = list(manifest["stringData"])  # type: ignore[call-overload]
    _emit(args, {"secret": name, "namespace": args.namespace, "keys": keys, "file": args.output},
          f"wrote the Kubernetes Secret {name!r} ({len(keys)} keys: {', '.join(keys)}; no value shown) to "
          f"{args.output}: `kubectl apply -f {args.output}` in the drivers' namespace, then delete the file; set "
          f"{settings.env_name('spark_driver_secret')}={name} where the DAGs run")
    return 0


def _metrics_collector(args: argparse.Namespace) -> metrics.LedgerCollector:
    return metrics.LedgerCollector(_services(), lambda: read_pipelines().valid.values(),
                                   kafka_ttl_seconds=args.kafka_cache_seconds)


def cmd_metrics(args: argparse.Namespace) -> int:
    collector = _metrics_collector(args)
    if args.action == "show":
        _print(metrics.exposition(collector).rstrip("\n"))
        return 0
    deployment = settings.deployment_settings()
    credentials = metrics.Credentials(deployment.metrics_token, deployment.metrics_basic_auth)
    try:
        server = metrics.make_server(args.listen, collector, credentials, allow_unauthenticated=args.no_auth)
    except (ValueError, OSError) as exc:
        raise Failed(f"cannot serve metrics on {args.listen}: {exc}") from exc
    asked = " and ".join(what for what, given in (("a bearer token", credentials.token),
                                                   ("basic auth", credentials.basic)) if given) or "nothing"
    print(f"kafka-ledger: serving metrics on http://{args.listen}/metrics (asking {asked} of a scrape)",
          file=sys.stderr, flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


# --- parser ------------------------------------------------------------------------------------------------


def _add_request_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("what to read (one of)")
    group.add_argument("--batch", type=int, metavar="ID", help="a recorded batch: re-read exactly its ranges")
    group.add_argument("--range", type=_range_arg, action="append", metavar="TOPIC:PARTITION:FROM:UNTIL",
                       help="explicit offsets, until exclusive (repeat for more partitions)")
    group.add_argument("--from", dest="window_from", type=_datetime_arg, metavar="DATETIME",
                       help="time window start (Kafka record timestamps, UTC unless a zone is given)")
    group.add_argument("--to", dest="window_to", type=_datetime_arg, metavar="DATETIME", help="time window end")
    parser.add_argument("--reader-schema", choices=["batch", "newest"], default="batch",
                        help="Avro values, with --batch: decode with the batch's reader schema (default) or the "
                             "subject's newest version")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kafka-ledger",
        description="Inspect and operate kafka-ledger pipelines (ledger in Postgres, data in Kafka).",
        epilog="Exit codes: 0 ok, 1 verify found problems, 2 bad command line, 3 refused (nothing written), "
               "4 failed, 5 verify could not check (Kafka unreachable, a topic gone, deadline passed; nothing "
               "concluded, the verified point not advanced). Services: KAFKA_LEDGER_DB_URL and "
               "KAFKA_LEDGER_BOOTSTRAP_SERVERS (or Airflow "
               "connections); pipelines: KAFKA_LEDGER_PIPELINES or --config.",
    )
    parser.add_argument("--config", metavar="FILE", help="pipelines file (default: $KAFKA_LEDGER_PIPELINES)")
    parser.add_argument("-v", "--verbose", action="store_true", help="log what is done")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, help_text: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.add_argument("--json", action="store_true", help="machine-readable output")
        return p

    p = command("status", "per partition: committed position, log start, end offset, lag, skipped offsets")
    p.add_argument("pipelines", nargs="*", metavar="PIPELINE", help="default: every declared pipeline")
    p.add_argument("--page", type=_positive, default=1, help="which page of partitions (topic and partition order)")
    p.add_argument("--page-size", type=_positive, default=overview.PARTITIONS_PER_PAGE,
                   help=f"partitions a page (default {overview.PARTITIONS_PER_PAGE})")
    p.add_argument("--all", action="store_true", help="every partition, on one page")
    p.set_defaults(run=cmd_status)

    p = command("batches", "list a pipeline's batches, or show one with its ranges, counts, timings and run")
    p.add_argument("pipeline")
    p.add_argument("batch_id", nargs="?", type=int, help="show this batch")
    p.add_argument("--status", choices=["planned", "written", "committed", "failed", "abandoned"])
    p.add_argument("--limit", type=int, default=20)
    p.set_defaults(run=cmd_batches)

    p = command("plan", "show what the next batch (or a replay) would read, without recording anything")
    p.add_argument("pipeline")
    p.add_argument("--dry-run", action="store_true", help="the default and only behaviour: nothing is recorded")
    _add_request_args(p)
    p.set_defaults(run=cmd_plan)

    p = command("replay", "re-read offsets and REPLACE their rows and dead letters in one transaction")
    p.add_argument("pipeline")
    _add_request_args(p)
    p.add_argument("--reason", default="", help="recorded in the ledger with the batch")
    p.add_argument("--dry-run", action="store_true", help="show the ranges, record and run nothing")
    p.set_defaults(run=cmd_replay)

    p = command("reset", "move committed positions (a dry run unless --execute), recorded in an audit table")
    p.add_argument("pipeline")
    target = p.add_argument_group("target (one of)")
    target.add_argument("--to-earliest", action="store_true", help="the log start of each partition")
    target.add_argument("--to-latest", action="store_true", help="the end offset of each partition")
    target.add_argument("--to-datetime", type=_datetime_arg, metavar="DATETIME",
                        help="the first offset at or after this Kafka timestamp")
    target.add_argument("--to-offset", type=_offset_arg, action="append", metavar="TOPIC:PARTITION=OFFSET",
                        help="explicit offsets (repeat per partition; other partitions keep their position)")
    p.add_argument("--reason", help="why (required with --execute; recorded)")
    p.add_argument("--requested-by", help="who (default: the current user)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--dry-run", action="store_true", help="show per partition what would be skipped or re-read")
    mode.add_argument("--execute", action="store_true", help="apply the reset")
    p.add_argument("--abandon-open-batches", action="store_true",
                   help="abandon unfinished batches that would otherwise block the reset")
    p.set_defaults(run=cmd_reset)

    p = command("verify", "check ledger invariants and that every committed record is published exactly once")
    p.epilog = ("Incremental by default: the ranges of every batch committed since the last verify that found no "
                "problem (replays included), and every row outside the committed read ranges; --full compares "
                "everything. Exit 0 ok, 1 a problem found, 5 could not check (Kafka unreachable, a topic gone, "
                "deadline passed). Only exit 0 advances the verified point.")
    p.add_argument("pipelines", nargs="*", metavar="PIPELINE", help="default: every declared pipeline")
    p.add_argument("--full", action="store_true",
                   help="compare every committed range and every row, not only what changed since the last verify")
    p.add_argument("--timeout", type=float, metavar="SECONDS",
                   help=f"deadline for reading Kafka back (default: {DEADLINE_FLOOR_SECONDS:.0f} s plus 1 s per "
                        f"{DEADLINE_OFFSETS_PER_SECOND:,} offsets to read)")
    p.set_defaults(run=cmd_verify)

    p = command("maintain", "compact an Iceberg sink's table and expire its old snapshots, as its maintenance DAG "
                            "does (never a snapshot a batch the ledger has not finished may still adopt)")
    p.add_argument("pipeline")
    p.set_defaults(run=cmd_maintain)

    p = command("columns", "print a `columns:` declaration of every top-level field of a subject's newest version in "
                           "the schema registry (Avro, Protobuf), or of the row image of a topic's newest change event "
                           "(--topic: Debezium's, with the JsonConverter's schemas), each of the column type that "
                           "holds it")
    p.epilog = ("Paste it into a pipeline of the subject's format (`value: {format: avro}`) and edit it: drop the "
                "fields you do not want, read nested ones by `path`, add `required`. A field no column type holds (a "
                "union of several types, a local timestamp; a numeric without a declared scale) is refused by name.")
    p.add_argument("subject", nargs="?", help="e.g. orders-value")
    p.add_argument("--topic", help="instead of a subject: a topic of Debezium's change events written with the "
                                   "JsonConverter's schemas, e.g. shop.public.customers")
    p.add_argument("--envelope", choices=["none", "debezium"], default="none",
                   help="debezium: the subject holds change events; declare the fields of their row image (after)")
    p.set_defaults(run=cmd_columns)

    p = command("warm-up", "warm a freshly started Spark Connect server up: run a made-up batch's decode and transfer "
                           "on it once, then read each pipeline's newest records as its batches do, so that the "
                           "first real batch finds its code compiled and its Kafka consumers made")
    p.epilog = (f"Writes nothing: of each pipeline of the connect runtime (or those named) it reads about "
                f"{WARM_UP_PIPELINE_RECORDS:,} of the newest records (at most its max_records_per_partition) of up "
                f"to {WARM_UP_PIPELINE_PARTITIONS} partitions (assigned, read_committed, no offsets committed to "
                "Kafka). The local stack runs it after "
                "starting the server (KL_SPARK_CONNECT_WARM_UP=0 skips it); run it after starting your own server.")
    p.add_argument("pipelines", nargs="*", help="pipelines whose newest records to read (default: every pipeline "
                                                 "of the connect runtime)")
    p.add_argument("--no-pipelines", action="store_true", help="only the made-up batch: read no topic")
    p.add_argument("--records", type=int, default=WARM_UP_RECORDS, help="size of the made-up batch")
    p.set_defaults(run=cmd_warm_up)

    p = sub.add_parser(
        "metrics", help="Prometheus metrics of the declared pipelines, from the ledger and Kafka at scrape time",
        description="`serve` runs the Prometheus endpoint (it asks every scrape for KAFKA_LEDGER_METRICS_TOKEN as a "
                    "bearer token, or KAFKA_LEDGER_METRICS_BASIC_AUTH); `show` prints one scrape. "
                    "docs/monitoring.md says what each series means.")
    p.add_argument("action", choices=["serve", "show"])
    p.add_argument("--listen", default=metrics.DEFAULT_LISTEN, metavar="HOST:PORT",
                   help=f"where `serve` listens (default {metrics.DEFAULT_LISTEN}: this machine only)")
    p.add_argument("--no-auth", action="store_true",
                   help="serve without authentication (only on a loopback address)")
    p.add_argument("--kafka-cache-seconds", type=float, default=metrics.KAFKA_CACHE_SECONDS, metavar="SECONDS",
                   help=f"how long Kafka's offsets are reused between scrapes (default {metrics.KAFKA_CACHE_SECONDS})")
    p.set_defaults(run=cmd_metrics)

    p = command("spark-secret", "write the Kubernetes Secret a batch's driver in cluster deploy mode reads the "
                                "ledger's, Kafka's and the registry's secrets from, as a manifest file for kubectl")
    p.epilog = ("The file is made readable by you alone and never overwritten; the command prints the keys, never a "
                "value. docs/deployment.md#spark-on-kubernetes.")
    p.add_argument("pipelines", nargs="*", metavar="PIPELINE",
                   help="the pipelines whose jobs read it (default: every declared pipeline)")
    p.add_argument("--output", required=True, metavar="FILE", help="where to write the manifest (must not exist)")
    p.add_argument("--name", help=f"the Secret's name (default: ${settings.env_name('spark_driver_secret')}, else "
                                  f"{DEFAULT_DRIVER_SECRET})")
    p.add_argument("--namespace", help="the drivers' namespace (default: kubectl's)")
    p.set_defaults(run=cmd_spark_secret)

    p = sub.add_parser(
        "kafka", help="run one of Kafka's own tools against the deployment's Kafka (servers and security settings)",
        description="Kafka's own command-line tools, with --bootstrap-server and the deployment's client "
                    "settings (SASL, TLS) given for you: e.g. `kafka-ledger kafka consumer-groups --describe "
                    "--group kafka-ledger.impressions`. Arguments after the tool go to it unchanged.")
    p.add_argument("tool", choices=list(KAFKA_TOOLS))
    p.add_argument("args", nargs=argparse.REMAINDER, help="the tool's own arguments")
    p.set_defaults(run=cmd_kafka)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.config:
        os.environ[settings.env_name("pipelines")] = args.config
    try:
        return args.run(args)
    except CommitError as exc:
        print(f"kafka-ledger: failed: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except (RequestError, ConfigError, ledger.LedgerError, planning.PlanError) as exc:
        if isinstance(exc, kafka_offsets.KafkaUnavailable):
            print(f"kafka-ledger: failed: {exc}", file=sys.stderr)
            return EXIT_FAILED
        print(f"kafka-ledger: refused, nothing was written: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    except schema_registry.SchemaRefused as exc:
        print(f"kafka-ledger: refused, nothing was written: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    except (Failed, psycopg2.OperationalError, SettingsError, schema_registry.SchemaRegistryError) as exc:
        print(f"kafka-ledger: failed: {exc}", file=sys.stderr)
        return EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
