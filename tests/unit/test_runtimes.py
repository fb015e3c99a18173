"""The runtime seam: each Spark runtime is one implementation of runtimes.base.Runtime, chosen once per pipeline."""

from __future__ import annotations

import re
from pathlib import Path
from typing import get_args

import pytest

from kafka_ledger.config.pipeline import SparkRuntime, parse_pipelines
from kafka_ledger.runtimes import RUNTIMES, Runtime, runtime_for

PACKAGE = Path(__file__).resolve().parents[2] / "include" / "kafka_ledger"
PIPELINES = parse_pipelines("""
pipelines:
  clicks: {topics: [clicks], output_table: clicks, columns: [{name: id, type: string}]}
  pinned: {topics: [clicks], output_table: pinned, spark_runtime: submit, columns: [{name: id, type: string}]}
""")


def test_every_declared_runtime_has_one_implementation():
    assert set(RUNTIMES) == set(get_args(SparkRuntime))
    assert all(isinstance(runtime, Runtime) and runtime.name == name for name, runtime in RUNTIMES.items())


@pytest.mark.parametrize(("name", "operators", "committing"), [
    ("connect", {"read_and_commit": "ReadAndCommitOperator"}, "read_and_commit"),
    ("submit", {"read_and_stage": "SubmitBatchOperator", "commit_batch": "_PythonDecoratedOperator"}, "commit_batch"),
])
def test_each_runtime_builds_its_own_tasks_after_the_plan(name, operators, committing):
    from airflow.providers.standard.operators.empty import EmptyOperator
    from airflow.sdk import DAG

    with DAG(dag_id=f"runtime_{name}", schedule=None):
        plan = EmptyOperator(task_id="plan_batch")
        spark, commits = RUNTIMES[name].build_tasks(PIPELINES["clicks"], plan)
    dag = spark.dag
    assert {t.task_id: type(t).__name__ for t in dag.tasks if t is not plan} == operators
    assert spark.task_id == RUNTIMES[name].spark_task_id and commits.task_id == committing
    assert (RUNTIMES[name].commit_task_id or RUNTIMES[name].spark_task_id) == committing
    assert spark.upstream_task_ids == {"plan_batch"}
    if spark is not commits:
        assert spark.task_id in commits.upstream_task_ids  # the commit waits for the staging


def test_the_dag_builder_imports_no_runtime():
    """airflow/ builds DAGs through the runtime seam (runtime_for(...).build_tasks) and knows no runtime's module."""
    from test_imports import import_graph

    graph = import_graph()
    reached = {target for module, targets in graph.items() if module.startswith("kafka_ledger.airflow")
               for target in targets if target.startswith("kafka_ledger.runtimes")}
    assert reached <= {"kafka_ledger.runtimes", "kafka_ledger.runtimes.airflow_tasks"}


def test_the_runtime_is_chosen_once_per_pipeline_its_own_first_then_the_deployments(monkeypatch):
    monkeypatch.setenv("KAFKA_LEDGER_SPARK_RUNTIME", "connect")
    assert runtime_for(PIPELINES["clicks"]).name == "connect"
    assert runtime_for(PIPELINES["pinned"]).name == "submit"
    monkeypatch.delenv("KAFKA_LEDGER_SPARK_RUNTIME")
    assert runtime_for(PIPELINES["clicks"]).name == "submit"  # the code's default


def test_no_module_outside_the_runtimes_branches_on_a_runtime_name():
    """A new runtime is a new implementation, not one more `if runtime == ...` across the package."""
    found = []
    for path in PACKAGE.rglob("*.py"):
        if "runtimes" in path.parts or "config" in path.parts:
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(r"""[=!]=\s*["'](connect|submit)["']|["'](connect|submit)["']\s*[=!]=""", line):
                found.append(f"{path.relative_to(PACKAGE)}:{number}: {line.strip()}")
    assert found == []


def test_a_spark_failure_is_told_by_its_first_line_and_its_root_cause():
    from kafka_ledger.spark.connect import headline as _headline

    error = Exception("[KAFKA_DATA_LOSS] Some data may have been lost\nJVM stacktrace:\n\tat org.apache.spark.X\n"
                      "Caused by: java.util.concurrent.ExecutionException: boom\n\tat y\n"
                      "Caused by: org.apache.kafka.common.errors.TimeoutException: Timed out waiting for a node\n")
    assert _headline(error) == ("[KAFKA_DATA_LOSS] Some data may have been lost; Caused by: "
                                "org.apache.kafka.common.errors.TimeoutException: Timed out waiting for a node")
    assert _headline(Exception("just this")) == "just this"
    assert _headline(Exception("")) == "Exception"
    # A failed Python function (a wide read's) is told by its own error, the last line of its traceback.
    worker = Exception("An exception was thrown from the Python worker. Please see the stack trace below.\n"
                       "Traceback (most recent call last):\n  File \"wide_read.py\", line 87, in read_groups\n"
                       "    yield from read_group(spec)\ncimpl.KafkaException: KafkaError{code=_AUTO_OFFSET_RESET}\n")
    assert _headline(worker) == ("An exception was thrown from the Python worker: "
                                 "cimpl.KafkaException: KafkaError{code=_AUTO_OFFSET_RESET}")


def test_the_warm_up_reads_the_newest_offsets_of_the_fullest_partitions():
    from kafka_ledger.model.ranges import OffsetRange, PartitionOffsets, TopicPartition
    from kafka_ledger.runtimes.connect.warm_up import newest_ranges

    offsets = {TopicPartition("t", 0): PartitionOffsets(0, 100), TopicPartition("t", 1): PartitionOffsets(95, 100),
               TopicPartition("t", 2): PartitionOffsets(7, 7), TopicPartition("u", 0): PartitionOffsets(10, 1000)}
    # 30 records over the partitions holding any (the empty one left out): 10 each, never before the log start.
    assert newest_ranges(offsets, records=30) == [OffsetRange("t", 0, 90, 100), OffsetRange("t", 1, 95, 100),
                                                  OffsetRange("u", 0, 990, 1000)]
    # At most `partitions` partitions: those holding the most.
    assert newest_ranges(offsets, records=30, partitions=2) == [OffsetRange("t", 0, 85, 100),
                                                                OffsetRange("u", 0, 985, 1000)]
    assert newest_ranges({TopicPartition("t", 0): PartitionOffsets(5, 5)}) == []


def test_a_client_session_let_go_is_freed_not_kept_until_the_process_exits():
    """PySpark keeps every Spark Connect client alive until exit (an atexit clean-up); a run carrying batch after
    batch, a client each, must not pile them up (no call reaches a server here)."""
    import gc
    import weakref

    from pyspark.sql import SparkSession

    from kafka_ledger.spark.connect import let_go

    spark = SparkSession.builder.remote("sc://127.0.0.1:1").create()
    client = weakref.ref(spark.client)
    let_go(spark)
    spark.client._channel.close()
    del spark
    gc.collect()
    assert client() is None
