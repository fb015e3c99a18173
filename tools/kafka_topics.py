"""Topics the benchmark, the fault campaign and the tests create: made, and known to the broker, before use."""

from __future__ import annotations

import time

from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic

# KRaft refuses to create more than about 10,000 partitions' records in one request: a wider topic grows in steps.
PARTITIONS_PER_REQUEST = 4_000


def create_topic(admin: AdminClient, topic: str, partitions: int, config: dict[str, str] | None = None,
                 timeout: float = 300.0) -> None:
    """A topic of `partitions` partitions; returns once the broker's metadata shows every one with its leader
    (creation answers before that: a client asking at once was told the topic did not exist)."""
    created = min(partitions, PARTITIONS_PER_REQUEST)
    new = NewTopic(topic, num_partitions=created, replication_factor=1, config=config or {})
    admin.create_topics([new])[topic].result(timeout)
    while created < partitions:
        created = min(partitions, created + PARTITIONS_PER_REQUEST)
        admin.create_partitions([NewPartitions(topic, created)])[topic].result(timeout)
    deadline = time.monotonic() + timeout
    while True:
        found = admin.list_topics(topic, timeout=30).topics.get(topic)
        if (found is not None and found.error is None and len(found.partitions) == partitions
                and all(p.leader >= 0 for p in found.partitions.values())):
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"{topic}: the broker's metadata never showed its {partitions} partitions with leaders")
        time.sleep(0.2)
