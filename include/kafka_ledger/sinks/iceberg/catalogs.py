"""The lake's Iceberg catalogs as Spark declares them, and a reader of their tables that needs no Spark (pyiceberg)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import parse_qsl, urlsplit

from sqlalchemy.engine import URL

from kafka_ledger.spark.defaults import SPARK_DEFAULTS, spark_conf_dir, spark_defaults

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog

# The libpq connection parameters a JDBC URL's query may carry over to the reader's psycopg2 connection.
_LIBPQ_PARAMETERS = {"sslmode", "sslrootcert", "sslcert", "sslkey", "connect_timeout", "application_name"}


class LakeError(RuntimeError):
    """A lake catalog is not declared, or declared in a way kafka-ledger cannot read without Spark."""


def catalog_settings(name: str, conf_dir: Path | None = None) -> dict[str, str]:
    """The Spark settings of catalog `name` (`spark.sql.catalog.<name>.<key>`) as {key: value}."""
    conf_dir = conf_dir or spark_conf_dir()
    if conf_dir is None:
        raise LakeError("the lake's catalogs are declared in Spark's spark-defaults.conf: set SPARK_CONF_DIR to its "
                        "folder (scripts/env.sh does for the local stack)")
    path = conf_dir / SPARK_DEFAULTS
    try:
        properties = spark_defaults(path)
    except FileNotFoundError:
        raise LakeError(f"no {path}: the lake's catalogs are declared there (spark.sql.catalog.<name>.*)") from None
    prefix = f"spark.sql.catalog.{name}"
    if prefix not in properties:
        raise LakeError(f"catalog {name!r} is not declared in {path} (no {prefix})")
    return {key[len(prefix) + 1:]: value for key, value in properties.items() if key.startswith(prefix + ".")}


def reader_properties(name: str, settings: dict[str, str]) -> dict[str, str]:
    """pyiceberg's properties for the catalog Spark knows by `settings`: a JDBC catalog on Postgres becomes
    pyiceberg's SQL catalog over the same tables, a REST catalog stays one."""
    kind = settings.get("type", "")
    if kind == "rest":
        return {"type": "rest", **{k: v for k, v in settings.items() if k != "type"}}
    if kind != "jdbc":
        raise LakeError(f"catalog {name!r} is of type {kind or '(none)'!r}: kafka-ledger reads jdbc and rest "
                        "catalogs without Spark")
    jdbc = settings.get("uri", "")
    if not jdbc.startswith("jdbc:postgresql://"):
        raise LakeError(f"catalog {name!r}: its JDBC catalog must be in PostgreSQL (uri jdbc:postgresql://...)")
    parts = urlsplit(jdbc[len("jdbc:"):])
    unknown = sorted(k for k, _ in parse_qsl(parts.query) if k not in _LIBPQ_PARAMETERS)
    if unknown:
        raise LakeError(f"catalog {name!r}: its JDBC URL has parameters the reader cannot pass on: "
                        f"{', '.join(unknown)}")
    url = URL.create("postgresql+psycopg2", username=settings.get("jdbc.user"), password=settings.get("jdbc.password"),
                     host=parts.hostname, port=parts.port, database=parts.path.lstrip("/"),
                     query=dict(parse_qsl(parts.query)))
    # On a new catalog database its first user makes the catalog's tables (iceberg_tables and
    # iceberg_namespace_properties): an Iceberg sink's plan, before Spark ever used the catalog. pyiceberg makes
    # them as Spark's JDBC catalog does (schema V1: checked with both), and neither touches tables that exist.
    return {"type": "sql", "uri": url.render_as_string(hide_password=False), "init_catalog_tables": "true",
            **({"warehouse": settings["warehouse"]} if "warehouse" in settings else {})}


def reader(name: str, conf_dir: Path | None = None) -> Catalog:
    """Catalog `name` as pyiceberg reads it: the same tables, snapshots and files Spark writes, without Spark."""
    from pyiceberg.catalog import load_catalog

    return load_catalog(name, **reader_properties(name, catalog_settings(name, conf_dir)))
