"""Fail points: inert unless armed by KAFKA_LEDGER_FAILPOINTS, named, raise or kill, optionally once only."""

import os
import subprocess
import sys
import textwrap

import pytest

from kafka_ledger.observe import failpoints
from kafka_ledger.observe.failpoints import FailPointError


def test_inert_without_environment():
    assert failpoints.armed() == {}
    failpoints.hit("after_staging")
    failpoints.hit("before_commit")


def test_empty_environment_value_is_inert(monkeypatch):
    monkeypatch.setenv("KAFKA_LEDGER_FAILPOINTS", "")
    assert failpoints.armed() == {}
    failpoints.hit("after_staging")


def test_armed_parses_names_and_actions(monkeypatch):
    monkeypatch.setenv("KAFKA_LEDGER_FAILPOINTS", " after_staging = kill , before_commit=raise,,bare, =kill")
    assert failpoints.armed() == {"after_staging": "kill", "before_commit": "raise", "bare": "raise"}


def test_raise_action_raises_fail_point_error(monkeypatch):
    monkeypatch.setenv("KAFKA_LEDGER_FAILPOINTS", "before_commit=raise")
    with pytest.raises(FailPointError, match="fail point before_commit fired"):
        failpoints.hit("before_commit")


def test_name_without_action_raises(monkeypatch):
    monkeypatch.setenv("KAFKA_LEDGER_FAILPOINTS", "before_commit")
    with pytest.raises(FailPointError):
        failpoints.hit("before_commit")


def test_only_the_named_fail_point_fires(monkeypatch):
    monkeypatch.setenv("KAFKA_LEDGER_FAILPOINTS", "before_commit=raise")
    failpoints.hit("after_staging")
    failpoints.hit("before_read")
    failpoints.hit("before_commi")
    with pytest.raises(FailPointError):
        failpoints.hit("before_commit")


def test_fires_every_time_without_once_dir(monkeypatch):
    monkeypatch.setenv("KAFKA_LEDGER_FAILPOINTS", "before_commit=raise")
    for _ in range(3):
        with pytest.raises(FailPointError):
            failpoints.hit("before_commit")


def test_once_dir_fires_once_then_passes(monkeypatch, tmp_path):
    once_dir = tmp_path / "once" / "nested"
    monkeypatch.setenv("KAFKA_LEDGER_FAILPOINTS", "before_commit=raise,after_staging=raise")
    monkeypatch.setenv("KAFKA_LEDGER_FAILPOINTS_ONCE_DIR", str(once_dir))
    with pytest.raises(FailPointError):
        failpoints.hit("before_commit")
    assert (once_dir / "before_commit").exists()
    failpoints.hit("before_commit")
    failpoints.hit("before_commit")
    # each fail point has its own marker
    with pytest.raises(FailPointError):
        failpoints.hit("after_staging")
    failpoints.hit("after_staging")
    assert sorted(p.name for p in once_dir.iterdir()) == ["after_staging", "before_commit"]


def test_once_dir_leaves_no_marker_for_unarmed_fail_points(monkeypatch, tmp_path):
    monkeypatch.setenv("KAFKA_LEDGER_FAILPOINTS", "before_commit=raise")
    monkeypatch.setenv("KAFKA_LEDGER_FAILPOINTS_ONCE_DIR", str(tmp_path))
    failpoints.hit("after_staging")
    assert list(tmp_path.iterdir()) == []


def run_kill_child(env_extra: dict[str, str]) -> subprocess.CompletedProcess:
    code = textwrap.dedent(
        """
        from kafka_ledger.observe import failpoints
        failpoints.hit("after_staging")
        print("survived")
        """
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("KAFKA_LEDGER_")}
    env.update(env_extra)
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)


def test_kill_action_sigkills_the_process(tmp_path):
    result = run_kill_child({"KAFKA_LEDGER_FAILPOINTS": "after_staging=kill"})
    assert result.returncode == -9
    assert "survived" not in result.stdout


def test_kill_action_with_once_dir_kills_once_then_passes(tmp_path):
    env = {"KAFKA_LEDGER_FAILPOINTS": "after_staging=kill", "KAFKA_LEDGER_FAILPOINTS_ONCE_DIR": str(tmp_path)}
    first = run_kill_child(env)
    assert first.returncode == -9
    assert (tmp_path / "after_staging").exists()
    second = run_kill_child(env)
    assert second.returncode == 0, second.stderr
    assert second.stdout.strip() == "survived"


def test_pause_waits_until_the_resume_file_appears(monkeypatch, tmp_path):
    import threading
    import time

    monkeypatch.setenv("KAFKA_LEDGER_FAILPOINTS", "commit_before_end=pause")
    monkeypatch.setenv("KAFKA_LEDGER_FAILPOINTS_ONCE_DIR", str(tmp_path))
    monkeypatch.setenv("KAFKA_LEDGER_FAILPOINTS_PAUSE_SECONDS", "30")
    threading.Timer(0.3, lambda: (tmp_path / "commit_before_end.resume").touch()).start()
    started = time.monotonic()
    failpoints.hit("commit_before_end")  # returns (does not raise) once resumed
    assert 0.25 < time.monotonic() - started < 10
    assert (tmp_path / "commit_before_end").exists()
    failpoints.hit("commit_before_end")  # once only: no second pause


def test_pause_gives_up_after_its_timeout(monkeypatch):
    import time

    monkeypatch.setenv("KAFKA_LEDGER_FAILPOINTS", "after_plan=pause")
    monkeypatch.setenv("KAFKA_LEDGER_FAILPOINTS_PAUSE_SECONDS", "0.2")
    started = time.monotonic()
    failpoints.hit("after_plan")
    assert 0.15 < time.monotonic() - started < 5


def test_unknown_action_is_refused(monkeypatch):
    monkeypatch.setenv("KAFKA_LEDGER_FAILPOINTS", "after_plan=explode")
    with pytest.raises(ValueError, match="unknown action 'explode'"):
        failpoints.hit("after_plan")
