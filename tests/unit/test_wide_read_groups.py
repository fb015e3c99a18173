"""How a wide read splits a batch's ranges among Spark tasks (batch/wide_read.py)."""

from __future__ import annotations

from kafka_ledger.batch import wide_read
from kafka_ledger.batch.read import OFFSETS_PER_TASK
from kafka_ledger.model.ranges import OffsetRange


def ranges(spans: list[int], topic: str = "t") -> list[OffsetRange]:
    return [OffsetRange(topic, p, 10, 10 + span) for p, span in enumerate(spans)]


def test_every_range_is_in_exactly_one_group_in_partition_order():
    batch = ranges([1] * 10_000)
    groups = wide_read.range_groups(batch, OFFSETS_PER_TASK)
    assert len(groups) == 1 and groups[0] == sorted(batch)


def test_groups_hold_about_the_same_number_of_offsets():
    batch = ranges([50] * 1_000)  # 50,000 offsets: two tasks of 25,000
    groups = wide_read.range_groups(batch, OFFSETS_PER_TASK)
    assert [sum(r.span for r in group) for group in groups] == [25_000, 25_000]
    assert [r for group in groups for r in group] == sorted(batch)


def test_a_big_partition_keeps_a_group_of_its_own_and_no_group_is_empty():
    batch = ranges([100_000, *[10] * 99])
    groups = wide_read.range_groups(batch, OFFSETS_PER_TASK)
    assert groups[0] == [batch[0]]
    assert all(groups) and sorted(r for group in groups for r in group) == sorted(batch)
    assert len(groups) <= -(-sum(r.span for r in batch) // OFFSETS_PER_TASK)


def test_only_more_partitions_than_the_kafka_sources_consumers_read_wide():
    assert not wide_read.reads_wide(ranges([5] * wide_read.WIDE_READ_PARTITIONS))
    assert wide_read.reads_wide(ranges([5] * (wide_read.WIDE_READ_PARTITIONS + 1)))


def test_the_reader_reaches_the_executors_as_code_that_needs_no_kafka_ledger_there(tmp_path):
    """A cluster's workers have confluent-kafka and pyarrow, not kafka-ledger: the pickled reader imports none of
    it (read_wide registers its module to be pickled by value)."""
    import functools
    import subprocess
    import sys

    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[wide_read.__name__])
    reader = functools.partial(wide_read.read_groups, {"bootstrap.servers": "x"}, [[("t", 0, 0, 1)]], False, 1.0)
    (tmp_path / "reader.pickle").write_bytes(cloudpickle.dumps(reader))
    executor = f"""
import importlib.abc, pickle, sys
class NoKafkaLedger(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] == "kafka_ledger":
            raise ImportError(name)
sys.meta_path.insert(0, NoKafkaLedger())
reader = pickle.loads(open({str(tmp_path / "reader.pickle")!r}, "rb").read())
print(list(reader(iter([]))))
"""
    done = subprocess.run([sys.executable, "-c", executor], capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout.strip()) == (0, "[]"), done.stderr
