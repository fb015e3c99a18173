"""The doorbell: when it rings, how it is declared, and how a pipeline's DAG is scheduled on it."""

from __future__ import annotations

import pytest

from kafka_ledger.airflow.dags import build_pipeline_dag, doorbell_asset
from kafka_ledger.airflow.doorbell import DoorbellTrigger, Look, RingRule
from kafka_ledger.config.pipeline import ConfigError, DoorbellSpec, parse_pipelines
from kafka_ledger.model.ranges import TopicPartition

A, B = TopicPartition("t", 0), TopicPartition("t", 1)

PIPELINES = parse_pipelines(
    """
pipelines:
  bell:
    topics: [t]
    output_table: bell
    trigger: {type: doorbell, min_backlog: 100, poll_seconds: 2}
    columns: [{name: id, type: string}]
  bell_only:
    topics: [t]
    output_table: bell_only
    schedule: null
    trigger: doorbell
    columns: [{name: id, type: string}]
  plain:
    topics: [t]
    output_table: plain
    columns: [{name: id, type: string}]
"""
)


def test_it_rings_once_enough_offsets_wait_and_not_again_before_progress():
    rule = RingRule(min_backlog=100, ring_again_seconds=300)
    assert not rule.rings(None, backlog=99, now=0)
    assert rule.rings(None, backlog=100, now=1)
    # A run is under way (or queued): no batch has committed since, more data arrives, no second ring.
    assert not rule.rings(None, backlog=5000, now=20)
    # The run committed batch 7 and data still waits, so the next run is asked for.
    assert rule.rings(7, backlog=200, now=30)
    # Caught up: nothing to ring for, whatever the progress.
    assert not rule.rings(8, backlog=0, now=40)


def test_it_rings_again_when_its_ring_was_lost_or_its_run_failed():
    rule = RingRule(min_backlog=1, ring_again_seconds=300)
    assert rule.rings(3, backlog=10, now=0)
    assert not rule.rings(3, backlog=10, now=299)
    assert rule.rings(3, backlog=10, now=300)
    assert not rule.rings(3, backlog=10, now=301)


def test_it_keeps_quiet_while_a_run_carries_batches_and_rings_once_that_run_ended_with_data_waiting():
    rule = RingRule(min_backlog=1, ring_again_seconds=300)
    assert rule.rings(None, backlog=10, now=0)
    # The run carries batch after batch: progress at every poll, data always waiting, and no ring.
    for second, progress in enumerate(range(1, 30), start=1):
        assert not rule.rings(progress, backlog=500, now=second, carrying=True)
    # Its budget spent, it ended with data waiting: the next run is asked for at once.
    assert rule.rings(29, backlog=500, now=31)
    assert not rule.rings(29, backlog=500, now=32)


def test_a_look_sums_the_lag_and_names_how_many_partitions_wait():
    look = Look(progress=5, lag={A: 0, B: 3})
    event = look.event("bell")
    assert look.backlog == 3
    assert (event["pipeline"], event["backlog"], event["partitions_waiting"]) == ("bell", 3, 1)


def test_the_trigger_serializes_to_what_builds_it_again():
    trigger = DoorbellTrigger("bell", min_backlog=100, poll_seconds=2.0, ring_again_seconds=60.0)
    classpath, kwargs = trigger.serialize()
    assert classpath == "kafka_ledger.airflow.doorbell.DoorbellTrigger"
    assert DoorbellTrigger(**kwargs).serialize() == (classpath, kwargs)


def test_trigger_doorbell_is_short_for_its_defaults_and_schedule_is_the_default():
    assert PIPELINES["bell_only"].doorbell == DoorbellSpec(type="doorbell")
    assert PIPELINES["bell"].doorbell.min_backlog == 100
    assert PIPELINES["plain"].doorbell is None


def test_a_doorbell_refuses_a_backlog_below_one_and_unknown_options():
    for trigger in ("{type: doorbell, min_backlog: 0}", "{type: doorbell, every: 3}", "bell"):
        with pytest.raises(ConfigError, match="trigger"):
            parse_pipelines(f"pipelines:\n  p:\n    topics: [t]\n    output_table: p\n    trigger: {trigger}\n"
                            "    columns: [{name: id, type: string}]\n")


def test_a_doorbell_dag_runs_on_its_asset_beside_its_schedule_or_alone():
    beside = build_pipeline_dag(PIPELINES["bell"])
    assert type(beside.timetable).__name__ == "AssetOrTimeSchedule"
    alone = build_pipeline_dag(PIPELINES["bell_only"])
    assert type(alone.timetable).__name__ == "AssetTriggeredTimetable"
    assert type(build_pipeline_dag(PIPELINES["plain"]).timetable).__name__ == "CronDataIntervalTimetable"
    assert beside.max_active_runs == 1  # one run at a time, whatever starts it


def test_the_doorbell_asset_watches_with_the_pipelines_trigger():
    asset = doorbell_asset(PIPELINES["bell"])
    assert asset.name == "kafka_ledger.doorbell.bell" and asset.uri == "kafka-ledger://doorbell/bell"
    (watcher,) = asset.watchers
    assert watcher.trigger.serialize()[1] == {"pipeline": "bell", "min_backlog": 100, "poll_seconds": 2.0,
                                              "ring_again_seconds": 300.0}
    assert doorbell_asset(PIPELINES["plain"]) is None
