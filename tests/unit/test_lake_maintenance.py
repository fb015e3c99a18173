"""What an Iceberg table's snapshot expiry may drop: never a snapshot an unfinished batch may still adopt."""

from kafka_ledger.sinks.iceberg.maintenance import ExpiryBound, HistorySnapshot, expiry_bound

NOW = 10_000_000


def snapshots(*entries: tuple[int, int | None]) -> list[HistorySnapshot]:
    """(timestamp, stamping batch) pairs, newest first; snapshot ids 100, 99, ..."""
    return [HistorySnapshot(100 - i, ts, batch) for i, (ts, batch) in enumerate(entries)]


def test_with_every_batch_finished_the_wanted_bound_holds():
    history = snapshots((900, 7), (800, None), (700, 6), (600, 5))
    statuses = {7: "committed", 6: "committed", 5: "abandoned"}
    assert expiry_bound(history, statuses, 750) == ExpiryBound(750, [])


def test_an_unfinished_batchs_snapshot_and_every_newer_one_stay():
    # Batch 6's snapshot landed but the ledger did not record it (a crash in the critical window): it stays, and
    # so does everything after it, a compaction's snapshot among them.
    history = snapshots((900, 7), (800, None), (700, 6), (600, 5))
    statuses = {7: "committed", 6: "failed", 5: "committed"}
    assert expiry_bound(history, statuses, 850) == ExpiryBound(700, [6])


def test_a_newer_snapshot_with_an_older_clock_lowers_the_bound_too():
    # Iceberg keeps a branch's snapshots from its head to the first one older than the bound: a snapshot between
    # the head and the protected one whose writer's clock lags would end that walk before the protected one.
    history = snapshots((900, 7), (650, None), (700, 6), (600, 5))
    assert expiry_bound(history, {7: "committed", 6: "planned", 5: "committed"}, 850).older_than_ms == 650


def test_a_batch_the_ledger_does_not_know_counts_as_unfinished():
    history = snapshots((900, 7), (700, 42))
    assert expiry_bound(history, {7: "committed"}, NOW) == ExpiryBound(700, [42])


def test_an_old_enough_bound_is_kept():
    history = snapshots((900, 7), (700, 6))
    assert expiry_bound(history, {7: "failed", 6: "committed"}, 100) == ExpiryBound(100, [7])
