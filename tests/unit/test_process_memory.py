"""The benchmarks' memory watch: peaks by third, and what flat means."""

from __future__ import annotations

import os
import time

from tools.process_memory import MemoryWatch, flat_report

MB = 2**20


def test_flat_when_every_groups_last_third_peaks_within_ten_percent_of_its_first():
    samples = [(float(t), {"kafka": 500 * MB + t * MB, "postgres": 100 * MB}) for t in range(0, 31, 5)]
    report = flat_report(samples)
    assert report["groups"] == {
        "kafka": {"first_third_peak_mb": 510, "last_third_peak_mb": 530, "ratio": 1.039},
        "postgres": {"first_third_peak_mb": 100, "last_third_peak_mb": 100, "ratio": 1.0},
    }
    assert report["flat"] is True and report["samples"] == 7 and report["every_s"] == 5.0


def test_a_group_that_grows_by_more_than_a_tenth_is_not_flat_and_one_missing_early_is_not_either():
    growing = [(float(t), {"spark": (1000 + 10 * t) * MB}) for t in range(0, 31)]
    assert flat_report(growing)["flat"] is False
    late = [(float(t), {"spark": 100 * MB} | ({"peer": MB} if t > 20 else {})) for t in range(0, 31)]
    report = flat_report(late)
    assert report["groups"]["peer"]["ratio"] is None and report["flat"] is False


def test_too_few_samples_say_nothing():
    assert flat_report([(0.0, {"kafka": MB})]) == {"samples": 1, "flat": None}


def test_the_watch_samples_this_process_until_stopped():
    watch = MemoryWatch(lambda: {"me": [os.getpid()]}, every=0.01).start()
    while len(watch.samples) < 4:
        time.sleep(0.01)
    report = watch.stop()
    assert report["groups"]["me"]["first_third_peak_mb"] > 0
