"""Airflow local settings for kafka-ledger: a LocalExecutor scheduler loads the tasks' heavy libraries before it forks.

Airflow imports this module in each of its processes. The LocalExecutor runs every task in a process forked from
workers the scheduler forks when it starts, so what the scheduler has imported by then, every task has without
importing it. The connect runtime's Spark task needs the Spark Connect client (pyspark's connect module with pandas,
pyarrow and grpc): about 2 s of imports on a 2-core machine, which was most of a doorbell run's Spark task; and every
task parses the DAG file, whose operators' modules take some 0.3 s more (docs/benchmark.md#freshness). Loaded here,
they cost the scheduler's start that time once, and some 150 MB its forks share. Third-party libraries only:
kafka-ledger's own modules are imported by each task afresh, so a task never runs code older than the deployment's.
No connection is opened here: a gRPC channel must not cross a fork.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys

log = logging.getLogger(__name__)

PRELOADED = (
    "pyspark.sql.connect.session",
    "airflow.providers.apache.spark.operators.spark_submit",
    "airflow.providers.standard.operators.trigger_dagrun",
)


def _is_local_executor_scheduler() -> bool:
    if os.path.basename(sys.argv[0]) != "airflow" or sys.argv[1:2] != ["scheduler"]:
        return False
    from airflow.configuration import conf

    return "LocalExecutor" in conf.get("core", "executor", fallback="")


if _is_local_executor_scheduler():
    for module in PRELOADED:
        try:
            importlib.import_module(module)
        except ImportError as exc:  # not installed in this deployment: a task imports what it needs
            log.info("kafka-ledger: %s is not preloaded (%s)", module, exc)
