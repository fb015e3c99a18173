"""The many-pipelines benchmark's declarations: every pipeline valid, a doorbell and a topic of its own."""

from __future__ import annotations

from tools.pipelines_benchmark import declare


def test_declares_valid_doorbell_pipelines_each_with_its_own_topic(tmp_path, monkeypatch):
    monkeypatch.setenv("KAFKA_LEDGER_PIPELINES", "")  # declare() points it at its file: restored after the test
    pipelines = declare(tmp_path, "t1", 200)
    assert len(pipelines) == 200
    assert all(p.doorbell is not None for p in pipelines)
    assert len({p.topics[0] for p in pipelines}) == len({p.output_table for p in pipelines}) == 200
