"""The Spark work's Kafka read options: exact assign/starting/ending JSON, read_committed, failOnDataLoss."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kafka_ledger.batch import read as ingest
from kafka_ledger.config.settings import kafka_for
from kafka_ledger.model.ranges import OffsetRange

JOB_PATH = Path(__file__).resolve().parents[2] / "spark_jobs" / "ingest_batch.py"


@pytest.fixture
def ingest_batch(monkeypatch: pytest.MonkeyPatch):
    # A deployment's Kafka without security settings: the options below are the read's own.
    monkeypatch.setenv("KAFKA_LEDGER_BOOTSTRAP_SERVERS", "k:9092")
    return ingest


def test_importing_the_job_does_not_import_pyspark():
    # Nothing is left to Spark until the job knows there is something to read.
    code = (
        "import importlib.util, sys\n"
        f"spec = importlib.util.spec_from_file_location('ingest_batch', {str(JOB_PATH)!r})\n"
        "module = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(module)\n"
        "assert callable(module.run_job)\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'pyspark'))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_read_options_exact_offsets_for_two_topics(ingest_batch):
    ranges = [
        OffsetRange("clicks", 0, 0, 100),
        OffsetRange("clicks", 2, 50, 75),
        OffsetRange("clicks", 5, 1000, 1001),
        OffsetRange("views", 1, 7, 9),
        OffsetRange("views", 3, 0, 40),
    ]
    options = ingest_batch.kafka_read_options(ranges, kafka_for("k1:9092,k2:9092"), "clicks")
    assert set(options) == {
        "kafka.bootstrap.servers",
        "assign",
        "startingOffsets",
        "endingOffsets",
        "kafka.isolation.level",
        "failOnDataLoss",
        "includeHeaders",
        "kafkaConsumer.pollTimeoutMs",
        "kafka.default.api.timeout.ms",
        "kafka.group.id",
        *ingest.KAFKA_READER_TUNING,
    }
    assert options["kafka.group.id"].startswith("kafka-ledger-clicks-")
    assert options["kafka.bootstrap.servers"] == "k1:9092,k2:9092"
    assert json.loads(options["assign"]) == {"clicks": [0, 2, 5], "views": [1, 3]}
    assert json.loads(options["startingOffsets"]) == {
        "clicks": {"0": 0, "2": 50, "5": 1000},
        "views": {"1": 7, "3": 0},
    }
    assert json.loads(options["endingOffsets"]) == {
        "clicks": {"0": 100, "2": 75, "5": 1001},
        "views": {"1": 9, "3": 40},
    }


def test_read_options_commit_only_and_fail_on_data_loss(ingest_batch):
    options = ingest_batch.kafka_read_options([OffsetRange("t", 0, 1, 2)], kafka_for("k:9092"), "p")
    assert options["kafka.isolation.level"] == "read_committed"
    assert options["failOnDataLoss"] == "true"
    assert options["includeHeaders"] == "false"
    assert all(isinstance(v, str) for v in options.values())


def test_read_options_ending_offsets_are_the_exclusive_until_offsets(ingest_batch):
    r = OffsetRange("t", 4, 10, 20)
    options = ingest_batch.kafka_read_options([r], kafka_for("k:9092"), "p")
    assert json.loads(options["startingOffsets"]) == {"t": {"4": r.from_offset}}
    assert json.loads(options["endingOffsets"]) == {"t": {"4": r.until_offset}}
    assert json.loads(options["assign"]) == {"t": [4]}


def test_read_options_unsorted_ranges_give_same_offsets(ingest_batch):
    ranges = [OffsetRange("b", 1, 0, 3), OffsetRange("a", 0, 5, 6), OffsetRange("b", 0, 2, 4)]
    forward = ingest_batch.kafka_read_options(ranges, kafka_for("k:9092"), "p")
    backward = ingest_batch.kafka_read_options(list(reversed(ranges)), kafka_for("k:9092"), "p")
    for key in ("startingOffsets", "endingOffsets"):
        assert json.loads(forward[key]) == json.loads(backward[key])
    assert {t: sorted(ps) for t, ps in json.loads(forward["assign"]).items()} == {"a": [0], "b": [0, 1]}


def test_read_options_tune_the_fetch_without_changing_what_is_read(ingest_batch):
    options = ingest_batch.kafka_read_options([OffsetRange("t", 0, 1, 2)], kafka_for("k:9092"), "p")
    # The end-of-partition fetch must not stall each task for the broker's default 500 ms.
    assert options["kafka.fetch.max.wait.ms"] == "0"
    assert int(options["kafka.max.poll.records"]) >= 500
    assert "minPartitions" not in options and "maxRecordsPerPartition" not in options  # one task per partition


def test_small_partitions_share_tasks_and_big_ones_keep_their_own(ingest_batch):
    per_task = ingest.OFFSETS_PER_TASK
    assert ingest_batch.read_tasks([OffsetRange("t", p, 0, 50) for p in range(1000)]) == 2
    assert ingest_batch.read_tasks([OffsetRange("t", p, 0, 50) for p in range(18)]) == 1
    assert ingest_batch.read_tasks([OffsetRange("t", p, 0, per_task) for p in range(18)]) is None
    assert ingest_batch.read_tasks([OffsetRange("t", 0, 0, 10 * per_task)]) is None


def test_the_consumer_group_changes_with_the_kafka_client_settings_only(ingest_batch, monkeypatch):
    """A warm Spark pools consumers per group and partition and fails a read whose settings differ: a rotated
    password or other servers must give another group, the same settings the same one, and no secret shows."""
    def group(servers: str, password: str, until: int = 100) -> str:
        monkeypatch.setenv("KAFKA_LEDGER_KAFKA_CONFIG", json.dumps(
            {"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "ingest",
             "sasl.password": password}))
        read = [OffsetRange("clicks", 0, 0, until)]
        return ingest_batch.kafka_read_options(read, kafka_for(servers), "clicks")["kafka.group.id"]

    first = group("k1:9092", "old-secret")
    assert group("k1:9092", "old-secret", until=500) == first  # other ranges, same settings: pooled consumers
    assert group("k1:9092", "new-secret") != first
    assert group("k2:9092", "old-secret") != first
    assert "secret" not in first
