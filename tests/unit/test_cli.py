"""The kafka-ledger command line: commands listed, argument formats, and refusals before any I/O."""

import pytest

from kafka_ledger.model.ranges import TopicPartition
from kafka_ledger.ops import cli


def test_help_lists_every_command(capsys):
    with pytest.raises(SystemExit) as exc_info:
        cli.main(["--help"])
    assert exc_info.value.code == 0
    out = capsys.readouterr().out
    for command in ("status", "batches", "plan", "replay", "reset", "verify"):
        assert command in out
    assert "Exit codes: 0 ok, 1 verify found problems, 2 bad command line, 3 refused" in " ".join(out.split())
    assert "5 verify could not check (Kafka unreachable, a topic gone, deadline passed" in " ".join(out.split())


@pytest.mark.parametrize(("reports", "code"), [
    ([{}], cli.EXIT_OK),
    ([{"problems": ["1 committed record(s) neither in the output nor in the dead letters"]}], cli.EXIT_PROBLEMS),
    ([{"unverified": "cannot read the committed topics back from Kafka"}], cli.EXIT_UNVERIFIED),
    # A problem found in one pipeline outweighs another that could not be checked.
    ([{"unverified": "deadline"}, {"problems": ["outside"]}], cli.EXIT_PROBLEMS),
])
def test_verify_exit_codes_tell_a_problem_from_a_check_that_could_not_run(monkeypatch, capsys, reports, code):
    from kafka_ledger.ops.verify import VerifyReport

    calls = []

    def fake_verify(services, pipeline, *, full, timeout):
        calls.append((pipeline, full, timeout))
        return VerifyReport(pipeline, **reports[len(calls) - 1])

    monkeypatch.setattr(cli, "_services", lambda: "services")
    monkeypatch.setattr(cli, "_pipelines", lambda names: names)
    monkeypatch.setattr(cli, "verify_pipeline", fake_verify)
    names = [f"p{i}" for i in range(len(reports))]
    assert cli.main(["verify", *names, "--full", "--timeout", "30", "--json"]) == code
    assert calls == [(name, True, 30.0) for name in names]
    out = capsys.readouterr().out
    assert '"mode": "full"' in out and '"verified_point"' in out


def test_range_and_offset_formats_allow_dots_and_dashes_in_topic_names():
    assert cli._range_arg("orders.eu-1:3:100:200") == {"topic": "orders.eu-1", "partition": 3, "from": 100,
                                                        "until": 200}
    assert cli._offset_arg("orders.eu-1:3=42") == (TopicPartition("orders.eu-1", 3), 42)


@pytest.mark.parametrize("argv", [["replay", "p", "--range", "t:0:1"], ["reset", "p", "--to-offset", "t:0"],
                                  ["plan", "p", "--from", "yesterday"], ["frobnicate"]])
def test_malformed_arguments_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as exc_info:
        cli.main(argv)
    assert exc_info.value.code == cli.EXIT_USAGE


def test_replay_without_a_target_or_with_two_is_refused_with_3(capsys, tmp_path, monkeypatch):
    config = tmp_path / "pipelines.yaml"
    config.write_text(
        "pipelines:\n  p:\n    topics: [t]\n    output_table: t\n    columns: [{name: a, type: string}]\n"
    )
    monkeypatch.setenv("KAFKA_LEDGER_PIPELINES", str(config))
    assert cli.main(["replay", "p"]) == cli.EXIT_REFUSED
    err = capsys.readouterr().err
    # One sentence, "refused" said once.
    assert err == "kafka-ledger: refused, nothing was written: say what to replay: --batch ID, --range " \
                  "TOPIC:PARTITION:FROM:UNTIL or --from/--to\n"
    assert cli.main(["replay", "p", "--batch", "3", "--range", "t:0:1:2"]) == cli.EXIT_REFUSED
    assert "choose one of --batch, --range or --from/--to" in capsys.readouterr().err
    assert cli.main(["reset", "p", "--to-earliest", "--to-latest"]) == cli.EXIT_REFUSED
    assert cli.main(["status", "nope"]) == cli.EXIT_REFUSED
    assert "pipeline 'nope' is not declared" in capsys.readouterr().err


def test_output_to_a_reader_that_goes_away_ends_quietly():
    import subprocess
    import sys

    # As in `kafka-ledger batches PIPELINE | head -1`: the reader closes the pipe after the first line.
    writer = subprocess.Popen(
        [sys.executable, "-c", "from kafka_ledger.ops import cli\nfor i in range(20000): cli._print(f'line {i}')"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    assert writer.stdout.readline() == b"line 0\n"
    writer.stdout.close()
    assert writer.wait(timeout=60) == 0
    assert writer.stderr.read() == b""


def test_kafkas_tools_need_kafkas_jars_and_say_where_they_come_from(capsys, monkeypatch, tmp_path):
    # Unset (as in Docker Compose, whose image has no Kafka tools): the setting to name them is named.
    monkeypatch.delenv("KL_KAFKA_LIBS", raising=False)
    assert cli.main(["kafka", "consumer-groups", "--list"]) == cli.EXIT_FAILED
    assert "set KAFKA_LEDGER_KAFKA_TOOLS_DIR to their folder" in capsys.readouterr().err
    # A folder without the kafka-tools jar: named with its value. The dev stack's own variable plays no part.
    monkeypatch.setenv("KL_KAFKA_LIBS", str(tmp_path / "elsewhere"))
    monkeypatch.setenv("KAFKA_LEDGER_KAFKA_TOOLS_DIR", str(tmp_path))
    assert cli.main(["kafka", "consumer-groups", "--list"]) == cli.EXIT_FAILED
    assert f"KAFKA_LEDGER_KAFKA_TOOLS_DIR={str(tmp_path)!r} holds no kafka-tools jar" in capsys.readouterr().err
    for tool in ("consumer-groups", "console-consumer", "console-producer", "topics", "get-offsets",
                 "consumer-perf-test"):
        assert tool in cli.KAFKA_TOOLS


@pytest.mark.parametrize("zone", ["America/New_York", "Asia/Tokyo", "UTC"])
def test_a_date_time_without_a_zone_is_utc_for_reset_and_replay_alike_whatever_the_machines_zone(monkeypatch, zone):
    """`reset --to-datetime` read a naive date-time in the machine's local time while `replay --from` read it as UTC."""
    import time
    from datetime import UTC, datetime

    from kafka_ledger.ops.resets import describe_target

    monkeypatch.setenv("TZ", zone)
    time.tzset()
    try:
        parser = cli.build_parser()
        reset = parser.parse_args(["reset", "clicks", "--to-datetime", "2026-11-20T10:00"]).to_datetime
        replay = parser.parse_args(["replay", "clicks", "--from", "2026-11-20T10:00", "--to", "2026-11-20T11:00"])
        expected = datetime(2026, 11, 20, 10, tzinfo=UTC)
        assert reset == replay.window_from == expected
        assert int(reset.timestamp()) == 1795168800  # the instant Kafka's time index is asked for
        assert describe_target(datetime(2026, 11, 20, 10)) == "datetime 2026-11-20T10:00:00+00:00"
        # An explicit zone is kept.
        cest = parser.parse_args(["reset", "clicks", "--to-datetime", "2026-11-20T12:00+02:00"]).to_datetime
        assert cest == expected
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()
