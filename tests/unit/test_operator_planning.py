"""Planning rules of operator actions: latest_only skips, rewrite checks, time windows, coverage, resets."""

import random

import pytest

from kafka_ledger.model.ranges import (
    Coverage,
    OffsetRange,
    PartitionOffsets,
    PlanError,
    PositionChange,
    TopicPartition,
    check_rewrite_ranges,
    cover_with_read,
    coverage_problems,
    plan_latest_ranges,
    plan_reset,
    truncate_coverage,
    window_ranges,
)

A0 = TopicPartition("a", 0)
A1 = TopicPartition("a", 1)
OFFSETS = {A0: PartitionOffsets(log_start=10, end=1000), A1: PartitionOffsets(log_start=0, end=50)}


# --- latest_only ---------------------------------------------------------------------------------------------


def test_latest_only_reads_the_newest_cap_offsets_and_marks_the_rest_skipped():
    ranges = plan_latest_ranges({A0: 100, A1: 20}, OFFSETS, max_records_per_partition=200)
    assert ranges == [OffsetRange("a", 0, 800, 1000, skipped_from=100), OffsetRange("a", 1, 20, 50)]
    assert ranges[0].start == 100 and ranges[1].start == 20


def test_latest_only_still_refuses_lost_data():
    with pytest.raises(PlanError):
        plan_latest_ranges({A0: 5}, OFFSETS, max_records_per_partition=10)


def test_skipped_start_must_lie_before_the_range():
    with pytest.raises(ValueError):
        OffsetRange("a", 0, 10, 20, skipped_from=10)


# --- rewrite checks ------------------------------------------------------------------------------------------


def test_rewrite_behind_the_position_is_accepted():
    assert check_rewrite_ranges([OffsetRange("a", 0, 10, 500)], OFFSETS, {A0: 500}, {}) == []


@pytest.mark.parametrize(
    "requested, expected",
    [
        (OffsetRange("z", 0, 10, 20), "z-0 is not a partition of the pipeline's subscription"),
        (OffsetRange("a", 7, 10, 20), "a-7 is not a partition"),
        (OffsetRange("a", 0, 5, 20), "starts below the log start offset 10"),
        (OffsetRange("a", 0, 900, 1001), "ends beyond the high watermark 1000"),
        (OffsetRange("a", 0, 400, 600), "reaches past the committed position 500"),
        (OffsetRange("a", 0, 20, 20), "is empty"),
        (OffsetRange("a", 1, 0, 10), "a-1 has never been read by the pipeline"),
    ],
)
def test_rewrite_refusals_say_why(requested, expected):
    problems = check_rewrite_ranges([requested], OFFSETS, {A0: 500}, {})
    assert any(expected in p for p in problems), problems


def test_rewrite_overlapping_an_in_flight_batch_is_refused_including_its_skipped_part():
    in_flight = {7: [OffsetRange("a", 0, 300, 400, skipped_from=200)]}
    problems = check_rewrite_ranges([OffsetRange("a", 0, 150, 250)], OFFSETS, {A0: 500}, in_flight)
    assert problems == ["a-0 [150, 250) overlaps a-0 [300, 400) of batch 7, which is still in flight"]
    assert check_rewrite_ranges([OffsetRange("a", 0, 100, 200)], OFFSETS, {A0: 500}, in_flight) == []


def test_a_partition_requested_twice_is_refused():
    ranges = [OffsetRange("a", 0, 10, 20), OffsetRange("a", 0, 30, 40)]
    assert "a-0 is requested more than once" in check_rewrite_ranges(ranges, OFFSETS, {A0: 500}, {})


# --- time windows --------------------------------------------------------------------------------------------


def test_window_splits_at_the_position_and_none_means_the_end():
    behind, pending = window_ranges({A0: 100, A1: 40}, {A0: None, A1: 45}, OFFSETS, {A0: 600, A1: 50})
    assert behind == [OffsetRange("a", 0, 100, 600), OffsetRange("a", 1, 40, 45)]
    assert pending == [OffsetRange("a", 0, 600, 1000)]


def test_window_after_all_data_or_empty_is_nothing():
    assert window_ranges({A0: None}, {A0: None}, {A0: OFFSETS[A0]}, {A0: 1000}) == ([], [])
    assert window_ranges({A0: 30}, {A0: 30}, {A0: OFFSETS[A0]}, {A0: 1000}) == ([], [])


def test_window_of_a_partition_never_read_is_all_pending():
    assert window_ranges({A1: 0}, {A1: 10}, {A1: OFFSETS[A1]}, {}) == ([], [OffsetRange("a", 1, 0, 10)])


def test_consecutive_windows_tile_without_gap_or_overlap():
    # The end bound of one hour is the start bound of the next: the offsets tile whatever the timestamps.
    bounds = [10, 10, 250, 600, None]
    positions = {A0: 1000}
    pieces = []
    for lo, hi in zip(bounds, bounds[1:], strict=False):
        behind, pending = window_ranges({A0: lo}, {A0: hi}, {A0: OFFSETS[A0]}, positions)
        assert pending == []
        pieces += [(r.from_offset, r.until_offset) for r in behind]
    assert pieces == [(10, 250), (250, 600), (600, 1000)]


# --- coverage ------------------------------------------------------------------------------------------------


def covered(cov: list[Coverage]) -> list[tuple[int, int, str]]:
    return sorted((c.from_offset, c.until_offset, c.disposition) for c in cov)


def apply(existing: list[Coverage], change: tuple[list[Coverage], list[Coverage]]) -> list[Coverage]:
    removed, added = change
    return [c for c in existing if c not in removed] + added


def attributed(cov: list[Coverage]) -> list[tuple[int, int, str, int | None]]:
    return sorted((c.from_offset, c.until_offset, c.disposition, c.batch_id) for c in cov)


def test_rewrite_takes_over_the_read_offsets_it_replaced():
    # Coverage says which batch published an offset's row last: the rewrite, inside its range.
    existing = [Coverage(0, 100, "read", 1), Coverage(100, 200, "read", 2)]
    result = apply(existing, cover_with_read(existing, 50, 150, batch_id=9))
    assert attributed(result) == [(0, 50, "read", 1), (50, 150, "read", 9), (150, 200, "read", 2)]


def test_rewrite_turns_skipped_offsets_into_read_and_splits_the_rest():
    existing = [Coverage(0, 100, "read", 1), Coverage(100, 400, "skipped", 2)]
    result = apply(existing, cover_with_read(existing, 50, 250, batch_id=9))
    assert attributed(result) == [(0, 50, "read", 1), (50, 250, "read", 9), (250, 400, "skipped", 2)]


def test_rewrite_of_exactly_one_stretch_replaces_it():
    existing = [Coverage(0, 100, "read", 1)]
    assert apply(existing, cover_with_read(existing, 0, 100, batch_id=9)) == [Coverage(0, 100, "read", 9)]


def test_rewrite_of_history_before_the_start_adds_read_coverage():
    existing = [Coverage(500, 600, "read", 1)]
    result = apply(existing, cover_with_read(existing, 300, 550, batch_id=9))
    assert attributed(result) == [(300, 550, "read", 9), (550, 600, "read", 1)]


def test_truncate_uncommits_everything_from_the_new_position():
    existing = [Coverage(0, 100, "read", 1), Coverage(100, 200, "skipped", None, 3), Coverage(200, 300, "read", 2)]
    result = apply(existing, truncate_coverage(existing, 150))
    assert covered(result) == [(0, 100, "read"), (100, 150, "skipped")]


def test_coverage_problems_find_gaps_overlaps_and_ranges_past_the_position():
    tp = A0
    assert coverage_problems(tp, [Coverage(0, 100, "read", 1), Coverage(100, 150, "skipped", 2)], 0, 150) == []
    assert coverage_problems(tp, [], 70, 70) == []
    assert coverage_problems(tp, [Coverage(0, 100, "read", 1)], 0, 120) == [
        "a-0: gap [100, 120) before the position (nothing committed there)"
    ]
    assert coverage_problems(tp, [Coverage(0, 50, "read", 1), Coverage(60, 100, "read", 2)], 0, 100) == [
        "a-0: gap [50, 60) between committed ranges"
    ]
    assert "overlap" in coverage_problems(tp, [Coverage(0, 60, "read", 1), Coverage(50, 100, "read", 2)], 0, 100)[0]
    assert "reaches past the position 80" in coverage_problems(tp, [Coverage(0, 100, "read", 1)], 0, 80)[0]
    # History backfilled before the start is allowed.
    assert coverage_problems(tp, [Coverage(0, 30, "read", 9), Coverage(50, 80, "read", 1)], 50, 80) == []


def test_random_rewrites_keep_coverage_tiled_and_non_overlapping():
    rng = random.Random(7)
    for _ in range(200):
        existing = [Coverage(100, 200, "read", 1), Coverage(200, 350, "skipped", 2), Coverage(350, 400, "read", 3)]
        for batch_id in range(10, 15):
            lo = rng.randrange(0, 399)
            hi = rng.randrange(lo + 1, 401)
            existing = apply(existing, cover_with_read(existing, lo, hi, batch_id))
        assert coverage_problems(A0, existing, 100, 400) == []
        spans = covered(existing)
        assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:], strict=False))


# --- resets --------------------------------------------------------------------------------------------------


def test_reset_describes_skipped_and_reread_offsets():
    changes = plan_reset({A0: 500, A1: 20}, {A0: 800, A1: 0}, OFFSETS)
    assert changes == [PositionChange("a", 0, 500, 800), PositionChange("a", 1, 20, 0)]
    assert changes[0].skipped == OffsetRange("a", 0, 500, 800) and changes[0].reread is None
    assert changes[1].reread == OffsetRange("a", 1, 0, 20) and changes[1].skipped is None


def test_reset_outside_the_log_is_refused():
    with pytest.raises(PlanError, match=r"a-0: offset 5 is outside \[10, 1000\]"):
        plan_reset({A0: 500}, {A0: 5}, OFFSETS)
    with pytest.raises(PlanError, match="not a partition"):
        plan_reset({}, {TopicPartition("q", 0): 1}, OFFSETS)


# --- on_data_loss: skip --------------------------------------------------------------------------------------


def test_skip_lost_starts_at_the_log_start_and_marks_the_lost_offsets_skipped():
    from kafka_ledger.model.ranges import plan_ranges

    assert plan_ranges({A0: 4, A1: 20}, OFFSETS, 100, skip_lost=True) == [
        OffsetRange("a", 0, 10, 110, skipped_from=4), OffsetRange("a", 1, 20, 50)]


def test_skip_lost_with_nothing_left_to_read_is_an_empty_range_that_still_moves_the_position():
    from kafka_ledger.model.ranges import plan_ranges

    gone = {A0: PartitionOffsets(log_start=30, end=30)}
    (r,) = plan_ranges({A0: 4}, gone, 100, skip_lost=True)
    assert (r.skipped_from, r.from_offset, r.until_offset, r.span) == (4, 30, 30, 0)


def test_skip_lost_with_latest_only_skips_from_the_old_position():
    assert plan_latest_ranges({A0: 4}, OFFSETS, 100, skip_lost=True) == [
        OffsetRange("a", 0, 900, 1000, skipped_from=4)]
