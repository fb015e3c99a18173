"""The shipped alert rules (monitoring/alerts.yml): valid, and each one tested by `promtool test rules`."""

import os
import subprocess
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
MONITORING = ROOT / "monitoring"


def promtool() -> Path:
    """Debian's promtool, unpacked by `scripts/stack.sh install` into the clone's cache."""
    cache = Path(os.environ.get("KL_CACHE") or ROOT / ".stack" / "cache")
    path = cache / "prometheus" / "usr" / "bin" / "promtool"
    assert path.exists(), f"no promtool at {path}: run scripts/stack.sh install"
    return path


def run(*args: str) -> str:
    done = subprocess.run([str(promtool()), *args], cwd=MONITORING, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_the_rules_are_valid():
    assert "SUCCESS" in run("check", "rules", "alerts.yml")


def test_every_alert_fires_and_stays_quiet_where_its_tests_say():
    assert "SUCCESS" in run("test", "rules", "alerts.test.yml")


def test_every_alert_has_a_test_that_expects_it_to_fire():
    rules = yaml.safe_load((MONITORING / "alerts.yml").read_text())
    alerts = {rule["alert"] for group in rules["groups"] for rule in group["rules"]}
    tests = yaml.safe_load((MONITORING / "alerts.test.yml").read_text())
    fired = {case["alertname"] for test in tests["tests"] for case in test.get("alert_rule_test", [])
             if case["exp_alerts"]}
    assert alerts == fired
