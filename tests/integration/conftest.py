"""Fixtures for integration tests: the real local stack, and per-test pipelines with their own topics.

The pipeline DAGs are generated from the pipelines file, so the session writes one test pipelines file
(a pipeline and a fresh topic per test) and points KAFKA_LEDGER_PIPELINES at it before Airflow parses
anything. Run `scripts/stack.sh up` first (scripts/test.sh does).
"""

from __future__ import annotations

import os
from pathlib import Path

import psycopg2
import pytest
import yaml
from confluent_kafka.admin import AdminClient

# The shared helpers assert too: pytest rewrites their asserts as it does the tests' (told before the import).
pytest.register_assert_rewrite("integration_support")

from integration_support import (  # noqa: E402
    AVRO_COLUMNS,
    CDC_COLUMNS,
    COLUMNS,
    LAKE_NAMESPACE,
    PROTOBUF_COLUMNS,
    PROTOBUF_KEYED_COLUMNS,
    RICH_COLUMNS,
    RUN,
    RecordedProducer,
    pipeline_name,
    topic_name,
)

from tools import cdc  # noqa: E402
from tools.kafka_topics import create_topic  # noqa: E402

HERE = Path(__file__).resolve().parent

# spark-submit's driver is a JVM started for each batch, seconds of work: compiled by C1 alone and with the serial
# collector, a small batch costs half the CPU (25 s down to 13 s on the 2-core machine), and nothing tested depends
# on the JIT. A SPARK_SUBMIT_OPTS of the caller's wins.
os.environ.setdefault("SPARK_SUBMIT_OPTS", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")
# The Spark Connect servers that tests restart (the campaigns, the server kills) start without the warm-up batch,
# 20 s of CPU each; test_connect_runtime.py's warm-up test runs it itself.
os.environ["KL_SPARK_CONNECT_WARM_UP"] = "0"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test here needs the real stack: marked `integration`, the lane scripts/test.sh runs second."""
    for item in items:
        if item.path.is_relative_to(HERE):
            item.add_marker(pytest.mark.integration)


# The carrier of the test session's carried_f and carried_g (test_airflow_rest.py).
CARRIER = f"it_{RUN}_carrier"
CARRIED_TRIGGER = {"type": "doorbell", "carrier": CARRIER, "poll_seconds": 1, "carry_seconds": 3,
                   "ring_again_seconds": 60}

# Every test that runs a DAG gets its own pipeline (and topic); overrides tune caps and retries.
# The connector's common alternatives to its defaults that keep every value exact (the type matrix's `alternatives`).
TYPED_ALTERNATIVES = {"decimal.handling.mode": "string", "time.precision.mode": "adaptive_time_microseconds",
                      "binary.handling.mode": "hex", "interval.handling.mode": "string"}

PIPELINES = {
    "exact": {},
    "drain": {"max_records_per_partition": 50},
    # SIGKILLs the spark-submit driver (test_pipeline_dag.py); the connect runtime's own kill tests run the
    # task in a process of its own (test_connect_runtime.py).
    "kill": {"retries": 1, "spark_runtime": "submit"},
    "resume": {"retries": 0},
    "lost": {},
    "grow": {},
    "noop": {},
    "hand_made_table": {},
    # A declaration that gains, widens and loses columns while the pipeline runs (test_output_evolution.py).
    "schema_change": {"spark_runtime": "connect", "retries": 0},
    "latest": {"start_position": "latest"},
    "partitions": {},
    "cas": {},
    "locked": {},
    "unwritten": {},
    # Operator controls (test_operator_controls.py).
    "replay": {},
    "ranges": {},
    "window": {},
    "reset": {},
    # The direct append of at_least_once exists in the submit runtime only (connect publishes in one transaction).
    "alo": {"delivery_mode": "at_least_once", "retries": 1, "spark_runtime": "submit"},
    # Its driver deployed to a (mock) Kubernetes API server in cluster deploy mode (test_spark_on_kubernetes.py): the
    # image a driver pod runs, and where spark-submit uploads what the job ships (the package, the pipelines file).
    "on_kubernetes": {"spark_runtime": "submit", "spark_conf": {
        "spark.kubernetes.container.image": "registry.example/kafka-ledger:1.0",
        "spark.kubernetes.file.upload.path": f"file://{os.environ.get('KL_STATE', '/tmp')}/kubernetes-uploads"}},
    "latest_only": {"delivery_mode": "latest_only", "max_records_per_partition": 50},
    "pattern": {"topics": [], "topic_pattern": f"it-{RUN}-pattern-[a-z]+"},
    "assign": {"topics": [], "assignment": [{"topic": f"it-{RUN}-assign", "partition": 1, "start_offset": 5},
                                            {"topic": f"it-{RUN}-assign", "partition": 2}]},
    # Hostile topics (test_hostile_topics.py).
    "txn": {"max_records_per_partition": 4},
    "empty": {},
    "skip_lost": {"on_data_loss": "skip"},
    "bad_records": {"extra_fields": "dead_letter"},
    # The Prometheus endpoint (test_prometheus_endpoint.py).
    "metrics": {"spark_runtime": "connect", "retries": 0},
    "metrics_secrets": {},
    "metrics_faults": {"spark_runtime": "connect", "retries": 0},
    "traces": {"spark_runtime": "connect", "retries": 0},
    "upgrade": {"retries": 0},
    "deleted": {},
    "recreated": {},
    "recreated_mid_batch": {},
    "short_retention": {},
    "compacted": {"max_records_per_partition": 5},
    # The Spark Connect runtime under faults (test_connect_runtime.py), whatever the deployment's default.
    **{key: {"spark_runtime": "connect", "retries": 0, "max_records_per_partition": 100_000} for key in (
        "connect_kill", "connect_interrupt", "connect_server_connecting", "connect_server_streaming",
        "connect_race", "connect_unreachable", "connect_stages", "connect_warm_up", "connect_warm_up_no_topic",
        "connect_session", "connect_leftovers",
        "blackholed_spark_connect", "blackholed_postgres", "blackholed_kafka", "blackholed_plan_kafka",
        "blackholed_plan_postgres",
        "connect_tx_after_staging", "connect_tx_commit_after_publish", "connect_tx_commit_before_end")},
    # The Iceberg sink (test_iceberg_sink.py): a table of the lake each.
    **{key: {"spark_runtime": "connect", "retries": 0, "output_table": None,
             "sink": {"type": "iceberg", "namespace": LAKE_NAMESPACE, "table": pipeline_name(key)}}
       for key in ("iceberg", "iceberg_adopt", "iceberg_race", "iceberg_conflict", "iceberg_replay",
                   "iceberg_verify", "iceberg_rewrite_waits", "iceberg_unwritable",
                   "iceberg_page", "iceberg_evolve")},
    "iceberg_upkeep": {"spark_runtime": "connect", "retries": 0, "output_table": None, "sink": {
        "type": "iceberg", "namespace": LAKE_NAMESPACE, "table": pipeline_name("iceberg_upkeep"),
        "maintenance": {"schedule": None, "min_input_files": 2, "expire_after_hours": 0, "retain_last": 1}}},
    "iceberg_days": {"spark_runtime": "connect", "output_table": None, "sink": {
        "type": "iceberg", "namespace": LAKE_NAMESPACE, "table": pipeline_name("iceberg_days"),
        "partition_by": ["days(kafka_timestamp)", "kafka_partition"], "target_file_size_mb": 8}},
    "iceberg_submit": {"spark_runtime": "submit", "output_table": None, "sink": {
        "type": "iceberg", "namespace": LAKE_NAMESPACE, "table": pipeline_name("iceberg_submit")}},
    **{key: {"spark_runtime": runtime, "output_table": None, "max_records_per_partition": 300,
             "sink": {"type": "iceberg", "namespace": LAKE_NAMESPACE, "table": pipeline_name(key)}}
       for key, runtime in (("campaign_iceberg", "connect"), ("campaign_iceberg_submit", "submit"))},
    "iceberg_no_catalog": {"spark_runtime": "connect", "output_table": None, "sink": {
        "type": "iceberg", "catalog": "elsewhere", "namespace": LAKE_NAMESPACE, "table": pipeline_name("no_catalog")}},
    # Decoding and timestamp forms on the real Spark (test_decode.py).
    "timestamps": {"columns": [
        {"name": "event_id", "type": "string", "required": True},
        {"name": "iso", "type": "timestamp", "formats": ["iso8601"]},
        {"name": "seconds", "type": "timestamp", "formats": ["epoch_seconds"]},
        {"name": "millis", "type": "timestamp", "formats": ["epoch_millis"]},
        {"name": "micros", "type": "timestamp", "formats": ["iso8601", "epoch_micros"]},
        {"name": "either", "type": "timestamp"},
    ]},
    # Nested fields, decimals, dates, jsonb, key and header columns end to end, each runtime and sink (test_decode.py).
    **{f"rich_{runtime}": {"spark_runtime": runtime, "columns": RICH_COLUMNS} for runtime in ("connect", "submit")},
    "rich_iceberg": {"spark_runtime": "connect", "columns": RICH_COLUMNS, "output_table": None, "sink": {
        "type": "iceberg", "namespace": LAKE_NAMESPACE, "table": pipeline_name("rich_iceberg")}},
    # Edge values of every type, end to end in each Spark runtime (test_decode.py).
    "edge_values_connect": {"spark_runtime": "connect"},
    "edge_values_submit": {"spark_runtime": "submit"},
    # Avro values through the stack's schema registry, in each runtime and sink (test_avro.py).
    **{key: {"spark_runtime": runtime, "value": {"format": "avro"}, "columns": AVRO_COLUMNS, **sink}
       for key, runtime, sink in (
           ("avro_connect", "connect", {}), ("avro_submit", "submit", {}),
           ("avro_iceberg", "connect", {"output_table": None, "sink": {
               "type": "iceberg", "namespace": LAKE_NAMESPACE, "table": pipeline_name("avro_iceberg")}}))},
    # Protobuf values through the stack's schema registry, in each runtime and sink (test_protobuf.py).
    **{key: {"spark_runtime": runtime, "value": {"format": "protobuf"}, "columns": PROTOBUF_COLUMNS, **sink}
       for key, runtime, sink in (
           ("protobuf_connect", "connect", {}), ("protobuf_submit", "submit", {}),
           ("protobuf_iceberg", "connect", {"output_table": None, "sink": {
               "type": "iceberg", "namespace": LAKE_NAMESPACE, "table": pipeline_name("protobuf_iceberg")}}))},
    # Protobuf keys too (key_format protobuf), naming an entity table's entities, in each runtime (test_protobuf.py).
    **{key: {"spark_runtime": runtime, "value": {"format": "protobuf", "key_format": "protobuf"}, "write": "upsert",
             "key": ["order_id"], "columns": PROTOBUF_KEYED_COLUMNS}
       for key, runtime in (("protobuf_keys_connect", "connect"), ("protobuf_keys_submit", "submit"))},
    "avro_refused": {"value": {"format": "avro"}, "columns": [*AVRO_COLUMNS, {"name": "coupon", "type": "string"}]},
    "avro_registry_away": {"spark_runtime": "connect", "value": {"format": "avro"}, "columns": AVRO_COLUMNS},
    # No `columns:`: the first plan takes the reader schema's fields (None leaves the key out of the file).
    **{f"avro_schema_columns_{runtime}": {"spark_runtime": runtime, "value": {"format": "avro"}, "columns": None}
       for runtime in ("connect", "submit")},
    # Values framed as Confluent's JSON Schema serializer writes them, in each runtime (test_decode.py).
    **{f"framed_{runtime}": {"spark_runtime": runtime, "value": {"format": "json", "framing": "confluent"}}
       for runtime in ("connect", "submit")},
    # The short fault campaigns (test_fault_campaign.py), one per Spark runtime.
    "campaign_connect": {"max_records_per_partition": 300, "spark_runtime": "connect"},
    "campaign_submit": {"max_records_per_partition": 300, "spark_runtime": "submit"},
    "campaign_connect_cluster": {"max_records_per_partition": 300, "spark_runtime": "connect"},
    "campaign_network": {"max_records_per_partition": 300, "spark_runtime": "connect"},
    "campaign_entity": {"max_records_per_partition": 300, "spark_runtime": "connect", "write": "upsert",
                        "key": ["event_id"]},
    "campaign_change_events": {"max_records_per_partition": 300, "spark_runtime": "connect", "write": "upsert",
                               "key": ["event_id"], "value": {"format": "json", "envelope": "debezium"}},
    # Driven through a running Airflow and its REST API (test_airflow_rest.py).
    # Its positions are mirrored into a consumer group, read back with Kafka's own kafka-consumer-groups.
    "rest": {"schedule": "@hourly", "max_records_per_partition": 100,
             "mirror_consumer_group": f"kafka-ledger.it-{RUN}-rest"},
    # Freshness in each runtime and sink (test_freshness.py).
    "fresh_connect": {"spark_runtime": "connect", "retries": 0},
    "fresh_submit": {"spark_runtime": "submit", "retries": 0},
    "fresh_iceberg": {"spark_runtime": "connect", "retries": 0, "output_table": None, "sink": {
        "type": "iceberg", "namespace": LAKE_NAMESPACE, "table": pipeline_name("fresh_iceberg")}},
    # Runs started by its doorbell alone, looking every second (test_airflow_rest.py).
    "doorbell": {"spark_runtime": "connect", "schedule": None,
                 "trigger": {"type": "doorbell", "poll_seconds": 1, "ring_again_seconds": 60}},
    # A doorbell run carrying batch after batch while records keep coming (test_airflow_rest.py).
    "doorbell_carry": {"spark_runtime": "connect", "schedule": None, "retries": 0,
                       "trigger": {"type": "doorbell", "poll_seconds": 1, "carry_seconds": 12}},
    # The doorbell's short fault campaign (test_airflow_rest.py): its triggerer, scheduler and carrying task killed,
    # the Spark Connect server restarted; a killed task retried within seconds.
    "doorbell_faults": {"spark_runtime": "connect", "schedule": None, "max_records_per_partition": 300,
                        "retry_delay_seconds": 2, "trigger": {"type": "doorbell", "poll_seconds": 1}},
    # Airflow's Edge executor (test_edge_executor.py): batches small enough for a run to take several, a task whose
    # worker was lost or frozen retried within seconds of being failed; the racing one's batches big enough for
    # their rows to stream into COPY for a moment the test can strike in.
    **{key: {"spark_runtime": "connect", "schedule": None, "max_records_per_partition": cap, "retries": 2,
             "retry_delay_seconds": 2} for key, cap in (("edge", 2_000), ("edge_race", 5_000))},
    # Entity tables (test_entity_tables.py): one row per event_id, small batches so that versions of a key meet
    # in one batch and across batches.
    **{key: {"spark_runtime": runtime, "retries": 0, "write": "upsert", "key": ["event_id"],
             "max_records_per_partition": 7}
       for key, runtime in (("entity_connect", "connect"), ("entity_submit", "submit"),
                            ("entity_compacted", "connect"), ("entity_merge", "connect"))},
    # Debezium's change events of a source table into an entity table, in each runtime (test_debezium.py); the
    # topic is Debezium's: <topic prefix>.<schema>.<table>.
    **{f"cdc_{runtime}": {"spark_runtime": runtime, "retries": 0, "write": "upsert", "key": ["id"],
                          "value": {"format": "json", "envelope": "debezium",
                                    "debezium": {"decimal.handling.mode": "string"}}, "columns": CDC_COLUMNS,
                          "topics": [f"{topic_name(f'cdc_{runtime}')}.public.customers_{runtime}"],
                          "max_records_per_partition": 40}
       for runtime in ("connect", "submit")},
    # A source table whose updates leave TOASTed values unchanged (test_debezium.py): batches small enough to cut
    # through a key's updates and its primary-key changes, whose two events are in different partitions. The merge
    # that keeps a value is Postgres's, the same whichever runtime read the batch; spark-submit's side of it (the
    # placeholder masked in its decode) is the type matrix's TOASTed note.
    "toast": {"spark_runtime": "connect", "retries": 0, "write": "upsert", "key": ["id"],
              "value": {"format": "json", "envelope": "debezium"}, "columns": cdc.TOASTED_DECLARED,
              "topics": [f"{topic_name('toast')}.public.toasted"], "max_records_per_partition": 9},
    # A source table of PostgreSQL's everyday types, each column declared as the source's (test_debezium.py), in
    # each runtime: as Debezium writes them by default (the JsonConverter's schemas, precise numerics), without
    # schemas (numerics as text), and as Avro through the registry (Apicurio's AvroConverter); intervals as ISO-8601
    # text (Debezium's default is not exact).
    **{f"typed_{shape}_{runtime}": {
        "spark_runtime": runtime, "retries": 0, "write": "upsert", "key": ["id"],
        "value": {"format": "avro" if shape == "avro" else "json", "envelope": "debezium", "debezium": debezium},
        "columns": cdc.TYPED_DECLARED,
        "topics": [f"{topic_name(f'typed_{shape}_{runtime}')}.public.typed_{shape}_{runtime}"],
        "max_records_per_partition": 25 if runtime == "connect" else 100}
       for shape, debezium in (("schemas", {"interval.handling.mode": "string"}), ("plain", cdc.TYPED_DEBEZIUM),
                               ("avro", {"interval.handling.mode": "string"}), ("alternatives", TYPED_ALTERNATIVES))
       for runtime in ("connect", "submit")},
    # Columns left out, taken from the JsonConverter's schema of Debezium's events (test_debezium.py).
    "derived": {"spark_runtime": "connect", "retries": 0, "write": "upsert", "key": ["id"], "columns": None,
                "value": {"format": "json", "envelope": "debezium", "debezium": {"interval.handling.mode": "string"}},
                "topics": [f"{topic_name('derived')}.public.derived"], "max_records_per_partition": 40},
    # Change events that lack values, made by hand and produced in the order a test needs (test_change_events.py).
    "lacking": {"spark_runtime": "connect", "retries": 0, "write": "upsert", "key": ["id"],
                "value": {"format": "json", "envelope": "debezium"},
                "columns": [{"name": "id", "type": "long"}, {"name": "n", "type": "int"},
                            {"name": "note", "type": "string", "required": True}, {"name": "doc", "type": "string"}]},
    # The mirror's failures and verify's report of a mirror that differs (test_consumer_group_mirror.py).
    "mirror": {"spark_runtime": "connect", "retries": 0, "mirror_consumer_group": f"kafka-ledger.it-{RUN}-mirror"},
    # Over the broker's SASL_SSL listener, in each Spark runtime (test_secured_kafka.py).
    "secure_connect": {"spark_runtime": "connect", "retries": 0},
    "secure_submit": {"spark_runtime": "submit", "retries": 0},
    "secure_refused_password": {"retries": 0},
    "secure_refused_certificate": {"retries": 0},
    # The CLI reaching the ledger over TLS through the Airflow connection (test_stack.py).
    "tls_connection": {},
    # On the local Spark standalone cluster (test_spark_cluster.py).
    "cluster_submit": {"spark_runtime": "submit", "retries": 0},
    "cluster_driver": {"spark_runtime": "submit", "retries": 0},
    "cluster_worker_loss": {"spark_runtime": "submit", "retries": 1},
    "cluster_connect": {"spark_runtime": "connect", "retries": 0},
    # Incremental and full verify (test_verify.py).
    "verify": {"spark_runtime": "connect", "retries": 0},
    # Three pipelines run at once under the scheduler (test_airflow_rest.py).
    **{f"parallel_{n}": {} for n in range(3)},
    # A batch of more partitions than Spark's Kafka source keeps consumers for, read wide (test_wide_read.py).
    "wide": {"spark_runtime": "submit", "retries": 0},
    # A carrier's members (test_carrier.py): b reads a's topic (so a wave apart), c decodes amounts as strings
    # (another decode shape).
    "carried_a": {}, "carried_b": {"topics": [topic_name("carried_a")]},
    "carried_c": {"columns": [COLUMNS[0], {"name": "amount", "type": "string"}]},
    "carried_d": {}, "carried_e": {}, "carried_h": {}, "carried_i": {}, "carried_j": {}, "carried_k": {},
    # A carrier's members under the real scheduler and triggerer (test_airflow_rest.py), a run carrying them 3 s.
    "carried_f": {"spark_runtime": "connect", "schedule": None, "trigger": CARRIED_TRIGGER},
    "carried_g": {"spark_runtime": "connect", "schedule": None, "trigger": CARRIED_TRIGGER},
    # The doorbell's short fault campaign through a carrier of its own (test_airflow_rest.py).
    "carried_faults": {"spark_runtime": "connect", "schedule": None, "max_records_per_partition": 300,
                       "retry_delay_seconds": 2,
                       "trigger": {"type": "doorbell", "poll_seconds": 1, "carrier": f"it_{RUN}_faults"}},
}


# The key of the session's invalid pipeline entry (a column of an unknown type).
INVALID = "invalid"


@pytest.fixture(scope="session")
def servers() -> str:
    value = os.environ.get("KAFKA_LEDGER_BOOTSTRAP_SERVERS")
    if not value or not os.environ.get("KAFKA_LEDGER_DB_URL"):
        pytest.fail("the stack's environment is not set: run `scripts/stack.sh up` and `. scripts/env.sh` first")
    try:
        AdminClient({"bootstrap.servers": value}).list_topics(timeout=10)
    except Exception as exc:  # noqa: BLE001 - any failure means the same thing here
        pytest.fail(f"Kafka at {value} does not answer ({exc}): run `scripts/stack.sh up`")
    return value


@pytest.fixture(scope="session")
def dsn() -> str:
    value = os.environ["KAFKA_LEDGER_DB_URL"]
    try:
        psycopg2.connect(value, connect_timeout=5).close()
    except psycopg2.OperationalError as exc:
        pytest.fail(f"the ledger database does not answer ({exc}): run `scripts/stack.sh up`")
    return value


@pytest.fixture(scope="module")
def spark():
    """A Spark Connect session on the stack's server, in UTC (the decoding tests' Spark)."""
    from pyspark.sql import SparkSession

    from kafka_ledger.config.settings import spark_connect_url

    session = SparkSession.builder.remote(spark_connect_url()).create()
    session.conf.set("spark.sql.session.timeZone", "UTC")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def services(dsn: str, servers: str):
    """The package's services for the stack's ledger and Kafka (config/services.py)."""
    from kafka_ledger.config.settings import services_for

    return services_for(dsn, servers)


@pytest.fixture(scope="session", autouse=True)
def test_pipelines_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The pipelines file of this test session, in force before any DAG is parsed."""
    pipelines = {}
    for key, overrides in PIPELINES.items():
        entry = {
            "topics": [topic_name(key)],
            "output_table": pipeline_name(key),
            "output_schema": "it_output",
            "columns": COLUMNS,
            "max_records_per_partition": 10_000,
            "retries": 1,
            "retry_delay_seconds": 1,
            "schedule": None,
            "spark_conf": {"spark.sql.shuffle.partitions": "2"},
            **overrides,
        }
        pipelines[pipeline_name(key)] = {field: value for field, value in entry.items() if value is not None
                                         or field != "columns"}
    # One broken entry rides along in every session: every DAG run of the suite proves that the other
    # pipelines load and run beside it (test_airflow_rest.py checks how Airflow reports it).
    pipelines[pipeline_name(INVALID)] = {"topics": [topic_name(INVALID)], "output_table": pipeline_name(INVALID),
                                         "columns": [{"name": "id", "type": "varchar"}]}
    path = tmp_path_factory.mktemp("config") / "pipelines.yaml"
    path.write_text(yaml.safe_dump({"pipelines": pipelines}))
    previous = os.environ.get("KAFKA_LEDGER_PIPELINES")
    os.environ["KAFKA_LEDGER_PIPELINES"] = str(path)
    yield path
    if previous is None:
        os.environ.pop("KAFKA_LEDGER_PIPELINES", None)
    else:
        os.environ["KAFKA_LEDGER_PIPELINES"] = previous


@pytest.fixture
def pipeline_factory(servers: str):
    """Create the topic of one test pipeline and return its validated config."""
    from kafka_ledger.config.pipeline import get_pipeline

    def make(key: str, partitions: int = 3, topic_config: dict[str, str] | None = None):
        topic = topic_name(key)
        create_topic(AdminClient({"bootstrap.servers": servers}), topic, partitions, config=topic_config)
        return get_pipeline(pipeline_name(key))

    return make


@pytest.fixture
def producer(servers: str) -> RecordedProducer:
    return RecordedProducer(servers)


@pytest.fixture(scope="session", autouse=True)
def remove_test_artifacts(servers: str, dsn: str, test_pipelines_file: Path):
    """After the session: drop this run's topics, tables and ledger rows (KAFKA_LEDGER_KEEP_TEST_DATA=1 keeps them)."""
    yield
    if os.environ.get("KAFKA_LEDGER_KEEP_TEST_DATA") == "1":
        return
    from kafka_ledger.config.pipeline import read_pipelines
    from kafka_ledger.sinks import remove_pipeline

    with psycopg2.connect(dsn) as conn, conn.cursor() as cur:
        for pipeline in read_pipelines(test_pipelines_file).valid.values():
            remove_pipeline(cur, pipeline)
    conn.close()
    _drop_lake_tables(read_pipelines(test_pipelines_file).valid.values())
    admin = AdminClient({"bootstrap.servers": servers})
    existing = set(admin.list_topics(timeout=10).topics)
    topics = [name for name in existing if name.startswith(f"it-{RUN}-")]
    for future in admin.delete_topics(topics).values() if topics else ():
        future.result(timeout=30)


def _drop_lake_tables(pipelines) -> None:
    """This run's Iceberg tables, with their files."""
    from kafka_ledger.config.pipeline import IcebergSinkSpec
    from kafka_ledger.sinks import IcebergSink

    for pipeline in pipelines:
        if isinstance(pipeline.sink, IcebergSinkSpec) and pipeline.sink.catalog == "lake":
            sink = IcebergSink(pipeline)
            try:
                sink.catalog().purge_table(sink.identifier)
            except Exception:  # noqa: BLE001 - never made (a refused plan), or made and gone already
                pass
