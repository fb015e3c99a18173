"""An attempt's stages: laps in order, nested parts recorded apart, one line for the task log."""

import pytest

from kafka_ledger.observe.stages import STAGES, Stopwatch, describe, until_first_rows


def test_laps_run_from_one_stage_to_the_next():
    clock = Stopwatch()
    clock.lap("begin", at=clock.started + 0.5)
    clock.lap("session", at=clock.started + 0.75)
    clock.lap("to_first_rows", at=clock.started + 2.0)
    clock.record("waiting_for_spark", 1.0)
    clock.record("copying", 3.0)
    clock.lap("stream", at=clock.started + 6.0)
    assert clock.stages == {"begin": 0.5, "session": 0.25, "to_first_rows": 1.25, "waiting_for_spark": 1.0,
                            "copying": 3.0, "stream": 4.0}
    assert until_first_rows(clock.stages) == 2.0


def test_an_unknown_stage_is_refused():
    with pytest.raises(ValueError, match="unknown stage 'read'"):
        Stopwatch().lap("read")


def test_the_task_log_line_follows_the_data_path():
    stages = {"begin": 0.04, "session": 0.1, "to_first_rows": 1.2, "waiting_for_spark": 2.0, "copying": 1.5,
              "stream": 3.5, "commit": 0.2}
    assert describe(stages) == (
        "first rows after 1.34 s: begin 0.04 s, session 0.10 s, to first rows 1.20 s, "
        "stream 3.50 s (waiting for Spark 2.00 s, copying 1.50 s), commit 0.20 s")
    # A batch without rows has no first rows and no split of its stream.
    assert describe({"begin": 0.04, "session": 0.1, "stream": 0.01, "commit": 0.2}) == (
        "begin 0.04 s, session 0.10 s, stream 0.01 s, commit 0.20 s")
    assert set(STAGES) >= set(stages)
