"""The local stack's lake: Iceberg's JDBC catalog `lake` in Spark (the Spark Connect server and spark-submit, from
spark-defaults.conf) and read back without Spark by pyiceberg (kafka_ledger.sinks.iceberg.catalogs)."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from kafka_ledger.runtimes.connect.batch import client_session, close_session, configure
from kafka_ledger.runtimes.submit.spark_submit import spark_jars
from kafka_ledger.sinks.iceberg import catalogs as lake

pytestmark = pytest.mark.integration

NAMESPACE = "it_lake"
JOB = Path(__file__).resolve().parent / "lake_job.py"


@pytest.fixture
def spark():
    session = client_session(str(uuid.uuid4()))
    configure(session)
    yield session
    close_session(session, release_session=True)


@pytest.fixture
def table(spark):
    name = f"lake.{NAMESPACE}.t_{uuid.uuid4().hex[:8]}"
    spark.sql(f"CREATE NAMESPACE IF NOT EXISTS lake.{NAMESPACE}")
    yield name
    spark.sql(f"DROP TABLE IF EXISTS {name} PURGE")


def offsets(arrow) -> set[tuple[str, int, int]]:
    return set(zip(*(arrow.column(c).to_pylist() for c in ("kafka_topic", "kafka_partition", "kafka_offset")),
                   strict=True))


def test_spark_writes_stamped_snapshots_in_both_runtimes_and_pyiceberg_reads_them_without_spark(spark, table):
    from pyspark.sql import functions as F

    rows = spark.range(0, 100).select(F.lit("t").alias("kafka_topic"), (F.col("id") % 2).cast("int").alias(
        "kafka_partition"), F.col("id").alias("kafka_offset"))
    # On the Spark Connect server: a write option stamps the snapshot, and so does the session's setting (what a
    # SQL statement such as a replay's MERGE can carry: Iceberg 1.11 honours it).
    rows.writeTo(table).using("iceberg").tableProperty("format-version", "2").option(
        "snapshot-property.kl.batch-id", "7").create()
    spark.conf.set("spark.sql.iceberg.snapshot-property.kl.batch-id", "8")
    spark.range(100, 110).select(F.lit("t").alias("kafka_topic"), F.lit(1).alias("kafka_partition"),
                                 F.col("id").alias("kafka_offset")).writeTo(table).append()
    spark.conf.unset("spark.sql.iceberg.snapshot-property.kl.batch-id")
    # In a spark-submit job (the submit runtime's way): the same catalog from the same spark-defaults.conf.
    subprocess.run([str(Path(sys.executable).parent / "spark-submit"), "--master", "local[1]", "--jars", spark_jars(),
                    str(JOB), table, "0", "5", "9"], check=True, capture_output=True, timeout=300,
                   env={k: v for k, v in os.environ.items() if k != "SPARK_CONNECT_MODE_ENABLED"})  # set by PySpark

    expected = ({("t", i % 2, i) for i in range(100)} | {("t", 1, i) for i in range(100, 110)}
                | {("t", 2, i) for i in range(5)})
    assert offsets(spark.table(table).toArrow()) == expected
    read = lake.reader("lake").load_table(tuple(table.split(".")[1:]))
    assert offsets(read.scan().to_arrow()) == expected
    assert [s.summary["kl.batch-id"] for s in read.snapshots()] == ["7", "8", "9"]


def test_the_lake_needs_tls_and_its_settings_file(tmp_path):
    settings = lake.catalog_settings("lake")
    assert settings["type"] == "jdbc" and "sslmode=verify-full" in settings["uri"]
    plain = dict(settings, uri=settings["uri"].split("?")[0] + "?sslmode=disable")
    from pyiceberg.catalog import load_catalog

    with pytest.raises(Exception, match="rejects connection"):
        load_catalog("lake", **lake.reader_properties("lake", plain)).list_namespaces()
    with pytest.raises(lake.LakeError, match="not declared"):
        lake.reader("elsewhere")
