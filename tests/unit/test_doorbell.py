"""The doorbell: when it rings, how it is declared, and how a pipeline's DAG is scheduled on it."""

from __future__ import annotations

import asyncio

import pytest

from kafka_ledger.airflow import doorbell
from kafka_ledger.airflow.dags import build_pipeline_dag, declared_dags, doorbell_asset
from kafka_ledger.airflow.doorbell import CarrierDoorbellTrigger, DoorbellTrigger, Look, Lookout, RingRule
from kafka_ledger.config.pipeline import ConfigError, DoorbellSpec, carriers_of, parse_pipelines
from kafka_ledger.model.ranges import PlanError, TopicPartition

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
    event = look.event({"pipeline": "bell"})
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


class AnsweringLookout(Lookout):
    """A lookout whose look-up of all the pipelines asked at once answers from `answers` (the gathering alone)."""

    def __init__(self, answers):
        super().__init__(services=None)
        self.answers, self.asked = answers, []

    def look_all(self, pipelines, now):
        self.asked.append(sorted(p.name for p in pipelines))
        if isinstance(self.answers, Exception):
            raise self.answers
        return {p.name: self.answers[p.name] for p in pipelines}


def test_doorbells_that_poll_at_once_share_one_look_up_and_each_hears_its_own_answer():
    missing = PlanError("topic(s) not found in Kafka: t")
    lookout = AnsweringLookout({"bell": Look(progress=3, lag={A: 5}), "bell_only": Look(progress=None, lag={A: 0}),
                                "plain": missing})

    async def polls():
        return await asyncio.gather(*(lookout.look(PIPELINES[name]) for name in ("bell", "bell_only", "plain", "bell")),
                                    return_exceptions=True)

    bell, bell_only, plain, bell_again = asyncio.run(polls())
    assert lookout.asked == [["bell", "bell_only", "plain"]]  # one look-up; a pipeline asked twice, once in it
    assert (bell.backlog, bell_only.backlog, bell_again.backlog) == (5, 0, 5)
    assert plain is missing


def test_when_the_look_up_fails_every_doorbell_that_asked_hears_why_and_the_next_poll_looks_again():
    lookout = AnsweringLookout(ConnectionError("the ledger does not answer"))

    async def polls():
        first = await asyncio.gather(*(lookout.look(PIPELINES[n]) for n in ("bell", "plain")), return_exceptions=True)
        lookout.answers = {"bell": Look(progress=1, lag={})}
        return first, await lookout.look(PIPELINES["bell"])

    first, again = asyncio.run(polls())
    assert [str(e) for e in first] == ["the ledger does not answer"] * 2
    assert again.progress == 1 and lookout.asked == [["bell", "plain"], ["bell"]]


CARRIED = parse_pipelines(
    """
pipelines:
  small_a:
    topics: [a]
    output_table: small_a
    spark_runtime: connect
    trigger: {type: doorbell, carrier: small, min_backlog: 10, poll_seconds: 2, carry_seconds: 60}
    columns: [{name: id, type: string}]
  small_b:
    topics: [b]
    output_table: small_b
    schedule: null
    trigger: {type: doorbell, carrier: small, poll_seconds: 5, ring_again_seconds: 30}
    columns: [{name: id, type: string}]
  alone:
    topics: [c]
    output_table: alone
    trigger: doorbell
    columns: [{name: id, type: string}]
"""
)


def test_a_carrier_gathers_the_pipelines_naming_it_and_paces_by_the_most_eager_and_most_patient():
    (carrier,) = carriers_of(CARRIED.values()).values()
    assert (carrier.name, [m.name for m in carrier.members]) == ("small", ["small_a", "small_b"])
    assert carrier.dag_id == "kafka_ledger_carrier__small"
    assert (carrier.poll_seconds, carrier.ring_again_seconds, carrier.carry_seconds) == (2.0, 30.0, 300.0)


def test_a_carriers_dag_rings_on_its_own_doorbell_and_its_members_dags_have_none():
    dags = declared_dags(CARRIED.values())
    assert sorted(dags) == ["kafka_ledger__alone", "kafka_ledger__small_a", "kafka_ledger__small_b",
                            "kafka_ledger_carrier__small"]
    carrier = dags["kafka_ledger_carrier__small"]
    assert [t.task_id for t in carrier.tasks] == ["carry_batches", "check_members"]
    assert type(carrier.timetable).__name__ == "AssetTriggeredTimetable" and carrier.max_active_runs == 1
    asset = carrier.timetable.asset_condition
    (watcher,) = asset.watchers
    assert watcher.trigger.serialize() == ("kafka_ledger.airflow.doorbell.CarrierDoorbellTrigger",
                                           {"carrier": "small", "poll_seconds": 2.0, "ring_again_seconds": 30.0})
    assert doorbell_asset(CARRIED["small_a"]) is None and doorbell_asset(CARRIED["alone"]) is not None
    # A member's own DAG keeps its schedule (small_b: none), for manual runs, replays and backfills.
    assert type(dags["kafka_ledger__small_a"].timetable).__name__ == "CronDataIntervalTimetable"
    assert type(dags["kafka_ledger__small_b"].timetable).__name__ == "NullTimetable"
    # A task's process builds the one DAG it runs.
    assert list(declared_dags(CARRIED.values(), "kafka_ledger_carrier__small")) == ["kafka_ledger_carrier__small"]


def test_a_carrier_rings_for_members_whose_own_backlog_is_enough_and_keeps_quiet_while_it_carries():
    a, b = CARRIED["small_a"], CARRIED["small_b"]
    # small_a waits for 10 offsets: its 4 do not count; small_b's 3 do (min_backlog 1).
    look = Look.of_members([a, b], [Look(1, {A: 4}), Look(2, {B: 3})])
    assert (look.backlog, look.progress, look.carrying) == (3, (1, 2), False)
    assert Look.of_members([a, b], [Look(1, {A: 4}), Look(None, {B: 0}, carrying=True)]).carrying
    # Two members reading one partition: their lags add up.
    assert Look.of_members([b, b], [Look(1, {B: 2}), Look(1, {B: 5})]).lag == {B: 7}


@pytest.mark.parametrize(("change", "refusal"), [
    ("spark_runtime: submit", "a carrier reads on the Spark Connect server"),
    ("sink: {type: iceberg, namespace: n, table: t}", "a carrier publishes into Postgres tables"),
])
def test_a_carrier_refuses_a_member_it_cannot_carry(change, refusal):
    declared = ("pipelines:\n  m:\n    topics: [a]\n    columns: [{name: id, type: string}]\n"
                "    trigger: {type: doorbell, carrier: small}\n    " + change + "\n")
    if "iceberg" not in change:
        declared += "    output_table: m\n"
    with pytest.raises(ConfigError, match=refusal):
        parse_pipelines(declared)


def test_a_carriers_doorbell_rings_for_the_members_it_sees_when_one_cannot_be_looked_at(monkeypatch):
    a, b = CARRIED["small_a"], CARRIED["small_b"]
    lookout = AnsweringLookout({"small_a": PlanError("topic(s) not found in Kafka: a"), "small_b": Look(1, {B: 3})})
    trigger = CarrierDoorbellTrigger("small", poll_seconds=0.05)
    monkeypatch.setattr(trigger, "watched_pipelines", lambda: ([a, b], None))
    monkeypatch.setattr(doorbell, "lookout_for", lambda services: lookout)

    async def first_event():
        async for event in trigger.run():
            return event

    event = asyncio.run(asyncio.wait_for(first_event(), 10))
    assert {k: v for k, v in event.payload.items() if k != "rung_at"} == {
        "carrier": "small", "backlog": 3, "partitions_waiting": 1}


def test_a_carriers_doorbell_looks_at_the_members_the_pipelines_file_names_now(monkeypatch):
    a = CARRIED["small_a"]
    lookout = AnsweringLookout({"small_a": Look(1, {A: 0}), "small_b": Look(1, {B: 3})})
    trigger = CarrierDoorbellTrigger("small", poll_seconds=0.05)
    monkeypatch.setattr(trigger, "watched_pipelines", lambda: ([a], None))  # small_b joined after the start
    monkeypatch.setattr(doorbell, "lookout_for", lambda services: lookout)
    monkeypatch.setattr(doorbell, "_declarations_now", lambda: parse_declarations(CARRIED))

    async def first_event():
        async for event in trigger.run():
            return event

    event = asyncio.run(asyncio.wait_for(first_event(), 10))
    assert event.payload["backlog"] == 3 and ["small_a", "small_b"] in lookout.asked


def parse_declarations(pipelines):
    from kafka_ledger.config.pipeline import PipelineDeclarations

    return PipelineDeclarations("pipelines.yaml", dict(pipelines), {})
