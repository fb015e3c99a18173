"""A Spark session for work outside a batch (the lake's upkeep), in whichever runtime the pipeline runs.

The runtime provides its kind (runtimes/base.Runtime.spark_sessions): a session of the warm Spark Connect server, or
a local classic session started as spark-submit's would be (the stack's Spark settings, the connector jars), so that
a pipeline of either runtime gets its upkeep without the other runtime's parts.
"""

from __future__ import annotations

import logging
import os
import uuid
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING

from kafka_ledger.spark.connect import client_session, close_session, configure

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)


class SparkSessions(ABC):
    """Where a piece of Spark work outside a batch gets its session."""

    @abstractmethod
    @contextmanager
    def session(self, purpose: str) -> Iterator[SparkSession]:
        """A session of its own for `purpose` (in words, for Spark's UI and logs), let go when the block ends."""


class ConnectSessions(SparkSessions):
    """A new session on the Spark Connect server, released on the server at the end."""

    @contextmanager
    def session(self, purpose: str) -> Iterator[SparkSession]:
        spark = client_session(str(uuid.uuid4()))
        try:
            configure(spark)
            yield spark
        finally:
            close_session(spark, release_session=True)


class LocalSessions(SparkSessions):
    """A classic Spark session in this process, on `master`, with `jars` and `conf` (spark-submit's own settings for a
    batch's job); Spark's settings file (SPARK_CONF_DIR) declares the lake's catalogs for it as for every Spark."""

    def __init__(self, master: str, jars: str, conf: Mapping[str, str]):
        self.master, self.jars, self.conf = master, jars, dict(conf)

    @contextmanager
    def session(self, purpose: str) -> Iterator[SparkSession]:
        # A Spark Connect client imported earlier in this process marks its environment for Spark Connect: this
        # session is a classic one.
        os.environ.pop("SPARK_CONNECT_MODE_ENABLED", None)
        from pyspark.sql import SparkSession

        builder = SparkSession.builder.master(self.master).appName(f"kafka-ledger {purpose}").config(
            "spark.jars", self.jars)
        for key, value in self.conf.items():
            builder = builder.config(key, value)
        spark = builder.getOrCreate()
        try:
            yield spark
        finally:
            spark.stop()
