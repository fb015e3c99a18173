"""The size benchmark (`python -m tools.benchmark --sizes`): records per second and peak memory from W1 to a backlog
of 10 M records, and over 1,000 partitions, measured in the same run so that the machine's drift is shared.

Four topics are produced first: W1 (545,884 records over 18 partitions), 2 M records over 18 partitions, 10 M over
18 (drained by batches capped at `cap` records a partition, the pipelines' default: a backlog), and 50,000 records
over 1,000 partitions. Then, round after round, a fresh pipeline drains each of them in turn (tools.benchmark's
run_kafka_ledger: plan to the last commit, exact row counts, the peak resident memory of this process and the Spark
Connect server). The summary gives each size's median seconds and records per second, its records per second against
W1's of the same round (the median of those ratios), its peak memory against W1's, and the issue's targets as
booleans: 2 M and 10 M at least W1's records per second (`rate_holds`), the peaks over the whole 10 M drain within
MEMORY_GROWTH of the peaks after its first batch in every round (`memory_bounded`: memory set by the cap, not growing
with the backlog), 1,000 partitions within twice W1's time a record plus a millisecond a partition
(`partitions_within_target`).
"""

from __future__ import annotations

import os
import statistics
import tempfile
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from confluent_kafka.admin import AdminClient

from kafka_ledger.config.settings import kafka_for
from tools import git_commit
from tools.benchmark import Setup, _clean_up, produce, round_pipeline, run_kafka_ledger
from tools.kafka_topics import create_topic

BACKLOG_CAP = 100_000  # the pipelines' default max_records_per_partition
MEMORY_GROWTH = 1.15  # a backlog's peak resident memory over its whole drain at most this times its first batch's
PARTITION_ALLOWANCE_SECONDS = 0.001


@dataclass(frozen=True)
class Size:
    name: str
    records: int
    partitions: int
    backlog: bool = False  # drained in batches capped per partition, not read as one batch


SIZES = (Size("w1", 545_884, 18), Size("2m", 2_000_000, 18), Size("10m", 10_000_000, 18, backlog=True),
         Size("1000_partitions", 50_000, 1_000))


def run_sizes(servers: str, dsn: str, runtime: str, rounds: int, cap: int, report: Callable[[dict[str, Any]], None],
              sizes: tuple[Size, ...] = SIZES, keep: bool = False) -> dict[str, Any]:
    """Produce every size's topic, drain each `rounds` times (sizes alternating within a round); the summary."""
    run_id = uuid.uuid4().hex[:8]
    workdir = Path(tempfile.mkdtemp(prefix="kl-sizes-"))
    setups = {size.name: Setup(servers, dsn, f"bench-{run_id}-{size.name.replace('_', '-')}", size.records,
                               cap if size.backlog else size.records, runtime, workdir) for size in sizes}
    admin = AdminClient(kafka_for(servers).confluent())
    load_before = os.getloadavg()[0]
    results: dict[str, list[dict[str, Any]]] = {size.name: [] for size in sizes}
    try:
        for size in sizes:
            create_topic(admin, setups[size.name].topic, size.partitions)
            rate = produce(servers, setups[size.name].topic, size.records, size.partitions)
            report({"produced": size.records, "size": size.name, "partitions": size.partitions,
                    "produce_records_per_s": round(rate)})
        for round_no in range(rounds):
            for size in sizes:
                drained = run_kafka_ledger(setups[size.name], round_pipeline(setups[size.name], "exactly_once"))
                results[size.name].append(drained)
                report({"round": round_no + 1, "size": size.name, "kafka_ledger": drained})
    finally:
        if not keep:
            for setup in setups.values():
                _clean_up(setup, admin)
    summary = summarise_sizes(sizes, results)
    summary.update(rounds=rounds, runtime=runtime, backlog_cap=cap,
                   load_average=[round(load_before, 2), round(os.getloadavg()[0], 2)], commit=git_commit())
    return summary


def summarise_sizes(sizes: tuple[Size, ...], results: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Medians per size, ratios against W1 (the first size) round by round, and the targets."""
    base = sizes[0]
    per_size: dict[str, dict[str, Any]] = {}
    for size in sizes:
        runs = results[size.name]
        seconds = [r["seconds"] for r in runs]
        peaks: dict[str, int] = {}
        for r in runs:
            for process, mib in r["peak_rss_mib"].items():
                peaks[process] = max(peaks.get(process, 0), mib)
        per_size[size.name] = {
            "records": size.records, "partitions": size.partitions, "batches": max(r.get("batches", 1) for r in runs),
            "seconds": round(statistics.median(seconds), 3), "rounds_seconds": seconds,
            "records_per_s": round(size.records / statistics.median(seconds)),
            # Per round, this size's records per second over W1's of the same round.
            "rate_vs_w1": round(statistics.median(
                (size.records / r["seconds"]) / (base.records / b["seconds"])
                for r, b in zip(runs, results[base.name], strict=True)), 3),
            "peak_rss_mib": peaks,
            "exact": all(r["exact"] for r in runs),
        }
    summary: dict[str, Any] = {"sizes": per_size, "exact": all(s["exact"] for s in per_size.values())}
    w1 = per_size[base.name]
    for size in sizes:
        if size.backlog or (size.partitions == base.partitions and size.records > base.records):
            summary.setdefault("rate_holds", True)
            summary["rate_holds"] &= per_size[size.name]["rate_vs_w1"] >= 1.0
        if size.backlog:
            per_size[size.name]["first_batch_peak_rss_mib"] = [r.get("first_batch_peak_rss_mib") for r in
                                                               results[size.name]]
            summary["memory_bounded"] = all(
                mib <= MEMORY_GROWTH * r["first_batch_peak_rss_mib"][process]
                for r in results[size.name] for process, mib in r["peak_rss_mib"].items()
                if "first_batch_peak_rss_mib" in r)
        if size.partitions > base.partitions:
            target = 2 * w1["seconds"] / base.records * size.records + PARTITION_ALLOWANCE_SECONDS * size.partitions
            per_size[size.name]["target_seconds"] = round(target, 3)
            summary["partitions_within_target"] = per_size[size.name]["seconds"] <= target
    return summary
