"""Batch planning rules: offset ranges, start positions, capped plans, data-loss detection and read coverage."""

import random

import pytest

from kafka_ledger.model.ranges import (
    LostDataError,
    OffsetRange,
    PartitionOffsets,
    PartitionReadStats,
    PlanError,
    TopicPartition,
    backlog,
    check_read_coverage,
    join_consecutive,
    partition_lag,
    plan_ranges,
    start_positions,
)

A0 = TopicPartition("a", 0)
A1 = TopicPartition("a", 1)
B0 = TopicPartition("b", 0)


def stats(topic: str, partition: int, offsets: list[int]) -> PartitionReadStats:
    """Read stats as the ledger would summarise staged rows holding exactly `offsets`."""
    return PartitionReadStats(
        topic=topic,
        partition=partition,
        records=len(offsets),
        distinct_offsets=len(set(offsets)),
        min_offset=min(offsets) if offsets else None,
        max_offset=max(offsets) if offsets else None,
    )


# --- OffsetRange -----------------------------------------------------------------------------------------------


def test_offset_range_span_and_str():
    r = OffsetRange("a", 3, 10, 25)
    assert r.span == 15
    assert r.topic_partition == TopicPartition("a", 3)
    assert str(r) == "a-3 [10, 25)"


def test_offset_range_empty_is_allowed_with_span_zero():
    assert OffsetRange("a", 0, 7, 7).span == 0
    assert OffsetRange("a", 0, 0, 0).span == 0


@pytest.mark.parametrize(("from_offset", "until_offset"), [(-1, 5), (-1, -1), (5, 4), (1, 0)])
def test_offset_range_negative_or_reversed_raises_value_error(from_offset, until_offset):
    with pytest.raises(ValueError, match="invalid offset range"):
        OffsetRange("a", 0, from_offset, until_offset)


def test_offset_ranges_sort_by_topic_partition_then_offsets():
    ranges = [
        OffsetRange("b", 0, 0, 1),
        OffsetRange("a", 1, 0, 1),
        OffsetRange("a", 0, 5, 6),
        OffsetRange("a", 0, 0, 1),
    ]
    assert sorted(ranges) == [
        OffsetRange("a", 0, 0, 1),
        OffsetRange("a", 0, 5, 6),
        OffsetRange("a", 1, 0, 1),
        OffsetRange("b", 0, 0, 1),
    ]


# --- start_positions -------------------------------------------------------------------------------------------


def test_start_positions_earliest_uses_log_start():
    offsets = {A0: PartitionOffsets(log_start=3, end=10), A1: PartitionOffsets(log_start=0, end=4)}
    assert start_positions([A0, A1], offsets, "earliest") == {A0: 3, A1: 0}


def test_start_positions_latest_uses_end_offset():
    offsets = {A0: PartitionOffsets(log_start=3, end=10), A1: PartitionOffsets(log_start=0, end=4)}
    assert start_positions([A0, A1], offsets, "latest") == {A0: 10, A1: 4}


def test_start_positions_only_for_the_given_partitions():
    offsets = {A0: PartitionOffsets(0, 10), A1: PartitionOffsets(0, 4)}
    assert start_positions([A1], offsets, "earliest") == {A1: 0}
    assert start_positions([], offsets, "latest") == {}


# --- plan_ranges -----------------------------------------------------------------------------------------------


def test_plan_ranges_caps_each_partition_at_position_plus_cap():
    offsets = {A0: PartitionOffsets(0, 1000), A1: PartitionOffsets(0, 1000)}
    assert plan_ranges({A0: 0, A1: 500}, offsets, 100) == [OffsetRange("a", 0, 0, 100), OffsetRange("a", 1, 500, 600)]


def test_plan_ranges_stops_at_end_offset_when_below_cap():
    offsets = {A0: PartitionOffsets(0, 50), A1: PartitionOffsets(0, 1000)}
    assert plan_ranges({A0: 20, A1: 950}, offsets, 100) == [OffsetRange("a", 0, 20, 50), OffsetRange("a", 1, 950, 1000)]


def test_plan_ranges_cap_exactly_reaching_end():
    offsets = {A0: PartitionOffsets(0, 100)}
    assert plan_ranges({A0: 0}, offsets, 100) == [OffsetRange("a", 0, 0, 100)]


def test_plan_ranges_cap_of_one():
    offsets = {A0: PartitionOffsets(0, 100)}
    assert plan_ranges({A0: 42}, offsets, 1) == [OffsetRange("a", 0, 42, 43)]


def test_plan_ranges_skips_caught_up_partitions():
    offsets = {A0: PartitionOffsets(0, 10), A1: PartitionOffsets(0, 20), B0: PartitionOffsets(5, 5)}
    assert plan_ranges({A0: 10, A1: 15, B0: 5}, offsets, 100) == [OffsetRange("a", 1, 15, 20)]


def test_plan_ranges_nothing_to_read_gives_empty_plan():
    offsets = {A0: PartitionOffsets(0, 10), B0: PartitionOffsets(0, 0)}
    assert plan_ranges({A0: 10, B0: 0}, offsets, 100) == []
    assert plan_ranges({}, offsets, 100) == []


def test_plan_ranges_output_is_sorted_by_topic_and_partition():
    tps = [TopicPartition("z", 2), TopicPartition("a", 10), TopicPartition("z", 0), TopicPartition("a", 2)]
    offsets = {tp: PartitionOffsets(0, 10) for tp in tps}
    positions = {tp: 0 for tp in tps}  # inserted in unsorted order
    assert plan_ranges(positions, offsets, 5) == [
        OffsetRange("a", 2, 0, 5),
        OffsetRange("a", 10, 0, 5),
        OffsetRange("z", 0, 0, 5),
        OffsetRange("z", 2, 0, 5),
    ]


def test_plan_ranges_reads_only_positioned_partitions():
    offsets = {A0: PartitionOffsets(0, 10), A1: PartitionOffsets(0, 10)}
    assert plan_ranges({A0: 0}, offsets, 100) == [OffsetRange("a", 0, 0, 10)]


def test_plan_ranges_includes_new_partitions_given_start_positions():
    offsets = {A0: PartitionOffsets(0, 100), A1: PartitionOffsets(30, 80), B0: PartitionOffsets(0, 60)}
    positions = {A0: 90}
    positions.update(start_positions([A1], offsets, "earliest"))
    positions.update(start_positions([B0], offsets, "latest"))
    assert plan_ranges(positions, offsets, 25) == [OffsetRange("a", 0, 90, 100), OffsetRange("a", 1, 30, 55)]


def test_plan_ranges_position_equal_to_log_start_is_not_lost():
    offsets = {A0: PartitionOffsets(log_start=50, end=60)}
    assert plan_ranges({A0: 50}, offsets, 100) == [OffsetRange("a", 0, 50, 60)]


def test_plan_ranges_position_below_log_start_raises_lost_data_error_for_every_lost_partition():
    offsets = {
        A0: PartitionOffsets(log_start=100, end=200),
        A1: PartitionOffsets(log_start=0, end=200),
        B0: PartitionOffsets(log_start=75, end=80),
    }
    with pytest.raises(LostDataError) as exc_info:
        plan_ranges({B0: 10, A1: 0, A0: 40}, offsets, 1000)
    err = exc_info.value
    assert err.lost == [OffsetRange("a", 0, 40, 100), OffsetRange("b", 0, 10, 75)]
    message = str(err)
    assert "2 partition(s)" in message
    assert "a-0 [40, 100)" in message
    assert "b-0 [10, 75)" in message
    assert "a-1" not in message


def test_lost_data_error_is_a_plan_error():
    with pytest.raises(PlanError):
        plan_ranges({A0: 0}, {A0: PartitionOffsets(1, 5)}, 10)


def test_plan_ranges_position_past_end_raises_plan_error():
    offsets = {A0: PartitionOffsets(0, 10), A1: PartitionOffsets(0, 10)}
    with pytest.raises(PlanError, match=r"a-1 position 11 > end offset 10") as exc_info:
        plan_ranges({A0: 5, A1: 11}, offsets, 100)
    assert not isinstance(exc_info.value, LostDataError)
    assert "a-0" not in str(exc_info.value)


def test_plan_ranges_positioned_partition_missing_from_kafka_raises_plan_error():
    offsets = {A0: PartitionOffsets(0, 10)}
    with pytest.raises(PlanError, match="no longer exist in Kafka") as exc_info:
        plan_ranges({A0: 0, B0: 3, A1: 0}, offsets, 100)
    assert not isinstance(exc_info.value, LostDataError)
    assert str(exc_info.value).endswith("a-1, b-0")


@pytest.mark.parametrize("cap", [0, -1, -100])
def test_plan_ranges_cap_below_one_raises_value_error(cap):
    with pytest.raises(ValueError, match="at least 1"):
        plan_ranges({A0: 0}, {A0: PartitionOffsets(0, 10)}, cap)


# --- draining a backlog -----------------------------------------------------------------------------------------


def drain(
    positions: dict[TopicPartition, int], offsets: dict[TopicPartition, PartitionOffsets], cap: int
) -> list[list[OffsetRange]]:
    """Plan and 'commit' batches until nothing is left; return the batches."""
    positions = dict(positions)
    batches = []
    for _ in range(10_000):
        ranges = plan_ranges(positions, offsets, cap)
        if not ranges:
            return batches
        batches.append(ranges)
        for r in ranges:
            assert positions[r.topic_partition] == r.from_offset
            positions[r.topic_partition] = r.until_offset
    raise AssertionError("backlog never drained")


def assert_exact_cover(batches, starts, offsets, cap):
    """Every partition's ranges are contiguous from its start to its end: no gap, no overlap, none above cap."""
    by_tp: dict[TopicPartition, list[OffsetRange]] = {}
    for ranges in batches:
        assert ranges == sorted(ranges)
        assert len({r.topic_partition for r in ranges}) == len(ranges), "a partition twice in one batch"
        for r in ranges:
            assert 1 <= r.span <= cap
            by_tp.setdefault(r.topic_partition, []).append(r)
    for tp, start in starts.items():
        expected_next = start
        for r in by_tp.get(tp, []):
            assert r.from_offset == expected_next
            expected_next = r.until_offset
        assert expected_next == offsets[tp].end
    assert set(by_tp) <= set(starts)


def test_successive_capped_plans_drain_a_backlog_exactly():
    offsets = {A0: PartitionOffsets(0, 1050), A1: PartitionOffsets(200, 205), B0: PartitionOffsets(0, 0)}
    starts = {A0: 0, A1: 200, B0: 0}
    batches = drain(starts, offsets, 100)
    assert len(batches) == 11
    assert batches[0] == [OffsetRange("a", 0, 0, 100), OffsetRange("a", 1, 200, 205)]
    assert batches[1] == [OffsetRange("a", 0, 100, 200)]
    assert batches[-1] == [OffsetRange("a", 0, 1000, 1050)]
    assert_exact_cover(batches, starts, offsets, 100)


def test_drained_positions_plan_nothing_and_backlog_is_zero():
    offsets = {A0: PartitionOffsets(0, 30)}
    batches = drain({A0: 0}, offsets, 7)
    assert [r.span for (r,) in batches] == [7, 7, 7, 7, 2]
    assert plan_ranges({A0: 30}, offsets, 7) == []
    assert backlog({A0: 30}, offsets) == 0


def test_random_capped_plans_drain_exactly():
    rng = random.Random(20240611)
    for _ in range(300):
        offsets = {}
        starts = {}
        for t in ("t1", "t2", "t3")[: rng.randint(1, 3)]:
            for p in range(rng.randint(1, 4)):
                tp = TopicPartition(t, p)
                log_start = rng.choice([0, rng.randint(0, 500)])
                end = log_start + rng.choice([0, 1, rng.randint(0, 2000)])
                offsets[tp] = PartitionOffsets(log_start, end)
                starts[tp] = rng.randint(log_start, end)
        cap = rng.choice([1, 2, 3, rng.randint(1, 50), rng.randint(1, 5000)])
        if cap == 1:
            # keep the number of batches small for a cap of 1
            offsets = {tp: PartitionOffsets(o.log_start, min(o.end, o.log_start + 40)) for tp, o in offsets.items()}
            starts = {tp: min(s, offsets[tp].end) for tp, s in starts.items()}
        total = backlog(starts, offsets)
        batches = drain(starts, offsets, cap)
        assert_exact_cover(batches, starts, offsets, cap)
        assert sum(r.span for ranges in batches for r in ranges) == total
        longest = max((o.end - starts[tp] for tp, o in offsets.items()), default=0)
        assert len(batches) == -(-longest // cap)


# --- backlog ------------------------------------------------------------------------------------------------------


def test_backlog_sums_offsets_between_positions_and_end():
    offsets = {A0: PartitionOffsets(0, 100), A1: PartitionOffsets(50, 60), B0: PartitionOffsets(0, 5)}
    assert backlog({A0: 40, A1: 50, B0: 5}, offsets) == 60 + 10 + 0


def test_backlog_ignores_partitions_missing_from_kafka_and_positions_past_end():
    offsets = {A0: PartitionOffsets(0, 100), A1: PartitionOffsets(0, 10)}
    assert backlog({A0: 90, A1: 12, B0: 0}, offsets) == 10


def test_backlog_of_no_positions_is_zero():
    assert backlog({}, {A0: PartitionOffsets(0, 100)}) == 0


# --- check_read_coverage ----------------------------------------------------------------------------------------

RANGES = [OffsetRange("a", 0, 100, 110), OffsetRange("a", 1, 0, 5)]


def test_coverage_complete_read_has_no_problems():
    read = [stats("a", 0, list(range(100, 110))), stats("a", 1, list(range(5)))]
    assert check_read_coverage(RANGES, read) == []


def test_coverage_allows_gaps_and_partitions_with_no_records():
    # transaction markers / aborted / compacted records: fewer records than offsets, or none at all
    read = [stats("a", 0, [100, 103, 109])]
    assert check_read_coverage(RANGES, read) == []
    assert check_read_coverage(RANGES, [stats("a", 0, []), stats("a", 1, [])]) == []
    assert check_read_coverage(RANGES, []) == []


def test_coverage_reports_offsets_read_twice():
    read = [stats("a", 0, [100, 101, 101, 102, 102])]
    assert check_read_coverage(RANGES, read) == ["a-0 [100, 110): 2 offsets read more than once"]


def test_coverage_reports_offsets_before_the_range():
    read = [stats("a", 0, [99, 100, 101])]
    assert check_read_coverage(RANGES, read) == ["a-0 [100, 110): offset 99 read, before the range"]


def test_coverage_reports_offsets_past_the_range_end_is_exclusive():
    read = [stats("a", 0, [108, 109, 110])]
    assert check_read_coverage(RANGES, read) == ["a-0 [100, 110): offset 110 read, past the range"]


def test_coverage_reports_unplanned_partition():
    read = [stats("a", 2, [0, 1, 2]), stats("b", 0, [7])]
    assert check_read_coverage(RANGES, read) == [
        "a-2: 3 records read from a partition outside the batch",
        "b-0: 1 records read from a partition outside the batch",
    ]


def test_coverage_reports_more_records_than_offsets_in_range():
    read = [stats("a", 1, [0, 1, 2, 3, 4, 4])]
    assert check_read_coverage(RANGES, read) == [
        "a-1 [0, 5): 6 records read, more than the 5 offsets in the range",
        "a-1 [0, 5): 1 offsets read more than once",
    ]


def test_coverage_reports_every_problem_of_every_partition():
    read = [stats("a", 0, [90, 95, 95, 120]), stats("a", 1, [2]), stats("c", 3, [])]
    assert check_read_coverage(RANGES, read) == [
        "a-0 [100, 110): 1 offsets read more than once",
        "a-0 [100, 110): offset 90 read, before the range",
        "a-0 [100, 110): offset 120 read, past the range",
        "c-3: 0 records read from a partition outside the batch",
    ]


def test_coverage_of_empty_plan_rejects_any_read():
    assert check_read_coverage([], [stats("a", 0, [1])]) == ["a-0: 1 records read from a partition outside the batch"]
    assert check_read_coverage([], []) == []


def test_partition_lag_counts_unseen_partitions_from_where_the_pipeline_would_start_them():
    offsets = {A0: PartitionOffsets(10, 100), A1: PartitionOffsets(3, 40), B0: PartitionOffsets(0, 0)}
    # A0 read to 90; A1 never read; B0 empty.
    assert partition_lag({A0: 90}, offsets, "earliest") == {A0: 10, A1: 37, B0: 0}
    assert partition_lag({A0: 90}, offsets, "latest") == {A0: 10, A1: 0, B0: 0}
    # A position past the end (a truncated topic) is no negative lag; a partition gone from Kafka has none.
    assert partition_lag({A0: 120, TopicPartition("gone", 0): 5}, offsets, "latest") == {A0: 0, A1: 0, B0: 0}
    assert backlog({A0: 90, A1: 3}, offsets) == sum(partition_lag({A0: 90, A1: 3}, offsets, "earliest").values())


def test_unread_positions_are_those_inside_kafkas_log():
    from kafka_ledger.model.ranges import unread_positions

    offsets = {A0: PartitionOffsets(10, 100), A1: PartitionOffsets(3, 40), B0: PartitionOffsets(0, 0)}
    # A0 waits at 90; A1 is read to its end; B0 is empty; a position before the log start has nothing there to wait;
    # a partition gone from Kafka has no record.
    assert unread_positions({A0: 90, A1: 40, B0: 0, TopicPartition("gone", 0): 5}, offsets) == {A0: 90}
    assert unread_positions({A0: 5}, offsets) == {}


def test_topic_identity_anchors_new_topics_and_names_changed_ones():
    from kafka_ledger.model.ranges import TopicIdentityError, topic_identity

    unseen, changed = topic_identity({"a": "id-a", "b": "id-b"}, {"a": "id-a", "b": "id-b2", "c": "id-c"})
    assert unseen == {"c": "id-c"} and changed == {"b": ("id-b", "id-b2")}
    assert topic_identity({"a": "id-a"}, {"a": "id-a"}) == ({}, {})
    # A topic no longer subscribed keeps its anchor and is no one's concern here.
    assert topic_identity({"gone": "id-g"}, {}) == ({}, {})
    message = str(TopicIdentityError("p", changed))
    assert "topic b: the ledger's positions refer to topic id id-b, Kafka's b has id id-b2" in message
    assert "Nothing was planned" in message and "kafka-ledger reset p --to-earliest" in message


def test_identity_changes_name_a_recreated_or_deleted_topic_of_a_planned_batch():
    from kafka_ledger.model.ranges import TopicIdentityError, identity_changes

    planned = {"a": "id-a", "b": "id-b", "c": "id-c", "old": None}
    changed = identity_changes(planned, {"a": "id-a", "b": "id-b2", "old": "id-o"})
    # b was recreated, c deleted; a batch planned before ids were recorded is not compared.
    assert changed == {"b": ("id-b", "id-b2"), "c": ("id-c", None)}
    message = str(TopicIdentityError("p", changed, outcome="Batch 7 read from it: nothing was published."))
    assert "Kafka's b has id id-b2" in message and "Kafka has no topic c now" in message
    assert "Batch 7 read from it: nothing was published." in message and "Nothing was planned" not in message


def test_earlier_incarnations_find_ranges_read_from_another_topic_id():
    from kafka_ledger.model.ranges import earlier_incarnations

    read = [
        (OffsetRange("a", 0, 0, 100), "id-a1"),  # read before the topic was recreated
        (OffsetRange("a", 0, 100, 300), "id-a2"),  # replayed or read since
        (OffsetRange("a", 1, 0, 40), "id-a1"),
        (OffsetRange("b", 0, 0, 50), None),  # committed before ids were recorded
        (OffsetRange("gone", 0, 0, 5), "id-g"),  # Kafka has no such topic now: not comparable
    ]
    earlier, unrecorded = earlier_incarnations(read, {"a": "id-a2", "b": "id-b"})
    assert earlier == {"a": ({"id-a1"}, [OffsetRange("a", 0, 0, 100), OffsetRange("a", 1, 0, 40)])}
    assert unrecorded == 50
    assert earlier_incarnations(read[1:2], {"a": "id-a2"}) == ({}, 0)


def test_consecutive_batches_join_into_one_range_per_partition():
    first = [OffsetRange("t", 0, 0, 10), OffsetRange("t", 1, 5, 8)]
    second = [OffsetRange("t", 0, 10, 25)]  # partition 1 had nothing new
    third = [OffsetRange("t", 1, 8, 9), OffsetRange("u", 0, 0, 4)]
    joined, problems = join_consecutive([first, second, third])
    assert problems == []
    assert joined == [OffsetRange("t", 0, 0, 25), OffsetRange("t", 1, 5, 9), OffsetRange("u", 0, 0, 4)]


def test_batches_that_do_not_follow_one_another_are_not_joined():
    # Offsets skipped on purpose between them (latest_only), or read by a batch in between.
    joined, problems = join_consecutive([[OffsetRange("t", 0, 0, 10)], [OffsetRange("t", 0, 12, 20, skipped_from=10)]])
    assert problems == ["t-0: [12, 20) does not follow t-0 [0, 10)"]
