"""The lake's catalogs read from Spark's settings, and turned into pyiceberg's (no Spark, no catalog reached)."""

from __future__ import annotations

import pytest

from kafka_ledger.sinks.iceberg.catalogs import LakeError, catalog_settings, reader_properties

SPARK_DEFAULTS = """# the stack's
spark.authenticate                 true
spark.sql.catalog.lake             org.apache.iceberg.spark.SparkCatalog
spark.sql.catalog.lake.type        jdbc
spark.sql.catalog.lake.uri         jdbc:postgresql://127.0.0.1:15432/lake?sslmode=verify-full&sslrootcert=/s/ca.pem
spark.sql.catalog.lake.jdbc.user   lake
spark.sql.catalog.lake.jdbc.password=p@ss:w/rd
spark.sql.catalog.lake.warehouse   file:///s/lake
spark.sql.catalog.lakehouse.type   rest
"""


def test_a_catalogs_settings_are_its_spark_settings_without_their_prefix(tmp_path):
    (tmp_path / "spark-defaults.conf").write_text(SPARK_DEFAULTS)
    assert catalog_settings("lake", tmp_path) == {
        "type": "jdbc", "uri": "jdbc:postgresql://127.0.0.1:15432/lake?sslmode=verify-full&sslrootcert=/s/ca.pem",
        "jdbc.user": "lake", "jdbc.password": "p@ss:w/rd", "warehouse": "file:///s/lake"}
    with pytest.raises(LakeError, match="catalog 'lakehouse' is not declared in .*spark-defaults.conf"):
        catalog_settings("lakehouse", tmp_path)  # its settings without spark.sql.catalog.lakehouse itself
    with pytest.raises(LakeError, match="no .*spark-defaults.conf"):
        catalog_settings("lake", tmp_path / "elsewhere")


def test_a_jdbc_catalog_on_postgres_is_read_as_pyicebergs_sql_catalog_over_the_same_tables(tmp_path):
    (tmp_path / "spark-defaults.conf").write_text(SPARK_DEFAULTS)
    properties = reader_properties("lake", catalog_settings("lake", tmp_path))
    assert properties == {
        "type": "sql", "init_catalog_tables": "true", "warehouse": "file:///s/lake",
        "uri": "postgresql+psycopg2://lake:p%40ss%3Aw%2Frd@127.0.0.1:15432/lake?sslmode=verify-full&sslrootcert=%2Fs%2Fca.pem"}


def test_a_rest_catalog_stays_one_and_other_kinds_are_refused_by_name():
    assert reader_properties("r", {"type": "rest", "uri": "https://cat", "credential": "id:secret"}) == {
        "type": "rest", "uri": "https://cat", "credential": "id:secret"}
    with pytest.raises(LakeError, match="catalog 'h' is of type 'hadoop': kafka-ledger reads jdbc and rest"):
        reader_properties("h", {"type": "hadoop", "warehouse": "file:///w"})
    with pytest.raises(LakeError, match="must be in PostgreSQL"):
        reader_properties("m", {"type": "jdbc", "uri": "jdbc:mysql://h/db"})
    with pytest.raises(LakeError, match="parameters the reader cannot pass on: ssl"):
        reader_properties("j", {"type": "jdbc", "uri": "jdbc:postgresql://h/db?ssl=true"})


def test_a_catalog_that_cannot_be_reached_is_a_clear_refusal_without_its_password(tmp_path, monkeypatch):
    from kafka_ledger.config.pipeline import PipelineConfig
    from kafka_ledger.sinks.iceberg.sink import IcebergSink
    from kafka_ledger.sinks.iceberg.snapshots import IcebergSinkError

    # Nothing listens on port 1 of loopback: the catalog's database refuses the connection at once.
    (tmp_path / "spark-defaults.conf").write_text(SPARK_DEFAULTS.replace("127.0.0.1:15432", "127.0.0.1:1"))
    monkeypatch.setenv("SPARK_CONF_DIR", str(tmp_path))
    pipeline = PipelineConfig.model_validate({
        "name": "p", "topics": ["t"], "columns": [{"name": "a", "type": "string"}],
        "sink": {"type": "iceberg", "namespace": "n", "table": "t"}})
    with pytest.raises(IcebergSinkError, match=r"catalog 'lake' cannot be reached \(connection to server at "
                                               r"\"127.0.0.1\", port 1 failed.*\): nothing was read or published") as e:
        IcebergSink(pipeline).catalog()  # as a plan reaches it, before anything is recorded
    assert "p@ss" not in str(e.value)
