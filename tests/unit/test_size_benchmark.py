"""The size benchmark's summary: medians, rates against W1 round by round, and the targets."""

from __future__ import annotations

from tools.size_benchmark import Size, summarise_sizes

SIZES = (Size("w1", 500_000, 18), Size("2m", 2_000_000, 18), Size("10m", 10_000_000, 18, backlog=True),
         Size("1000_partitions", 50_000, 1_000))


def run(seconds: float, client: int = 300, server: int = 1_000, first_client: int | None = None) -> dict:
    peaks = {"client": client, "spark_connect_server": server}
    return {"seconds": seconds, "exact": True, "peak_rss_mib": peaks,
            **({"batches": 6, "first_batch_peak_rss_mib": {**peaks, "client": first_client}} if first_client else {})}


def test_rates_are_compared_with_w1_of_the_same_round():
    results = {
        # W1 slow in round 2 (a noisy neighbour): so are the others of that round.
        "w1": [run(5.0), run(10.0), run(5.0)],
        "2m": [run(16.0), run(32.0), run(22.0)],
        "10m": [run(100.0, client=400, first_client=300), run(200.0, first_client=290), run(90.0, first_client=300)],
        "1000_partitions": [run(1.4), run(2.0), run(1.5)],
    }
    summary = summarise_sizes(SIZES, results)
    sizes = summary["sizes"]
    assert sizes["2m"]["seconds"] == 22.0 and sizes["2m"]["records_per_s"] == round(2_000_000 / 22.0)
    # Rounds: (2M/16) / (0.5M/5) = 1.25, 1.25, (2M/22)/(0.5M/5) = 0.909: the median 1.25.
    assert sizes["2m"]["rate_vs_w1"] == 1.25
    assert sizes["10m"]["rate_vs_w1"] == 1.0
    assert summary["rate_holds"] is True
    # Round 1's drain grew to 400 MiB from 300 after its first batch: more than 1.15 times.
    assert summary["memory_bounded"] is False
    # Twice W1's 5 s a 500,000 records is 1 s for 50,000, plus 1 s for 1,000 partitions.
    assert sizes["1000_partitions"]["target_seconds"] == 2.0 and summary["partitions_within_target"] is True
    assert summary["exact"] is True


def test_a_size_slower_than_w1_per_record_misses_the_rate_target():
    results = {"w1": [run(5.0)], "2m": [run(25.0)], "10m": [run(80.0, client=330, first_client=300)],
               "1000_partitions": [run(2.5)]}
    summary = summarise_sizes(SIZES, results)
    assert summary["sizes"]["2m"]["rate_vs_w1"] == 0.8 and summary["rate_holds"] is False
    assert summary["memory_bounded"] is True and summary["partitions_within_target"] is False
