"""Pipeline declarations: YAML parsing, defaults, and ConfigError messages naming the source and the bad field."""

import textwrap

import pytest
import yaml

from kafka_ledger.config import pipeline as config
from kafka_ledger.config import settings
from kafka_ledger.config.pipeline import ConfigError, get_pipeline, load_pipelines, parse_pipelines
from kafka_ledger.model import kinds
from kafka_ledger.model.kinds import parse_kind

VALID = textwrap.dedent(
    """
    pipelines:
      clicks:
        topics: [clicks, clicks.v2]
        output_table: clicks
        columns:
          - {name: click_id, type: string, required: true}
          - {name: amount, type: double}
      views:
        description: page views
        topics: [views]
        output_table: page_views
        output_schema: analytics
        max_records_per_partition: 500
        start_position: latest
        schedule: null
        spark_conf: {spark.executor.memory: 2g}
        columns:
          - {name: view_id, type: long}
    """
)


def pipeline_yaml(**overrides: str) -> str:
    """A one-pipeline file named `p`, with top-level fields of the pipeline replaced by raw YAML snippets."""
    fields = {
        "topics": "[events]",
        "output_table": "events",
        "columns": "[{name: event_id, type: string}]",
    }
    fields.update(overrides)
    body = "\n".join(f"    {key}: {value}" for key, value in fields.items())
    return f"pipelines:\n  p:\n{body}\n"


def config_error(text: str, source: str = "pipelines.yaml") -> str:
    with pytest.raises(ConfigError) as exc_info:
        parse_pipelines(text, source)
    message = str(exc_info.value)
    assert message.startswith(f"{source}: ")
    return message


# --- valid files ------------------------------------------------------------------------------------------------


def test_parse_valid_pipelines_applies_defaults():
    pipelines = parse_pipelines(VALID)
    assert list(pipelines) == ["clicks", "views"]
    clicks = pipelines["clicks"]
    assert clicks.name == "clicks"
    assert clicks.topics == ["clicks", "clicks.v2"]
    assert clicks.max_records_per_partition == 100_000
    assert clicks.start_position == "earliest"
    assert clicks.schedule == "@hourly"
    assert clicks.output_schema == "public"
    assert clicks.description == ""
    assert clicks.spark_conf == {}
    assert [(c.name, str(c.type), c.required) for c in clicks.columns] == [
        ("click_id", "string", True),
        ("amount", "double", False),
    ]


def test_parse_valid_pipelines_keeps_explicit_values():
    views = parse_pipelines(VALID)["views"]
    assert views.name == "views"
    assert views.description == "page views"
    assert views.output_schema == "analytics"
    assert views.max_records_per_partition == 500
    assert views.start_position == "latest"
    assert views.schedule is None
    assert views.spark_conf == {"spark.executor.memory": "2g"}


def test_dag_id_and_qualified_output_table():
    pipelines = parse_pipelines(VALID)
    assert pipelines["clicks"].dag_id == "kafka_ledger__clicks"
    assert pipelines["views"].dag_id == "kafka_ledger__views"
    assert pipelines["clicks"].qualified_output_table == "public.clicks"
    assert pipelines["views"].qualified_output_table == "analytics.page_views"


@pytest.mark.parametrize("column_type", ["string", "long", "int", "double", "boolean", "timestamp", "date", "jsonb",
                                         "decimal(12,2)"])
def test_every_column_type_is_accepted_and_mapped_to_postgres(column_type):
    (pipeline,) = parse_pipelines(pipeline_yaml(columns=f"[{{name: c, type: '{column_type}'}}]")).values()
    assert pipeline.columns[0].type == parse_kind(column_type) and str(pipeline.columns[0].type) == column_type
    assert pipeline.columns[0].type.postgres_type
    assert pipeline.model_dump()["columns"][0]["type"] == column_type  # written back as declared


@pytest.mark.parametrize("text", ["", "\n", "# only a comment\n"])
def test_empty_file_declares_no_pipelines(text):
    assert parse_pipelines(text) == {}


def test_same_table_name_in_different_schemas_is_allowed():
    text = pipeline_yaml() + (
        "  q:\n    topics: [events]\n    output_table: events\n    output_schema: other\n"
        "    columns: [{name: event_id, type: string}]\n"
    )
    pipelines = parse_pipelines(text)
    assert sorted(pipelines) == ["p", "q"]
    assert pipelines["q"].qualified_output_table == "other.events"


# --- errors -------------------------------------------------------------------------------------------------------


def test_unknown_pipeline_key_is_rejected_with_its_path():
    message = config_error(pipeline_yaml(max_record_per_partition="10"))
    assert "invalid pipeline configuration" in message
    assert "pipelines.p.max_record_per_partition" in message
    assert "Extra inputs are not permitted" in message


def test_unknown_column_key_is_rejected_with_its_path():
    message = config_error(pipeline_yaml(columns="[{name: a, type: string, nullable: true}]"))
    assert "pipelines.p.columns.0.nullable" in message


def test_unknown_top_level_key_is_rejected():
    message = config_error(pipeline_yaml() + "version: 2\n")
    assert "version" in message
    assert "Extra inputs are not permitted" in message


def test_bad_column_type_is_rejected_with_its_path():
    message = config_error(pipeline_yaml(columns="[{name: a, type: varchar}]"))
    assert "pipelines.p.columns.0.type" in message
    assert ("unknown type 'varchar': one of string, long, int, double, boolean, timestamp, local_timestamp, date, "
            "time, jsonb, uuid, bytes, interval, decimal(p,s), local_timestamp(p), time(p)") in message
    assert "the precision must be 1 to 38" in config_error(pipeline_yaml(columns="[{name: a, type: 'decimal(40,2)'}]"))
    assert "the scale 0 to the precision" in config_error(pipeline_yaml(columns="[{name: a, type: 'decimal(4,5)'}]"))


def test_a_column_reads_a_path_of_the_value_or_the_key_or_a_header():
    columns = ("[{name: city, type: string, path: user.address.city}, {name: user_id, type: long, source: key}, "
               "{name: tenant, type: string, source: key, path: tenant}, "
               "{name: trace, type: string, source: 'header:trace-id', required: true}, {name: id, type: string}]")
    (pipeline,) = parse_pipelines(pipeline_yaml(columns=columns)).values()
    city, user_id, tenant, trace, plain = pipeline.columns
    assert (city.field_path, city.label, city.required_reason) == (
        ("user", "address", "city"), "field 'user.address.city'",
        "required field 'user.address.city' is missing or null")
    assert (user_id.source_kind, user_id.field_path, user_id.label) == ("key", (), "the Kafka key")
    assert (tenant.field_path, tenant.label) == (("tenant",), "field 'tenant' of the Kafka key")
    assert (trace.header, trace.label, trace.required_reason) == (
        "trace-id", "header 'trace-id'", "required column 'trace': header 'trace-id' is missing or null")
    assert plain.field_path == ("id",) and pipeline.reads_headers and pipeline.value.format == "json"
    whole = "[{name: user, type: jsonb}, {name: user_id, type: long, path: user.id}]"
    assert [c.name for c in parse_pipelines(pipeline_yaml(columns=whole))["p"].columns] == ["user", "user_id"]


@pytest.mark.parametrize(("columns", "problem"), [
    ("[{name: a, type: string, source: body}]", "source 'body' must be value, key or header:<name>"),
    ("[{name: a, type: string, path: 'a..b'}]", "must be object keys separated by dots"),
    ("[{name: a, type: string, path: 'a[0]'}]", "must be object keys separated by dots"),
    ("[{name: a, type: string, path: x}, {name: b, type: long, path: x}]", "columns 'a' and 'b' both read field 'x'"),
    ("[{name: a, type: string, path: user}, {name: b, type: long, path: user.id}]",
     "column 'a' reads field 'user', which holds the field column 'b' reads: only a jsonb column can read"),
    ("[{name: a, type: long, years: [2000, 2001]}]", "years apply to timestamp and date columns only"),
])
def test_a_column_that_cannot_be_read_is_refused(columns, problem):
    assert problem in config_error(pipeline_yaml(columns=columns))


def test_the_value_format_is_declared_json_by_default_or_by_name():
    assert parse_pipelines(pipeline_yaml())["p"].value.format == "json"
    assert parse_pipelines(pipeline_yaml() + "    value: json\n")["p"].value.format == "json"
    assert "pipelines.p.value.format" in config_error(pipeline_yaml() + "    value: {format: thrift}\n")


def test_an_avro_value_names_its_subject_or_takes_the_topics_and_refuses_what_applies_to_json():
    avro = parse_pipelines(pipeline_yaml() + "    value: {format: avro}\n")["p"]
    assert (avro.value.format, avro.value.subject_of("events")) == ("avro", "events-value")
    named = parse_pipelines(pipeline_yaml() + "    value: {format: avro, subject: shop.Order}\n")["p"]
    assert named.value.subject_of("events") == "shop.Order"
    assert "framing applies to format json" in config_error(
        pipeline_yaml() + "    value: {format: avro, framing: confluent}\n")
    assert "subject applies to format avro" in config_error(pipeline_yaml() + "    value: {subject: s}\n")
    assert "extra_fields applies to format json" in config_error(
        pipeline_yaml(extra_fields="dead_letter") + "    value: {format: avro}\n")
    keyed = pipeline_yaml(columns="[{name: id, type: string}, {name: t, type: string, source: key, path: t}]")
    assert "reads the whole key or header (no path)" in config_error(keyed + "    value: {format: avro}\n")


def test_bytes_are_read_from_avro_fields_and_whole_keys_or_headers_never_from_json():
    raw = "[{name: id, type: string}, {name: k, type: bytes, source: key}, {name: h, type: bytes, source: 'header:h'}]"
    assert parse_pipelines(pipeline_yaml(columns=raw))["p"].columns[1].type == kinds.BYTES
    in_json = pipeline_yaml(columns="[{name: id, type: string}, {name: blob, type: bytes}]")
    assert "column(s) blob: a bytes column reads an Avro bytes or fixed field" in config_error(in_json)
    in_key = pipeline_yaml(columns="[{name: id, type: string}, {name: k, type: bytes, source: key, path: k}]")
    assert "column(s) k: a bytes column reads an Avro bytes or fixed field" in config_error(in_key)
    assert parse_pipelines(in_json + "    value: {format: avro}\n")["p"].columns[1].type == kinds.BYTES


def test_a_json_value_is_bare_by_default_or_framed_as_confluents_serializers_write_it():
    assert parse_pipelines(pipeline_yaml())["p"].value.framing == "none"
    framed = parse_pipelines(pipeline_yaml() + "    value: {format: json, framing: confluent}\n")["p"]
    assert (framed.value.format, framed.value.framing) == ("json", "confluent")
    assert "pipelines.p.value.framing" in config_error(pipeline_yaml() + "    value: {framing: avro}\n")


def test_change_events_go_into_an_entity_table_named_by_the_row_image():
    entity = dict(write="upsert", key="[id]", columns="[{name: id, type: long}, {name: lsn, type: long, "
                  "path: source.lsn}, {name: op, type: string, path: op}]")
    events = parse_pipelines(pipeline_yaml(**entity) + "    value: {envelope: debezium}\n")["p"]
    assert (events.value.format, events.value.envelope) == ("json", "debezium")
    assert parse_pipelines(pipeline_yaml())["p"].value.envelope == "none"
    assert "envelope debezium applies change events to an entity table: declare write: upsert" in config_error(
        pipeline_yaml() + "    value: {envelope: debezium}\n")
    of_event = pipeline_yaml(**{**entity, "key": "[lsn]"}) + "    value: {envelope: debezium}\n"
    assert "key column(s) lsn: a change event's entity is named by its row image" in config_error(of_event)
    avro = parse_pipelines(pipeline_yaml(**{**entity, "columns": "null"})
                           + "    value: {format: avro, envelope: debezium}\n")["p"]
    assert avro.columns_from_reader_schema


def test_a_change_events_placeholder_is_debeziums_unless_declared_and_only_with_its_envelope():
    from kafka_ledger.model import debezium
    from kafka_ledger.sinks import sink_for

    entity = dict(write="upsert", key="[id]", columns="[{name: id, type: long}, {name: note, type: string}]")
    events = parse_pipelines(pipeline_yaml(**entity) + "    value: {envelope: debezium}\n")["p"]
    placeholder = events.value.debezium.unavailable_value_placeholder
    assert placeholder == "__debezium_unavailable_value" == debezium.UNAVAILABLE_PLACEHOLDER
    own = parse_pipelines(pipeline_yaml(**entity) + "    value: {envelope: debezium, debezium: "
                                                    "{unavailable.value.placeholder: '#gone'}}\n")
    assert own["p"].value.debezium.unavailable_value_placeholder == "#gone"
    assert "debezium applies to envelope debezium" in config_error(
        pipeline_yaml() + "    value: {debezium: {unavailable.value.placeholder: '#gone'}}\n")
    # The entity sink publishes what the merge needs to fill them, and so does its staging table.
    published = sink_for(events).published_columns()
    assert list(published)[-4:] == ["kafka_tombstone", "kafka_unavailable", "kafka_old_key", "kafka_new_key"]
    assert [c.name for c in sink_for(events).staged_extra()] == list(published)[-4:]
    assert not {"kafka_unavailable", "kafka_old_key"} & set(sink_for(parse_pipelines(pipeline_yaml(
        **entity))["p"]).published_columns())


def test_every_form_of_the_placeholder_debezium_writes():
    from kafka_ledger.model import debezium

    assert debezium.placeholder_texts("__debezium_unavailable_value") == (
        "__debezium_unavailable_value", "X19kZWJleml1bV91bmF2YWlsYWJsZV92YWx1ZQ==",
        "5f5f646562657a69756d5f756e617661696c61626c655f76616c7565",
        "5F5F646562657A69756D5F756E617661696C61626C655F76616C7565", '["__debezium_unavailable_value"]')
    assert debezium.placeholder_bytes("hex:00ff") == b"\x00\xff"
    assert debezium.placeholder_texts("hex:6869")[:2] == ("hi", "aGk=")


def test_a_change_events_columns_read_the_row_image_unless_they_name_the_events_own_fields():
    from kafka_ledger.formats.envelope import OP_COLUMN, DebeziumChanges

    events = parse_pipelines(pipeline_yaml(write="upsert", key="[id]", columns=(
        "[{name: id, type: long}, {name: city, type: string, path: address.city, required: true}, "
        "{name: lsn, type: long, path: source.lsn}, {name: op, type: string, path: op}, "
        "{name: tenant, type: string, source: 'header:tenant'}]")) + "    value: {envelope: debezium}\n")["p"]
    read = DebeziumChanges().reading(events)
    assert [(c.name, c.source, c.field_path, c.required) for c in read.columns] == [
        ("id", "value", ("after", "id"), False), ("city", "value", ("after", "address", "city"), False),
        ("lsn", "value", ("source", "lsn"), False), ("op", "value", ("op",), False),
        ("tenant", "header:tenant", (), False), (OP_COLUMN, "value", ("op",), False),
        ("debezium before id", "value", ("before", "id"), False)]
    assert [c.name for c in events.columns] == ["id", "city", "lsn", "op", "tenant"]  # the declaration is unchanged


@pytest.mark.parametrize("reserved", sorted(config.RESERVED_COLUMNS))
def test_reserved_column_names_are_rejected(reserved):
    message = config_error(pipeline_yaml(columns=f"[{{name: ok, type: string}}, {{name: {reserved}, type: long}}]"))
    assert "pipelines.p.columns.1.name" in message
    assert f"column name {reserved!r} is reserved" in message


def test_kafka_offset_column_name_is_rejected():
    message = config_error(pipeline_yaml(columns="[{name: kafka_offset, type: long}]"))
    assert "pipelines.p.columns.0.name" in message
    assert "'kafka_offset' is reserved" in message


@pytest.mark.parametrize("name", ["Bad", "1abc", "a-b", "a b", "", "x" * 64])
def test_column_name_must_be_an_identifier(name):
    message = config_error(pipeline_yaml(columns=f"[{{name: '{name}', type: long}}]"))
    assert "pipelines.p.columns.0.name" in message


def test_duplicate_columns_are_rejected():
    message = config_error(
        pipeline_yaml(columns="[{name: a, type: long}, {name: b, type: long}, {name: a, type: string}]")
    )
    assert "pipelines.p" in message
    assert "columns declared more than once: a" in message


def test_empty_columns_are_rejected():
    message = config_error(pipeline_yaml(columns="[]"))
    assert "pipelines.p.columns" in message


def test_empty_topics_are_rejected():
    message = config_error(pipeline_yaml(topics="[]"))
    assert "declare exactly one of topics" in message and "found none" in message


@pytest.mark.parametrize("topic", ["bad topic", "bad/topic", "t" * 250, "'ünïcode'"])
def test_invalid_topic_name_is_rejected(topic):
    message = config_error(pipeline_yaml(topics=f"[ok, {topic}]"))
    assert "pipelines.p.topics" in message
    assert "is not a valid Kafka topic name" in message


def test_topic_listed_twice_is_rejected():
    message = config_error(pipeline_yaml(topics="[a, b, a]"))
    assert "pipelines.p.topics" in message
    assert "more than once" in message


def test_invalid_pipeline_name_is_rejected():
    text = pipeline_yaml().replace("  p:", "  Bad-Name:")
    message = config_error(text)
    assert "pipelines.Bad-Name.name" in message
    assert "'Bad-Name' must match" in message


@pytest.mark.parametrize("field", ["output_table", "output_schema"])
def test_invalid_table_identifiers_are_rejected(field):
    message = config_error(pipeline_yaml(**{field: "Bad-Name"}))
    assert f"pipelines.p.{field}" in message
    assert "'Bad-Name' must match" in message


@pytest.mark.parametrize("value", ["0", "-5"])
def test_max_records_per_partition_below_one_is_rejected(value):
    message = config_error(pipeline_yaml(max_records_per_partition=value))
    assert "pipelines.p.max_records_per_partition" in message


def test_bad_start_position_is_rejected():
    message = config_error(pipeline_yaml(start_position="middle"))
    assert "pipelines.p.start_position" in message


def test_missing_required_fields_are_reported():
    assert "declare exactly one of topics" in config_error("pipelines:\n  p:\n    description: nothing else\n")
    assert "columns is required: the fields of the record" in config_error(
        "pipelines:\n  p:\n    topics: [t]\n    output_table: t\n")
    message = config_error("pipelines:\n  p:\n    topics: [t]\n    columns: [{name: x, type: int}]\n")
    assert "output_table is required: the table the postgres sink publishes into" in message


def test_an_iceberg_sink_names_its_table_and_a_partition_spec_of_its_columns():
    text = ("pipelines:\n  p:\n    topics: [t]\n    columns: [{name: at, type: timestamp}, {name: u, type: string}]\n"
            "    sink: {type: iceberg, namespace: ads, table: clicks, partition_by: ['days(at)', 'bucket(16, u)', "
            "kafka_partition], target_file_size_mb: 64}\n")
    pipeline = parse_pipelines(text)["p"]
    assert pipeline.qualified_output_table == "lake.ads.clicks" and pipeline.output_table is None
    assert pipeline.sink.partition_columns == ["at", "u", "kafka_partition"]
    assert parse_pipelines(pipeline_yaml(sink="postgres"))["p"].sink.type == "postgres"  # the short form
    for sink, problem in [
        ("{type: iceberg, namespace: ads, table: clicks, partition_by: ['days(nope)']}",
         "sink.partition_by names column(s) the table does not have: nope"),
        ("{type: iceberg, namespace: ads, table: clicks, partition_by: ['days(at']}", "is not a column or an Iceberg"),
        ("{type: iceberg, namespace: Ads, table: clicks}", "'Ads' must match"),
        ("{type: iceberg, table: clicks}", "sink.iceberg.namespace: Field required"),
        ("{type: lake}", "does not match any of the expected tags"),
    ]:
        assert problem in config_error(text.replace(text[text.index("{type: iceberg"):].rstrip("\n"), sink)), sink
    both = text.replace("    sink:", "    output_table: x\n    sink:")
    assert "output_table is for the postgres sink: an iceberg sink names its table in sink.table" in config_error(both)


def test_two_pipelines_writing_the_same_output_table_are_rejected():
    text = pipeline_yaml() + (
        "  q:\n    topics: [other]\n    output_table: events\n    columns: [{name: x, type: int}]\n"
    )
    message = config_error(text)
    assert "pipelines.q.output_table: public.events is already written by pipeline 'p'" in message


def test_invalid_yaml_is_a_config_error_naming_the_source():
    message = config_error("pipelines:\n  p: [unclosed\n", source="/etc/pipelines.yaml")
    assert "not valid YAML" in message


def test_non_mapping_top_level_is_a_config_error():
    message = config_error("- just\n- a list\n")
    assert "invalid pipeline configuration" in message


def test_default_source_is_string_marker():
    with pytest.raises(ConfigError, match=r"^<string>: "):
        parse_pipelines(pipeline_yaml(topics="[]"))


def test_config_error_is_a_value_error():
    assert issubclass(ConfigError, ValueError)


# --- files ---------------------------------------------------------------------------------------------------------


def test_load_pipelines_missing_path_is_config_error(tmp_path):
    missing = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError, match="cannot read pipelines file") as exc_info:
        load_pipelines(missing)
    assert str(missing) in str(exc_info.value)


def test_load_pipelines_error_names_the_file(tmp_path):
    path = tmp_path / "pipelines.yaml"
    path.write_text(pipeline_yaml(columns="[{name: a, type: varchar}]"))
    with pytest.raises(ConfigError) as exc_info:
        load_pipelines(path)
    assert str(exc_info.value).startswith(f"{path}: ")


def test_load_pipelines_uses_env_path(tmp_path, monkeypatch):
    path = tmp_path / "custom.yaml"
    path.write_text(pipeline_yaml())
    monkeypatch.setenv("KAFKA_LEDGER_PIPELINES", str(path))
    assert config.config_path() == path
    assert list(load_pipelines()) == ["p"]


def test_config_path_defaults_to_repo_file():
    assert config.config_path() == settings.DEFAULT_CONFIG_PATH
    assert settings.DEFAULT_CONFIG_PATH.parts[-2:] == ("config", "pipelines.yaml")


def test_get_pipeline_returns_the_named_pipeline(tmp_path):
    path = tmp_path / "pipelines.yaml"
    path.write_text(VALID)
    assert get_pipeline("views", path).output_table == "page_views"


def test_get_pipeline_unknown_name_lists_declared_names(tmp_path):
    path = tmp_path / "pipelines.yaml"
    path.write_text(VALID)
    with pytest.raises(ConfigError) as exc_info:
        get_pipeline("orders", path)
    message = str(exc_info.value)
    assert "pipeline 'orders' is not declared" in message
    assert str(path) in message
    assert "(declared: clicks, views)" in message


def test_get_pipeline_unknown_name_among_hundreds_names_twenty_and_counts_the_rest(tmp_path):
    path = tmp_path / "pipelines.yaml"
    path.write_text("pipelines:\n" + "".join(
        f"  p{n:03}:\n    topics: [t]\n    output_table: p{n:03}\n    columns: [{{name: id, type: string}}]\n"
        for n in range(200)))
    with pytest.raises(ConfigError, match=r"\(declared: p000, p001, .*, p019 and 180 more\)$"):
        get_pipeline("orders", path)


def test_get_pipeline_in_empty_file_says_none_declared(tmp_path):
    path = tmp_path / "pipelines.yaml"
    path.write_text("")
    with pytest.raises(ConfigError, match=r"\(declared: none\)"):
        get_pipeline("orders", path)


def test_repo_pipelines_file_declares_impressions():
    pipelines = load_pipelines(settings.DEFAULT_CONFIG_PATH)
    assert "impressions" in pipelines
    impressions = pipelines["impressions"]
    assert impressions.topics == ["impressions"]
    assert impressions.dag_id == "kafka_ledger__impressions"
    assert impressions.qualified_output_table == "public.impressions"
    assert get_pipeline("impressions") == impressions


@pytest.mark.parametrize("schedule", ["@hourly", "@daily", "*/15 * * * *", "0 3 * * 1-5", None])
def test_schedule_accepts_cron_expressions_presets_and_null(schedule):
    text = yaml.safe_dump({"pipelines": {"p": {"topics": ["t"], "output_table": "p", "schedule": schedule,
                                                "columns": [{"name": "a", "type": "string"}]}}})
    assert parse_pipelines(text)["p"].schedule == schedule


def test_schedule_that_is_not_cron_is_refused():
    text = yaml.safe_dump({"pipelines": {"p": {"topics": ["t"], "output_table": "p", "schedule": "every hour",
                                                "columns": [{"name": "a", "type": "string"}]}}})
    with pytest.raises(ConfigError, match=r"pipelines\.p\.schedule.*'every hour' is not a cron expression"):
        parse_pipelines(text)


# --- subscriptions and delivery modes ---------------------------------------------------------------------------


def test_topic_pattern_subscription_matches_whole_names_and_skips_internal_topics():
    pipeline = parse_pipelines(pipeline_yaml(topics="[]", topic_pattern="'orders\\.[a-z]+'"))["p"]
    assert pipeline.subscribes("orders.eu") and pipeline.subscribes("orders.us")
    assert not pipeline.subscribes("orders.eu.dlq") and not pipeline.subscribes("xorders.eu")
    assert pipeline.subscription == "topics matching /orders\\.[a-z]+/"
    internal = parse_pipelines(pipeline_yaml(topics="[]", topic_pattern="'.*'"))["p"]
    assert not internal.subscribes("__consumer_offsets")


def test_assignment_subscription_with_start_offsets():
    text = pipeline_yaml(
        topics="[]", assignment="[{topic: a, partition: 0, start_offset: 42}, {topic: a, partition: 2}]"
    )
    pipeline = parse_pipelines(text)["p"]
    assert [(a.topic, a.partition, a.start_offset) for a in pipeline.assignment] == [("a", 0, 42), ("a", 2, None)]
    assert pipeline.subscribes("a") and not pipeline.subscribes("b")


@pytest.mark.parametrize(
    "overrides, expected",
    [
        ({"topic_pattern": "'x.*'"}, "found topics, topic_pattern"),
        ({"topics": "[]", "topic_pattern": "'('"}, "is not a valid regular expression"),
        ({"topics": "[]", "assignment": "[{topic: a, partition: 0}, {topic: a, partition: 0}]"}, "assigned twice"),
        ({"topics": "[]", "assignment": "[{topic: 'a b', partition: 0}]"}, "not a valid Kafka topic name"),
        ({"topics": "[]", "assignment": "[{topic: a, partition: -1}]"}, "greater than or equal to 0"),
    ],
)
def test_bad_subscriptions_are_rejected(overrides, expected):
    assert expected in config_error(pipeline_yaml(**overrides))


def test_delivery_mode_defaults_to_exactly_once_and_is_validated():
    assert parse_pipelines(pipeline_yaml())["p"].delivery_mode == "exactly_once"
    for mode in ("at_least_once", "latest_only"):
        assert parse_pipelines(pipeline_yaml(delivery_mode=mode))["p"].delivery_mode == mode
    assert "pipelines.p.delivery_mode" in config_error(pipeline_yaml(delivery_mode="at_most_once"))


# --- timestamp forms and the Spark runtime ----------------------------------------------------------------------


def test_timestamp_columns_default_to_iso_text_or_epoch_seconds():
    (column,) = parse_pipelines(pipeline_yaml(columns="[{name: at, type: timestamp}]"))["p"].columns
    assert column.timestamp_formats == ("iso8601", "epoch_seconds") and column.epoch_unit == "epoch_seconds"


def test_timestamp_columns_declare_their_forms():
    columns = parse_pipelines(pipeline_yaml(columns=(
        "[{name: a, type: timestamp, formats: [epoch_millis]}, {name: b, type: timestamp, formats: [iso8601]},"
        " {name: c, type: timestamp, formats: [iso8601, epoch_micros]}]")))["p"].columns
    assert [(c.timestamp_formats, c.epoch_unit) for c in columns] == [
        (("epoch_millis",), "epoch_millis"), (("iso8601",), None), (("iso8601", "epoch_micros"), "epoch_micros")]


@pytest.mark.parametrize(("column", "problem"), [
    ("{name: a, type: timestamp, formats: [epoch_seconds, epoch_millis]}", "declare one epoch unit"),
    ("{name: a, type: long, formats: [epoch_millis]}", "formats apply to timestamp columns only"),
    ("{name: a, type: timestamp, formats: []}", "must list each accepted form once"),
    ("{name: a, type: timestamp, formats: [iso8601, iso8601]}", "must list each accepted form once"),
    ("{name: a, type: timestamp, formats: [unix]}", "columns.0.formats.0"),
])
def test_impossible_timestamp_forms_are_refused(column, problem):
    assert problem in config_error(pipeline_yaml(columns=f"[{column}]"))


def test_spark_runtime_is_connect_submit_or_the_deployment_default():
    assert parse_pipelines(pipeline_yaml())["p"].spark_runtime is None
    assert parse_pipelines(pipeline_yaml(spark_runtime="submit"))["p"].spark_runtime == "submit"
    assert "spark_runtime" in config_error(pipeline_yaml(spark_runtime="yarn"))


# --- one entry at a time ------------------------------------------------------------------------------------------

BROKEN = VALID + textwrap.indent(textwrap.dedent(
    """
    broken:
      topics: [broken]
      output_table: broken
      columns:
        - {name: id, type: varchar}
    not_a_mapping: 3
    steals_table:
      topics: [other]
      output_table: clicks
      columns: [{name: x, type: int}]
    """
), "  ")


def test_a_broken_entry_hides_no_other_pipeline():
    declarations = config.read_declarations(BROKEN, "pipelines.yaml")
    assert list(declarations.valid) == ["clicks", "views"]
    assert set(declarations.invalid) == {"broken", "not_a_mapping", "steals_table"}
    assert "pipelines.broken.columns.0.type" in declarations.invalid["broken"]
    assert "pipelines.not_a_mapping: must be a mapping" in declarations.invalid["not_a_mapping"]
    assert "already written by pipeline 'clicks'" in declarations.invalid["steals_table"]


def test_strict_loading_names_every_broken_entry():
    message = config_error(BROKEN)
    for field in ("pipelines.broken.columns.0.type", "pipelines.not_a_mapping", "pipelines.steals_table.output_table"):
        assert field in message


def test_get_pipeline_ignores_other_broken_entries_and_names_its_own(tmp_path):
    path = tmp_path / "pipelines.yaml"
    path.write_text(BROKEN)
    assert get_pipeline("views", path).output_table == "page_views"
    with pytest.raises(ConfigError) as exc_info:
        get_pipeline("broken", path)
    assert str(exc_info.value).startswith(f"{path}: pipeline 'broken' is invalid:\n  - pipelines.broken.columns.0.type")


def test_mirror_consumer_group_is_off_by_default_and_a_kafka_group_name_when_given():
    assert parse_pipelines(pipeline_yaml())["p"].mirror_consumer_group is None
    assert parse_pipelines(pipeline_yaml(mirror_consumer_group="kafka-ledger.p"))["p"].mirror_consumer_group \
        == "kafka-ledger.p"
    assert "pipelines.p.mirror_consumer_group" in config_error(pipeline_yaml(mirror_consumer_group="'a b'"))


# --- entity tables (write: upsert) --------------------------------------------------------------------------------

ENTITY_COLUMNS = "[{name: user_id, type: long}, {name: name, type: string}, {name: score, type: double}]"


def test_an_entity_table_declares_its_key_and_the_key_columns_become_required():
    pipeline = parse_pipelines(pipeline_yaml(write="upsert", key="[user_id]", columns=ENTITY_COLUMNS))["p"]
    assert pipeline.is_entity_table and pipeline.key == ["user_id"]
    assert [(c.name, c.required) for c in pipeline.columns] == [("user_id", True), ("name", False), ("score", False)]
    assert [c.name for c in pipeline.key_columns] == ["user_id"]
    appended = parse_pipelines(pipeline_yaml(columns=ENTITY_COLUMNS))["p"]
    assert (appended.write, appended.key, appended.is_entity_table) == ("append", [], False)


@pytest.mark.parametrize(
    "overrides, expected",
    [
        ({"write": "upsert"}, "write: upsert needs key"),
        ({"key": "[user_id]"}, "key is for write: upsert"),
        ({"write": "upsert", "key": "[nobody]"}, "key column 'nobody' is not a declared column"),
        ({"write": "upsert", "key": "[score]"}, "key column 'score' is a double"),
        ({"write": "upsert", "key": "[user_id, user_id]"}, "more than once"),
        ({"write": "upsert", "key": "[user_id]", "delivery_mode": "at_least_once"}, "at_least_once"),
        ({"write": "upsert", "key": "[user_id]", "output_table": "null",
          "sink": "{type: iceberg, namespace: lake, table: users}"}, "write: upsert needs sink postgres"),
        ({"write": "merge"}, "pipelines.p.write"),
    ],
)
def test_impossible_entity_tables_are_refused(overrides, expected):
    assert expected in config_error(pipeline_yaml(columns=ENTITY_COLUMNS, **overrides))


AVRO_WITHOUT_COLUMNS = "pipelines:\n  p:\n    topics: [t]\n    output_table: t\n    value: avro\n"


def test_an_avro_pipeline_may_leave_its_columns_to_its_reader_schema_until_they_are_given():
    pipeline = parse_pipelines(AVRO_WITHOUT_COLUMNS)["p"]
    assert pipeline.columns_from_reader_schema and pipeline.columns is None
    with pytest.raises(config.ColumnsUnknownError, match="takes its columns from its reader schema"):
        _ = pipeline.reads_headers
    given = pipeline.with_columns([{"name": "orderid", "type": "string", "path": "orderId"},
                                   {"name": "amount", "type": "decimal(12,2)"}])
    assert given == parse_pipelines(AVRO_WITHOUT_COLUMNS + "    columns: [{name: orderid, type: string, path: orderId},"
                                    " {name: amount, type: 'decimal(12,2)'}]\n")["p"]
    assert not given.columns_from_reader_schema and pipeline.columns is None


def test_columns_given_later_are_checked_as_if_the_file_held_them():
    upsert = parse_pipelines(AVRO_WITHOUT_COLUMNS + "    write: upsert\n    key: [order_id]\n")["p"]
    assert upsert.with_columns([{"name": "order_id", "type": "long"}]).columns[0].required
    with pytest.raises(ValueError, match="key column 'order_id' is not a declared column"):
        upsert.with_columns([{"name": "id", "type": "long"}])
    with pytest.raises(ValueError, match="column name 'kafka_offset' is reserved"):
        upsert.with_columns([{"name": "order_id", "type": "long"}, {"name": "kafka_offset", "type": "long"}])


def test_debeziums_settings_decide_what_json_columns_can_read_exactly():
    entity = dict(write="upsert", key="[id]", columns="[{name: id, type: long}, {name: amount, type: 'decimal(12,2)'}, "
                  "{name: at, type: local_timestamp}, {name: seen, type: 'time(3)'}]")
    # Precise numerics (Debezium's default) read their scale from the JsonConverter's schema (Kafka's default too).
    assert parse_pipelines(pipeline_yaml(**entity) + "    value: {envelope: debezium}\n")["p"]
    precise = config_error(pipeline_yaml(**entity) + "    value: {envelope: debezium, debezium: "
                                                     "{value.converter.schemas.enable: false}}\n")
    assert ("column(s) amount (decimal(12,2)): Debezium's decimal.handling.mode precise (its default) writes a numeric "
            "as its unscaled bytes") in precise
    assert ("declare it: `value: {envelope: debezium, debezium: {decimal.handling.mode: string, "
            "value.converter.schemas.enable: false}}`") in precise
    string = parse_pipelines(pipeline_yaml(**entity) + "    value: {envelope: debezium, debezium: "
                                                       "{decimal.handling.mode: string}}\n")["p"]
    assert string.value.debezium.decimal_handling_mode == "string"
    connect = config_error(pipeline_yaml(**entity) + "    value: {envelope: debezium, debezium: "
                                                     "{decimal.handling.mode: double, time.precision.mode: connect}}\n")
    assert "column(s) at (local_timestamp): Debezium's time.precision.mode connect writes milliseconds" in connect
    assert "seen" not in connect  # time(3): milliseconds lose nothing
    assert ("column(s) amount (decimal(12,2)): Debezium's decimal.handling.mode double writes a numeric as a binary "
            "float") in connect
    assert "pipelines.p.value.debezium.decimal.handling.mode" in config_error(
        pipeline_yaml(**entity) + "    value: {envelope: debezium, debezium: {decimal.handling.mode: exact}}\n")
    # Avro's decimals carry their scale: nothing to refuse.
    assert parse_pipelines(pipeline_yaml(**entity) + "    value: {format: avro, envelope: debezium}\n")["p"]


def test_debeziums_json_readings_follow_its_settings():
    from kafka_ledger.formats.json import readings

    events = parse_pipelines(pipeline_yaml(write="upsert", key="[id]", columns=(
        "[{name: id, type: long}, {name: doc, type: jsonb}, {name: day, type: date}, "
        "{name: at, type: local_timestamp}, {name: at3, type: 'local_timestamp(3)'}, {name: t, type: time}, "
        "{name: raw, type: bytes}, "
        "{name: lsn, type: long, path: source.lsn}, {name: ts, type: timestamp}]"))
        + "    value: {envelope: debezium, debezium: {binary.handling.mode: hex}}\n")["p"]
    from kafka_ledger.formats.envelope import DebeziumChanges

    assert {name: how for name, how in readings(DebeziumChanges().reading(events)).items() if " " not in name} == {
        "id": "typed", "doc": "json text", "day": "epoch days", "at": "epoch micros", "at3": "epoch millis",
        "t": "epoch micros", "raw": "hex", "lsn": "typed", "ts": "timestamp"}


def test_an_interval_of_a_change_event_needs_debeziums_exact_text():
    entity = dict(write="upsert", key="[id]", columns="[{name: id, type: long}, {name: span, type: interval}]")
    numeric = config_error(pipeline_yaml(**entity) + "    value: {envelope: debezium}\n")
    assert ("column(s) span: Debezium's interval.handling.mode numeric (its default) writes an interval as "
            "microseconds, a month counted as 30.4375 days") in numeric
    assert "debezium: {interval.handling.mode: string}}`" in numeric
    assert parse_pipelines(pipeline_yaml(**entity) + "    value: {envelope: debezium, debezium: "
                                                     "{interval.handling.mode: string}}\n")["p"]
    # Outside a change event's row image an interval is whatever text the producer writes.
    assert parse_pipelines(pipeline_yaml(columns="[{name: span, type: interval}]"))["p"]


def test_change_events_with_the_jsonconverters_schemas_may_leave_their_columns_out():
    entity = "pipelines:\n  p:\n    topics: [t]\n    output_table: t\n    write: upsert\n    key: [id]\n"
    derived = parse_pipelines(entity + "    value: {envelope: debezium}\n")["p"]
    assert derived.columns_from_reader_schema
    unschema = config_error(entity + "    value: {envelope: debezium, debezium: {value.converter.schemas.enable: "
                                     "false}}\n")
    assert ("columns is required: the fields of the record, one column each (format json has no schema to take them "
            "from: only Debezium's change events written with the JsonConverter's schemas carry one") in unschema
    assert "columns is required" in config_error("pipelines:\n  p:\n    topics: [t]\n    output_table: t\n")
