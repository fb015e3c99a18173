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


class _Task:
    """Stands for an Airflow task: records what runs after it."""

    def __init__(self, kind: str, task_id: str):
        self.kind, self.task_id, self.downstream = kind, task_id, []

    def __rshift__(self, other: _Task) -> _Task:
        self.downstream.append(other)
        return other


class _Factory:
    """The DAG builder's side of the seam, recording what a runtime asks for."""

    def __init__(self) -> None:
        self.made: list[_Task] = []

    def _make(self, kind: str, task_id: str) -> _Task:
        self.made.append(_Task(kind, task_id))
        return self.made[-1]

    def read_and_commit(self, task_id: str) -> _Task:
        return self._make("read_and_commit", task_id)

    def spark_submit(self, task_id: str) -> _Task:
        return self._make("spark_submit", task_id)

    def commit(self, task_id: str) -> _Task:
        return self._make("commit", task_id)


def test_every_declared_runtime_has_one_implementation():
    assert set(RUNTIMES) == set(get_args(SparkRuntime))
    assert all(isinstance(runtime, Runtime) and runtime.name == name for name, runtime in RUNTIMES.items())


@pytest.mark.parametrize(("name", "tasks", "committing"), [
    ("connect", [("read_and_commit", "read_and_commit")], "read_and_commit"),
    ("submit", [("spark_submit", "read_and_stage"), ("commit", "commit_batch")], "commit_batch"),
])
def test_each_runtime_asks_the_dag_builder_for_its_own_tasks(name, tasks, committing):
    factory = _Factory()
    spark, commits = RUNTIMES[name].airflow_tasks(factory)
    assert [(t.kind, t.task_id) for t in factory.made] == tasks
    assert spark.task_id == RUNTIMES[name].spark_task_id and commits.task_id == committing
    assert (RUNTIMES[name].commit_task_id or RUNTIMES[name].spark_task_id) == committing
    if spark is not commits:
        assert spark.downstream == [commits]  # the commit waits for the staging


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
        if "runtimes" in path.parts or path.name in ("config.py", "settings.py", "benchmark.py"):
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(r"""[=!]=\s*["'](connect|submit)["']|["'](connect|submit)["']\s*[=!]=""", line):
                found.append(f"{path.relative_to(PACKAGE)}:{number}: {line.strip()}")
    assert found == []


def test_a_spark_failure_is_told_by_its_first_line_and_its_root_cause():
    from kafka_ledger.runtimes.connect.batch import _headline

    error = Exception("[KAFKA_DATA_LOSS] Some data may have been lost\nJVM stacktrace:\n\tat org.apache.spark.X\n"
                      "Caused by: java.util.concurrent.ExecutionException: boom\n\tat y\n"
                      "Caused by: org.apache.kafka.common.errors.TimeoutException: Timed out waiting for a node\n")
    assert _headline(error) == ("[KAFKA_DATA_LOSS] Some data may have been lost; Caused by: "
                                "org.apache.kafka.common.errors.TimeoutException: Timed out waiting for a node")
    assert _headline(Exception("just this")) == "just this"
    assert _headline(Exception("")) == "Exception"


def test_the_warm_up_reads_the_newest_offsets_of_the_fullest_partitions():
    from kafka_ledger.model.ranges import OffsetRange, PartitionOffsets, TopicPartition
    from kafka_ledger.runtimes.connect.batch import newest_ranges

    offsets = {TopicPartition("t", 0): PartitionOffsets(0, 100), TopicPartition("t", 1): PartitionOffsets(95, 100),
               TopicPartition("t", 2): PartitionOffsets(7, 7), TopicPartition("u", 0): PartitionOffsets(10, 1000)}
    # 30 records over the partitions holding any (the empty one left out): 10 each, never before the log start.
    assert newest_ranges(offsets, records=30) == [OffsetRange("t", 0, 90, 100), OffsetRange("t", 1, 95, 100),
                                                  OffsetRange("u", 0, 990, 1000)]
    # At most `partitions` partitions: those holding the most.
    assert newest_ranges(offsets, records=30, partitions=2) == [OffsetRange("t", 0, 85, 100),
                                                                OffsetRange("u", 0, 985, 1000)]
    assert newest_ranges({TopicPartition("t", 0): PartitionOffsets(5, 5)}) == []


def test_every_runtime_publishes_into_every_sink_and_a_sink_a_runtime_lacks_is_refused_before_planning(monkeypatch):
    from kafka_ledger.batch import plan as planner
    from kafka_ledger.config.pipeline import PipelineConfig
    from kafka_ledger.model.ranges import PlanError
    from kafka_ledger.runtimes.submit.runtime import SubmitRuntime

    assert all(runtime.sinks == {"postgres", "iceberg"} for runtime in RUNTIMES.values())
    lake = PipelineConfig.model_validate({
        "name": "lake", "topics": ["t"], "columns": [{"name": "a", "type": "string"}], "spark_runtime": "submit",
        "sink": {"type": "iceberg", "namespace": "n", "table": "t"}})
    planner._refuse_sink(lake)  # nothing to refuse
    monkeypatch.setattr(SubmitRuntime, "sinks", frozenset({"postgres"}))  # a runtime without the lake
    with pytest.raises(PlanError, match="the submit runtime cannot publish into the iceberg sink .*nothing was"):
        planner._refuse_sink(lake)
