"""The streamed comparison behind `kafka-ledger verify`: span arithmetic, the merge of Kafka offsets with stored
rows, the examples kept, the per-partition Kafka read and the deadline."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import KafkaError

from kafka_ledger.model.ranges import PartitionOffsets, TopicPartition
from kafka_ledger.ops.readback import partition_record_offsets
from kafka_ledger.ops.verify import (
    OPEN_END,
    Tally,
    _kafka_spans,
    _Where,
    compare_partition,
    deadline_seconds,
    merge_spans,
    subtract_spans,
)

TP = TopicPartition("t", 0)


def compare(kafka, stored, read, position=None, log_start=0, compacted=False) -> Tally:
    tally = Tally()
    compare_partition(tally, TP, kafka, stored, _Where(read, position), log_start, compacted)
    return tally


def rows(*offsets: int, dead: tuple[int, ...] = ()) -> list[tuple[int, bool]]:
    return sorted([(o, False) for o in offsets] + [(o, True) for o in dead])


def test_merge_and_subtract_spans():
    assert merge_spans([(10, 20), (0, 5), (5, 7), (15, 30), (40, 40)]) == [(0, 7), (10, 30)]
    assert subtract_spans((0, OPEN_END), [(10, 20), (20, 30), (50, 60)]) == [(0, 10), (30, 50), (60, OPEN_END)]
    assert subtract_spans((0, 100), [(0, 100)]) == []
    assert subtract_spans((0, 100), []) == [(0, 100)]


def test_every_record_stored_once_is_exact():
    t = compare(kafka=[0, 1, 2, 4], stored=rows(0, 1, 4, dead=(2,)), read=[(0, 5)])
    assert (t.kafka_records, t.output_rows, t.dead_letters) == (4, 3, 1)
    assert (t.missing, t.duplicates, t.unexpected, t.outside, t.awaiting, t.compacted_away) == (0, 0, 0, 0, 0, 0)


def test_missing_duplicate_and_unexpected_rows_are_counted_with_examples():
    # 3 is missing, 1 is stored twice (row and dead letter), 5 has a row but no record (a gap in Kafka).
    t = compare(kafka=[0, 1, 2, 3, 4], stored=rows(0, 1, 2, 4, 5, dead=(1,)), read=[(0, 6)])
    assert (t.kafka_records, t.missing, t.duplicates, t.doubled, t.unexpected) == (5, 1, 1, 1, 1)
    assert t.examples == {"missing": [("t", 0, 3)], "doubled": [("t", 0, 1)], "unexpected": [("t", 0, 5)]}


def test_kafka_records_outside_the_read_ranges_are_not_expected():
    t = compare(kafka=[0, 1, 2, 3, 8, 9], stored=rows(2, 3), read=[(2, 4)])
    assert (t.kafka_records, t.missing) == (2, 0)


def test_rows_past_the_position_await_their_reread_and_others_are_outside():
    # Read [10, 20), position 20: row 5 lies before the pipeline began, rows 20 and 25 await a re-read.
    t = compare(kafka=[10, 11], stored=rows(5, 10, 11, 20, 25), read=[(10, 20)], position=20)
    assert (t.outside, t.awaiting, t.missing) == (1, 2, 0)
    assert t.examples == {"outside": [("t", 0, 5)]}
    # A partition the ledger never read: every row is outside.
    assert compare(kafka=[], stored=rows(1, 2), read=[], position=None).outside == 2


def test_rows_below_the_log_start_are_not_compared_and_compaction_is_a_warning():
    t = compare(kafka=[5, 7], stored=rows(1, 2, 5, 6, 7), read=[(0, 8)], log_start=5)
    assert (t.unexpected, t.compacted_away, t.kafka_records) == (1, 0, 2)
    c = compare(kafka=[5, 7], stored=rows(5, 6, 7), read=[(0, 8)], log_start=5, compacted=True)
    assert (c.unexpected, c.compacted_away) == (0, 1)
    # A partition Kafka no longer has (log_start None): rows in read ranges are not compared.
    assert compare(kafka=[], stored=rows(1, 2), read=[(0, 8)], log_start=None).unexpected == 0


def test_examples_are_the_smallest_and_the_text_counts_the_rest():
    t = compare(kafka=list(range(10)), stored=[], read=[(0, 10)])
    assert t.missing == 10 and t.examples["missing"] == [("t", 0, o) for o in range(5)]
    assert t.example_text("missing", t.missing) == "t-0@0, t-0@1, t-0@2, t-0@3, t-0@4 and 5 more"


def test_the_comparison_streams_its_inputs():
    # Generators, consumed once, in step: nothing is collected per record.
    t = compare(kafka=(o for o in range(0, 1_000_000, 2)), stored=((o, False) for o in range(0, 1_000_000, 2)),
                read=[(0, 1_000_000)])
    assert (t.kafka_records, t.output_rows, t.missing, t.unexpected) == (500_000, 500_000, 0, 0)


def test_kafka_is_read_over_the_read_offsets_of_each_span_within_the_log():
    offsets = PartitionOffsets(log_start=5, end=100)
    read = [(0, 30), (50, 90)]
    assert _kafka_spans([(0, OPEN_END)], read, offsets) == [(5, 90)]
    assert _kafka_spans([(20, 60), (90, OPEN_END)], read, offsets) == [(20, 60)]
    assert _kafka_spans([(0, 10)], read, None) == []


def test_the_deadline_grows_with_the_work_unless_given():
    assert deadline_seconds(0) == 60
    assert deadline_seconds(10_000_000) == 60 + 500
    assert deadline_seconds(10_000_000, timeout=30) == 30


class FakeMessage:
    def __init__(self, offset: int | None):
        self._offset = offset

    def offset(self) -> int | None:
        return self._offset

    def error(self) -> KafkaError | None:
        return KafkaError(KafkaError._PARTITION_EOF) if self._offset is None else None


class FakeConsumer:
    """Serves a partition's records (None: the end-of-partition event), as many per call as asked for (or as
    arrived: `per_call`)."""

    def __init__(self, offsets: list[int | None], stall: bool = False, per_call: int = 10_000):
        self.offsets, self.stall, self.per_call, self.asked, self.assigned = offsets, stall, per_call, [], []

    def assign(self, partitions) -> None:  # noqa: ANN001 - confluent-kafka's signature
        self.assigned.append([(p.topic, p.partition, p.offset) for p in partitions])
        start = partitions[0].offset
        self.queue = [o for o in self.offsets if o is None or o >= start]

    def consume(self, num_messages: int, timeout: float) -> list[FakeMessage]:
        self.asked.append(num_messages)
        if self.stall:
            return []
        n = min(num_messages, self.per_call)
        served, self.queue = self.queue[:n], self.queue[n:]
        return [FakeMessage(o) for o in served]

    def unassign(self) -> None:
        self.assigned.append([])


def test_a_partition_is_read_from_its_start_to_its_end_gaps_included():
    consumer = FakeConsumer([0, 1, 3, 4, 8, 9, None], per_call=3)
    far = time.monotonic() + 60
    assert list(partition_record_offsets(consumer, TP, 1, 9, far)) == [1, 3, 4, 8]
    assert consumer.assigned == [[("t", 0, 1)], []]
    # Never more messages asked for than offsets are left: the range's last call returns at once.
    assert consumer.asked == [8, 4]
    # The end of the partition (trailing markers) ends the read too.
    assert list(partition_record_offsets(FakeConsumer([5, 6, None]), TP, 5, 20, far)) == [5, 6]
    assert list(partition_record_offsets(FakeConsumer([]), TP, 5, 5, far)) == []


def test_a_stalled_read_ends_at_its_deadline():
    consumer = FakeConsumer([], stall=True)
    with pytest.raises(TimeoutError, match=r"t-0 \[0, 10\) back from Kafka passed its deadline"):
        list(partition_record_offsets(consumer, TP, 0, 10, time.monotonic() + 0.05))
    assert consumer.assigned[-1] == []


def test_small_partitions_are_checked_together_within_the_groups_bounds(monkeypatch):
    from kafka_ledger.ops import verify

    monkeypatch.setattr(verify, "GROUP_PARTITIONS", 3)
    monkeypatch.setattr(verify, "GROUP_OFFSETS", 100)

    def work(partition: int, *kafka_spans):
        return verify._PartitionWork(TopicPartition("t", partition), [], None, [(0, OPEN_END)], list(kafka_spans))

    # 0-2: a full group by count; 3, 4: a group cut short by 5, which reads two stretches (checked alone, streamed);
    # 6 (60 offsets) and 7 (50) would hold more than 100 offsets together; 8 reads nothing; 9 is past the small size.
    items = [work(0, (0, 5)), work(1, (0, 5)), work(2), work(3, (0, 5)), work(4), work(5, (0, 2), (4, 6)),
             work(6, (0, 60)), work(7, (0, 50)), work(8), work(9, (0, verify.SMALL_PARTITION_OFFSETS + 1))]
    groups = [[w.tp.partition for w in group] for group in verify._groups(items)]
    assert groups == [[0, 1, 2], [3, 4], [5], [6], [7, 8], [9]]
    assert [verify._small(w) for w in items] == [True] * 5 + [False, True, True, True, False]
