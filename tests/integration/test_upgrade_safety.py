"""Upgrade safety: a batch fails after staging, the transform changes, the resumed batch uses the new code."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml
from integration_support import assert_exactly_once, batches, good_value

from kafka_ledger.airflow.dags import run_pipeline_dag
from kafka_ledger.config.pipeline import get_pipeline
from kafka_ledger.config.settings import runtime_name as spark_runtime

pytestmark = pytest.mark.integration


def change_pipeline(name: str, **fields: object) -> None:
    """Edit the session's pipelines file, as a deploy of new pipeline code would."""
    path = Path(os.environ["KAFKA_LEDGER_PIPELINES"])
    data = yaml.safe_load(path.read_text())
    data["pipelines"][name].update(fields)
    path.write_text(yaml.safe_dump(data))


def test_a_batch_staged_by_old_code_completes_with_the_new_code(
    dsn, servers, pipeline_factory, producer, monkeypatch, tmp_path
):
    pipeline = pipeline_factory("upgrade", partitions=2)
    sent = producer.send(pipeline.topics[0], [good_value(i) for i in range(40)]
                         + [json.dumps({"event_id": f"x{i}", "legacy": True}).encode() for i in range(5)])
    # Old code: extra fields ignored. The attempt dies after writing its rows (spark-submit's driver is killed;
    # the connect runtime's task, which runs in this process under dag.test(), fails in its transaction);
    # the run fails (no retries).
    action = "kill" if spark_runtime(pipeline) == "submit" else "raise"
    monkeypatch.setenv("KAFKA_LEDGER_FAILPOINTS", f"after_staging={action}")
    monkeypatch.setenv("KAFKA_LEDGER_FAILPOINTS_ONCE_DIR", str(tmp_path))
    assert run_pipeline_dag(pipeline).state == "failed"
    (failed,) = batches(dsn, pipeline)
    assert (failed.status, failed.attempts) == ("failed", 1)
    monkeypatch.delenv("KAFKA_LEDGER_FAILPOINTS")

    # New code: records with fields nobody declared are dead-lettered. The resumed batch reads the same
    # ranges again, with the new code, and the old attempt's staged rows are discarded.
    change_pipeline(pipeline.name, extra_fields="dead_letter")
    upgraded = get_pipeline(pipeline.name)
    assert run_pipeline_dag(upgraded).state == "success"
    (done,) = batches(dsn, upgraded)
    assert (done.batch_id, done.status, done.attempts, done.ranges) == (
        failed.batch_id, "committed", 2, failed.ranges)
    assert_exactly_once(dsn, servers, upgraded, {rid: "unexpected field(s): legacy" for rid in sent[40:]})
