"""Retention headroom: the estimates, the threshold, and the lines that report them."""

from __future__ import annotations

from kafka_ledger.config.pipeline import parse_pipelines
from kafka_ledger.kafka.headroom import Headroom, Retention, assess, duration, headroom_text, warning
from kafka_ledger.model.ranges import PartitionOffsets, TopicPartition

TP = TopicPartition("t", 0)
HOUR = 3600 * 1000
NOW = 1_800_000_000_000
TWO_DAYS = Retention(ms=48 * HOUR, bytes=None, deletes=True)
PIPELINE = parse_pipelines("""
pipelines:
  p:
    topics: [t]
    output_table: p
    columns: [{name: id, type: string}]
""")["p"]


def headroom(position=100, log_start=40, end=500, retention=TWO_DAYS, oldest_unread_ms=None, rate=None):
    return assess(TP, position, PartitionOffsets(log_start, end), retention, oldest_unread_ms, rate, NOW, 0.25)


def test_time_left_is_the_oldest_unread_records_age_against_retention_ms():
    # The weekend case: 2 days' retention, the oldest unread record 40 hours old: 8 hours left, 17 %.
    h = headroom(oldest_unread_ms=NOW - 40 * HOUR)
    assert (h.offsets, h.unread, h.seconds, h.window_seconds, h.basis) == (60, 400, 8 * 3600, 48 * 3600, "retention.ms")
    assert h.low and round(h.fraction, 3) == 0.167
    fresh = headroom(oldest_unread_ms=NOW - 2 * HOUR)
    assert fresh.seconds == 46 * 3600 and not fresh.low


def test_log_start_movement_estimates_size_retention_and_the_smaller_estimate_wins():
    by_size = Retention(ms=None, bytes=1 << 30, deletes=True)
    # 60 offsets before the position, deleted at 0.01/s: 6,000 s; the log (460 offsets) lasts 46,000 s: 13 %.
    h = headroom(retention=by_size, rate=0.01)
    assert (h.seconds, h.window_seconds, h.basis, h.low) == (6000, 46000, "log start movement", True)
    both = headroom(oldest_unread_ms=NOW - 2 * HOUR, rate=0.01)
    assert both.basis == "log start movement" and both.seconds == 6000
    unknown = headroom(retention=by_size)
    assert unknown.seconds is None and not unknown.low and "not been seen moving" in unknown.basis


def test_no_deadline_without_unread_data_limit_or_deleting_policy():
    assert headroom(position=500).basis == "nothing unread"
    assert headroom(retention=Retention(None, None, True)).basis == "no retention limit"
    compacted = headroom(retention=Retention(10, None, False), oldest_unread_ms=0)
    assert compacted.seconds is None and not compacted.low and compacted.basis.startswith("compacted only")


def test_offsets_already_deleted_unread_are_lost_not_low_the_loss_is_on_data_loss_s():
    h = headroom(position=10, log_start=40)
    assert (h.lost, h.low, h.seconds) == (30, False, None)
    assert "retention deleted 30 offsets never read" in h.describe()
    assert warning(PIPELINE, [h]) is None


def test_an_overdue_deadline_is_zero_not_negative():
    assert headroom(oldest_unread_ms=NOW - 50 * HOUR).seconds == 0.0


def test_retention_from_topic_configuration():
    assert Retention.from_config({"retention.ms": "604800000", "retention.bytes": "-1",
                                  "cleanup.policy": "delete"}) == Retention(604800000, None, True)
    assert Retention.from_config({"retention.ms": "-1", "cleanup.policy": "compact"}) == Retention(None, None, False)
    assert Retention.from_config({"cleanup.policy": "compact,delete"}).deletes


def test_reports_name_the_low_partitions_and_the_threshold():
    low = headroom(oldest_unread_ms=NOW - 40 * HOUR)
    ok = Headroom("t", 1, 0, 5, 0, 40 * 3600, 48 * 3600, "retention.ms", 0, False)
    assert warning(PIPELINE, [ok]) is None
    message = warning(PIPELINE, [ok, low])
    assert message.startswith("RETENTION HEADROOM LOW for p: 1 partition(s) under 25% of their retention window")
    assert "t-0: 60 offsets and at the earliest 8h 0m (17% of 2d 0h) before retention may delete offset 100" in message
    assert "on_data_loss (fail)" in message
    assert headroom_text(low.as_dict()) == "60 offsets, 8h 0m (17%)"
    assert headroom_text(headroom(position=500).as_dict()) == "nothing unread"
    assert headroom_text(None) == "-"


def test_durations_read_as_people_say_them():
    assert [duration(s) for s in (0, 45, 725, 11520, 187200)] == ["0s", "45s", "12m 5s", "3h 12m", "2d 4h"]
