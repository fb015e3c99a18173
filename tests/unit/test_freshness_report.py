"""The freshness benchmark's arithmetic: percentiles of the delays, over the run and its thirds, and the rate kept."""

import numpy as np

from tools.freshness import delay_report


def test_percentiles_cover_the_run_and_its_thirds_and_the_rate_counts_to_the_last_commit():
    # 300 records, one a second; the delay grows from 1 s to 3 s over the thirds.
    # Given in another order than their timestamps': the thirds are by timestamp.
    at = np.array([float(i) for i in range(300)][::-1])
    report = delay_report(at, np.array([1.0 + i // 100 for i in range(300)][::-1]))
    assert report["records"] == 300
    assert (report["p50"], report["max"]) == (2.0, 3.0)
    assert report["first_third"]["p99"] == 1.0 and report["last_third"]["p50"] == 3.0
    # From the load's start to the last record's commit: 299 s + its 3 s delay.
    assert report["records_per_s_kept_up"] == round(300 / 302)


def test_no_records_reports_none():
    assert delay_report(np.empty(0), np.empty(0)) == {"records": 0}
