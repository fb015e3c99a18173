"""Run requests from the trigger form or REST conf: defaults, validation messages, and the form's schema."""

from datetime import UTC, datetime

import jsonschema
import pytest

from kafka_ledger.batch.requests import RequestError, parse_request
from kafka_ledger.model.ranges import OffsetRange


def test_empty_conf_means_catch_up():
    assert parse_request(None).mode == "catch_up"
    # The form sends every field; empty ones mean "not given".
    assert parse_request({"mode": "catch_up", "ranges": [], "window_from": None, "batch_id": None, "reason": ""}).mode \
        == "catch_up"


def test_offset_ranges_use_kafka_words_from_and_until():
    request = parse_request({"mode": "offset_ranges", "ranges": [{"topic": "t", "partition": 1, "from": 5,
                                                                   "until": 9}]})
    assert request.offset_ranges == [OffsetRange("t", 1, 5, 9)]


def test_window_without_zone_is_utc():
    request = parse_request({"mode": "time_window", "window_from": "2026-11-20T10:00:00",
                             "window_to": "2026-11-20T11:00:00+00:00"})
    assert request.window_from == datetime(2026, 11, 20, 10, tzinfo=UTC)


@pytest.mark.parametrize(
    "conf, expected",
    [
        ({"mode": "offset_ranges", "ranges": [{"topic": "t", "partition": 0, "from": 50, "until": 10}]},
         "t-0: from 50 must be below until 10"),
        ({"mode": "offset_ranges", "ranges": [{"topic": "t", "partition": 0, "from": -1, "until": 10}]},
         "offsets cannot be negative"),
        ({"mode": "offset_ranges"}, "mode offset_ranges needs at least one range"),
        ({"mode": "time_window", "window_from": "2026-11-20T11:00:00Z", "window_to": "2026-11-20T10:00:00Z"},
         "must be before window_to"),
        ({"mode": "time_window", "window_from": "2026-11-20T11:00:00Z"}, "needs window_from and window_to"),
        ({"mode": "replay_batch"}, "mode replay_batch needs batch_id"),
        ({"mode": "replay"}, "mode: Input should be"),
        ({"mode": "catch_up", "batchid": 3}, "batchid: Extra inputs are not permitted"),
    ],
)
def test_invalid_requests_are_refused_in_words(conf, expected):
    with pytest.raises(RequestError) as exc_info:
        parse_request(conf)
    assert expected in str(exc_info.value)


def test_trigger_form_schema_accepts_the_documented_examples_and_refuses_bad_types():
    from kafka_ledger.airflow.dags import trigger_form
    from kafka_ledger.config.pipeline import parse_pipelines

    pipeline = parse_pipelines(
        "pipelines:\n  p:\n    topics: [t]\n    output_table: t\n    columns: [{name: a, type: string}]\n"
    )["p"]
    form = trigger_form(pipeline)
    defaults = {name: param.value for name, param in form.items()}
    assert parse_request(defaults).mode == "catch_up"

    def check(name, value):
        jsonschema.validate(value, form[name].schema, format_checker=jsonschema.FormatChecker())

    check("ranges", [{"topic": "t", "partition": 0, "from": 1, "until": 2}])
    check("window_from", "2026-11-20T10:00:00Z")
    check("batch_id", 3)
    with pytest.raises(jsonschema.ValidationError):
        check("ranges", [{"topic": "t", "partition": 0, "from": -1, "until": 2}])
    with pytest.raises(jsonschema.ValidationError):
        check("mode", "everything")


def test_the_form_is_the_request_model_and_only_the_mode_is_required():
    from typing import get_args

    from kafka_ledger.batch.requests import BatchRequest, Mode, trigger_form_fields

    fields = trigger_form_fields()
    assert list(fields) == list(BatchRequest.model_fields)
    # Airflow's form requires a field whose type does not admit null and has no value: the mode has one, the
    # ranges have [], every other field admits null and is null by default.
    nullable = [name for name, field in fields.items() if "null" in field.schema["type"]]
    assert nullable == [name for name, field in fields.items() if field.default is None] == [
        "reason", "window_from", "window_to", "batch_id"]
    assert (fields["mode"].default, fields["ranges"].default, fields["reader_schema"].default) == (
        "catch_up", [], "batch")
    mode = fields["mode"].schema
    assert mode["enum"] == list(get_args(Mode)) and set(mode["values_display"]) == set(mode["enum"])
    assert {name: field.schema["section"] for name, field in fields.items()} == {
        "mode": "Run", "reason": "Run", "ranges": "Offset ranges", "window_from": "Time window",
        "window_to": "Time window", "batch_id": "Replay", "reader_schema": "Replay"}
    assert fields["window_from"].schema["type"] == ["null", "string"]
    assert fields["window_from"].schema["format"] == "date-time"
    assert fields["batch_id"].schema["type"] == ["null", "integer"] and fields["batch_id"].schema["minimum"] == 1
    # Markdown descriptions go to Airflow's description_md, plain ones to the Param's description.
    assert fields["mode"].description is None and "**catch_up**" in mode["description_md"]
    assert fields["reason"].description == BatchRequest.model_fields["reason"].description
    # What the form sends by default is the model's default request.
    assert parse_request({name: field.default for name, field in fields.items()}) == BatchRequest()


def test_the_forms_example_range_names_the_pipelines_first_topic():
    from kafka_ledger.batch.requests import trigger_form_fields

    assert '`[{"topic": "clicks", "partition": 0, "from": 100, "until": 200}]`' in (
        trigger_form_fields("clicks")["ranges"].schema["description_md"])
    assert '"topic": "topic"' in trigger_form_fields()["ranges"].schema["description_md"]


def test_a_replay_reads_with_its_batchs_reader_schema_unless_it_asks_for_the_newest():
    assert parse_request({"mode": "replay_batch", "batch_id": 3}).reader_schema == "batch"
    assert parse_request({"mode": "replay_batch", "batch_id": 3, "reader_schema": "newest"}).reader_schema == "newest"
    with pytest.raises(RequestError, match="reader_schema newest is for mode replay_batch"):
        parse_request({"mode": "catch_up", "reader_schema": "newest"})
