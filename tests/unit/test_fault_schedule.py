"""The fault campaign's pure parts: a schedule reproducible from the seed, its records, and its report."""

import json
import random
from collections import Counter

import pytest

from tools.fault_campaign.producer import (
    BAD_EVERY,
    ENTITIES,
    entity_of,
    expected_reason,
    record_key,
    record_value,
    sequence_number,
)
from tools.fault_campaign.report import render_report, write_docs
from tools.fault_campaign.strikes import FAULT_KINDS, campaign_shape, fault_kinds, fault_schedule

CONNECT = FAULT_KINDS["connect"]


def test_the_same_seed_gives_the_same_schedule():
    assert fault_schedule(50, random.Random(7), CONNECT) == fault_schedule(50, random.Random(7), CONNECT)
    assert fault_schedule(50, random.Random(7), CONNECT) != fault_schedule(50, random.Random(8), CONNECT)


@pytest.mark.parametrize("runtime", ["connect", "submit"])
def test_every_kind_appears_once_per_round(runtime):
    kinds = FAULT_KINDS[runtime]
    schedule = fault_schedule(len(kinds) * 25, random.Random(20261121), kinds)
    rounds = len(kinds)
    for start in range(0, len(schedule) - rounds + 1, rounds):
        assert sorted(schedule[start:start + rounds]) == sorted(kinds)
    assert Counter(schedule) == dict.fromkeys(kinds, 25)


def test_the_warm_runtime_has_its_own_faults_and_the_common_ones():
    assert {"kill_task_in_read", "kill_spark_connect", "restart_spark_connect", "racing_attempts"} <= set(CONNECT)
    assert not {"kill_spark_submit", "kill_spark_driver"} & set(CONNECT)
    assert set(FAULT_KINDS["submit"]) & set(CONNECT) == {
        "kill_commit", "restart_postgres_in_commit", "restart_kafka_in_read", "racing_runs", "retry_after_success",
        "crash_after_plan"}


def test_a_short_schedule_still_has_every_kind_once():
    assert sorted(fault_schedule(len(CONNECT), random.Random(4), CONNECT)) == sorted(CONNECT)


def test_records_carry_their_sequence_number_and_bad_ones_their_reason():
    assert b'"event_id": "s7"' in record_value(7) and expected_reason(7) is None
    bad = [seq for seq in range(1000) if expected_reason(seq) is not None]
    assert bad == list(range(0, 1000, BAD_EVERY))
    assert len({expected_reason(seq) for seq in bad}) == 5  # every kind of bad record


def report_data(faults: int, records: int, runtime: str = "submit") -> dict:
    return {
        "command": "bash scripts/fault_campaign.sh --faults 200", "git_commit": "abc1234",
        "started_at": "2026-11-21T16:00:00+00:00", "elapsed_seconds": 9000.0,
        "faults_injected": faults, "records_produced": records, "output_rows": records - records // 50,
        "dead_letters": records // 50, "lost": 0, "duplicated": 0, "unexpected": 0, "wrong_content": 0,
        "verify_ok": True, "pipeline_runs": 260, "spark_tasks": 330, "runtime": runtime,
        "faults_by_kind": {"kill_commit": faults}, "fault_variants": {"kill_commit": {"commit_before_end": faults}},
        "fault_landings": {"kill_commit": {"commit task died at commit_before_end=kill": faults}},
    }


def test_the_report_shows_the_figures_and_flags_a_short_campaign():
    iterations = [{"fault": "kill_commit", "recovered_by": "task retry (commit)"}] * 3
    short = render_report({"submit": (report_data(3, 15_000), iterations)})
    assert "**This is not a full campaign**" in short and "## Runtime `submit`" in short
    assert "| **lost** | **0** |" in short and "| **duplicated** | **0** |" in short
    assert "| `kill_commit` | 3 | commit_before_end: 3 |" in short and "task retry (commit): 3" in short
    assert "bash scripts/fault_campaign.sh --faults 200" in short
    full = render_report({"submit": (report_data(200, 1_000_000), iterations)})
    assert "not a full campaign" not in full
    assert "| records produced | 1,000,000 |" in full and "took 2 h 30 min" in full
    assert "Commit `abc1234`, started" in full


def test_a_resumed_campaign_s_report_names_the_commit_of_each_session():
    data = {**report_data(200, 1_000_000), "git_commits": ["abc1234", "def5678"], "git_commit": "def5678",
            "sessions": 2, "interruptions": ["session 2 resumed after iteration 126: checks OK"]}
    report = render_report({"submit": (data, [])})
    assert "Commits `abc1234` (started), then `def5678` (resumed), started" in report
    assert "over 2 working sessions" in report and "session 2 resumed after iteration 126" in report


def test_a_doorbell_campaign_s_report_names_its_runs_rate_and_its_own_faults():
    data = {**report_data(200, 1_000_000, "connect"), "shape": "connect-network-doorbell", "rate": 6000.0,
            "records_per_fault": 5000, "airflow": "3.3.2", "runs_by_state": {"success": 250, "failed": 12},
            "faults_by_kind": {"kill_task_mid_carry": 100, "blackhole_kafka": 100},
            "fault_variants": {"kill_task_mid_carry": {"between batches": 100},
                               "blackhole_kafka": {"in a carried batch": 100}},
            "fault_landings": {"kill_task_mid_carry": {"task killed between batches": 100},
                               "blackhole_kafka": {"a blackhole (nothing passes either way) on Kafka in a carried "
                                                   "batch": 100}}}
    iterations = [{"fault": "kill_task_mid_carry", "recovered_by": "the doorbell's runs"}]
    report = render_report({"connect-network-doorbell": (data, iterations)})
    assert "## Runtime `connect`, through network proxies, run by its doorbell under Airflow" in report
    assert "not a full campaign" not in report and "produced at 6,000 records/s" in report
    assert "Airflow 3.3.2's own scheduler and triggerer" in report
    assert "| pipeline runs (by state) | 260 (success: 250, failed: 12) |" in report
    assert "| `kill_task_mid_carry` | 100 | between batches: 100 |" in report
    assert "| `blackhole_kafka` | 100 |" in report and "| `kill_commit` |" not in report


def test_a_change_event_campaign_s_report_counts_entities_and_deletes():
    from tools.fault_campaign.producer import change_effect, change_event, change_event_reason

    assert campaign_shape("connect", False, entity=True) == "connect-entity"
    assert campaign_shape("connect", False, entity=True, change_events=True) == "connect-cdc"
    assert fault_kinds("connect-cdc") == fault_kinds("connect")
    effects = Counter(change_effect(seq) for seq in range(1, 1101))
    assert effects == {"row": 882, "delete": 98, "none": 98, "dead letter": 22}
    assert change_event(7) is None and b'"op": "d"' in change_event(5) and change_event_reason(100) is not None
    data = {**report_data(200, 1_000_000, "connect"), "shape": "connect-cdc", "output_rows": 97, "tombstones": 0}
    report = render_report({"connect-cdc": (data, [{"fault": "kill_commit", "recovered_by": "next run"}])})
    assert "## Runtime `connect`, Debezium change events into an entity table" in report
    assert "| events produced | 1,000,000 |" in report and "| entities in the table (each its newest version) | 97 |" \
        in report and "| entities deleted (their deletes kept as tombstones) | 0 |" in report
    assert "the Kafka tombstones after deletes change nothing" in report


def test_each_runtime_keeps_its_last_campaign_in_the_docs(tmp_path):
    iterations = [{"fault": "kill_commit", "recovered_by": "task retry (Spark)"}]
    for runtime, faults in (("submit", 200), ("connect", 8)):
        data = report_data(faults, 40_000, runtime)
        write_docs({**data, "iterations": iterations}, data.pop("command"), tmp_path)
    figures = json.loads((tmp_path / "reliability.json").read_text())
    assert (figures["connect"]["faults_injected"], figures["submit"]["faults_injected"]) == (8, 200)
    report = (tmp_path / "reliability.md").read_text()
    assert report.index("## Runtime `connect`") < report.index("## Runtime `submit`")
    assert "warm Spark Connect server" in report and "one spark-submit per batch" in report


def test_a_campaign_on_a_cluster_adds_the_loss_of_a_worker_to_its_runtime_s_faults():
    from tools.fault_campaign.strikes import CLUSTER_FAULTS, campaign_shape, fault_kinds

    assert campaign_shape("connect", on_cluster=True) == "connect-cluster"
    assert campaign_shape("submit", on_cluster=False) == "submit"
    assert fault_kinds("connect-cluster") == FAULT_KINDS["connect"] + CLUSTER_FAULTS
    assert fault_kinds("submit") == FAULT_KINDS["submit"]
    assert "kill_spark_worker" in CLUSTER_FAULTS


def test_a_campaign_with_its_drivers_on_the_cluster_has_the_driver_faults_and_says_where_the_drivers_ran():
    from tools.fault_campaign.report import render_campaign
    from tools.fault_campaign.strikes import CLUSTER_FAULTS, campaign_shape, fault_kinds

    shape = campaign_shape("submit", on_cluster=True, secure=True, driver_in_cluster=True)
    assert shape == "submit-cluster-driver-secure"
    assert fault_kinds(shape) == FAULT_KINDS["submit"] + CLUSTER_FAULTS
    assert {"kill_spark_driver", "kill_spark_worker", "two_drivers"} <= set(fault_kinds(shape))
    report = "\n".join(render_campaign({**report_data(200, 1_000_000), "shape": shape}, []))
    assert "its driver on the cluster's worker (cluster deploy mode)" in report
    assert "in cluster deploy mode on the local standalone cluster" in report


def test_network_shapes_add_the_network_faults():
    from tools.fault_campaign.strikes import CLUSTER_FAULTS, NETWORK_FAULTS, campaign_shape, fault_kinds

    assert campaign_shape("connect", on_cluster=True, network=True) == "connect-cluster-network"
    assert campaign_shape("connect", True, network=True, secure=True) == "connect-cluster-secure-network"
    assert fault_kinds("connect-cluster-secure-network") == fault_kinds("connect-cluster-network")
    assert fault_kinds("connect-network") == FAULT_KINDS["connect"] + NETWORK_FAULTS
    assert fault_kinds("connect-cluster-network") == FAULT_KINDS["connect"] + CLUSTER_FAULTS + NETWORK_FAULTS
    assert len(set(NETWORK_FAULTS)) == 13


def test_tasks_reach_every_service_through_its_proxy(monkeypatch):
    from tools.fault_campaign.network import KAFKA, KAFKA_SASL, kafka_proxy, proxied_environment

    for name in ("KL_KAFKA_PORT", "KL_KAFKA_SASL_PORT", "KL_KAFKA_PROXY_PORT", "KL_KAFKA_SASL_PROXY_PORT",
                 "KL_PG_PORT", "KL_PG_PROXY_PORT", "KL_SPARK_CONNECT_PROXY_PORT"):
        monkeypatch.delenv(name, raising=False)
    env = {"KAFKA_LEDGER_BOOTSTRAP_SERVERS": "127.0.0.1:19094",
           "KAFKA_LEDGER_DB_URL": "postgresql://u:p@127.0.0.1:15432/kafka_ledger?sslmode=verify-full",
           "AIRFLOW_CONN_SPARK_CONNECT_DEFAULT": json.dumps(
               {"conn_type": "spark_connect", "host": "sc://127.0.0.1", "port": 19002}),
           "OTHER": "kept"}
    proxied = proxied_environment(env)
    assert proxied["KAFKA_LEDGER_BOOTSTRAP_SERVERS"] == "127.0.0.1:19098"  # SASL_SSL through its own proxy
    assert proxied["KAFKA_LEDGER_DB_URL"] == "postgresql://u:p@127.0.0.1:15433/kafka_ledger?sslmode=verify-full"
    assert '"port": 19003' in proxied["AIRFLOW_CONN_SPARK_CONNECT_DEFAULT"] and proxied["OTHER"] == "kept"
    assert proxied_environment({**env, "KAFKA_LEDGER_BOOTSTRAP_SERVERS": "127.0.0.1:19092"})[
        "KAFKA_LEDGER_BOOTSTRAP_SERVERS"] == "127.0.0.1:19097"
    assert (kafka_proxy("127.0.0.1:19094"), kafka_proxy("127.0.0.1:19092")) == (KAFKA_SASL, KAFKA)


def test_a_network_weight_repeats_each_network_fault_in_every_round():
    from tools.fault_campaign.strikes import NETWORK_FAULTS, fault_kinds, fault_schedule

    kinds = fault_kinds("connect-cluster-secure-network")
    schedule = fault_schedule(4 * (len(kinds) + 4 * len(NETWORK_FAULTS)), random.Random(7), kinds, network_weight=5)
    counts = Counter(schedule)
    assert {counts[kind] for kind in NETWORK_FAULTS} == {20}
    assert {counts[kind] for kind in kinds if kind not in NETWORK_FAULTS} == {4}
    assert fault_schedule(24, random.Random(7), kinds) == fault_schedule(24, random.Random(7), kinds, 1)


def test_an_entity_campaign_writes_versions_and_tombstones_of_few_entities_keyed_by_entity_and_sequence():
    values = {seq: record_value(seq, entity=True) for seq in range(1, 2000)}
    tombstones = [seq for seq, value in values.items() if value is None]
    assert tombstones and all(expected_reason(seq, entity=True) is None for seq in tombstones)
    assert json.loads(values[7])["event_id"] == entity_of(7) == f"u{7 % ENTITIES}"
    assert len({entity_of(seq) for seq in values}) == ENTITIES
    assert json.loads(record_key(7, entity=True)) == {"event_id": entity_of(7), "seq": 7}
    assert sequence_number(record_key(7, entity=True)) == sequence_number(record_key(7)) == 7
    # The bad null value is a tombstone in an entity campaign; every other bad record stays a dead letter.
    assert {expected_reason(seq, entity=True) for seq in range(0, 1000, BAD_EVERY)} == {
        expected_reason(seq) for seq in range(0, 1000, BAD_EVERY)} - {"null value (tombstone)"} | {None}


def test_an_avro_campaign_adds_the_registry_s_faults_and_reaches_it_through_its_proxy(monkeypatch):
    from tools.fault_campaign.network import registry_proxied_environment
    from tools.fault_campaign.strikes import NETWORK_FAULTS, REGISTRY_FAULTS, campaign_shape, fault_kinds

    assert campaign_shape("connect", False, network=True, registered="avro") == "connect-network-avro"
    assert fault_kinds("connect-network-avro") == FAULT_KINDS["connect"] + NETWORK_FAULTS + REGISTRY_FAULTS
    assert fault_kinds("submit-avro") == FAULT_KINDS["submit"] + REGISTRY_FAULTS
    assert campaign_shape("submit", False, registered="protobuf") == "submit-protobuf"
    assert fault_kinds("submit-protobuf") == FAULT_KINDS["submit"] + REGISTRY_FAULTS
    monkeypatch.setenv("KL_SCHEMA_REGISTRY_PORT", "18585")
    monkeypatch.setenv("KL_SCHEMA_REGISTRY_PROXY_PORT", "18586")
    env = {"KAFKA_LEDGER_SCHEMA_REGISTRY_URL": "http://127.0.0.1:18585/apis/ccompat/v7", "OTHER": "18585"}
    assert registry_proxied_environment(env) == {
        "KAFKA_LEDGER_SCHEMA_REGISTRY_URL": "http://127.0.0.1:18586/apis/ccompat/v7", "OTHER": "18585"}
    assert registry_proxied_environment(registry_proxied_environment(env)) == registry_proxied_environment(env)
    with pytest.raises(ValueError, match="not the stack's"):
        registry_proxied_environment({"KAFKA_LEDGER_SCHEMA_REGISTRY_URL": "https://registry.example.com"})


def test_avro_records_decode_with_confluent_s_deserializer_and_bad_ones_carry_their_reason():
    """The Avro campaign's records, against confluent-kafka's in-process registry: good ones decode to the values the
    final check expects (event_id s<seq>, amount seq), each bad kind has its reason, and a new version registered
    mid-way writes the records after it."""
    from confluent_kafka.schema_registry.avro import AvroDeserializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    from kafka_ledger.config.services import SchemaRegistry
    from tools.fault_campaign.producer import BAD_EVERY, AvroRecords

    client = SchemaRegistry("mock://campaign").client()
    records = AvroRecords(client, "t")
    decode = AvroDeserializer(client)
    context = SerializationContext("t", MessageField.VALUE)
    good = decode(records.value(7), context)
    assert (good["event_id"], good["amount"], records.reason(7)) == ("s7", 7, None)
    reasons = {records.reason(seq) for seq in range(0, 5 * BAD_EVERY, BAD_EVERY)}
    assert reasons == {
        "value is not in Confluent's wire format (a magic byte 0 and a 4-byte schema id before the payload)",
        "schema id 2147483647 is not a version of subject t-value",
        f"value does not decode with its writer schema (id {records.first_id})",
        "required field 'event_id' is missing or null", "null value (tombstone)"}
    assert decode(records.value(3 * BAD_EVERY), context)["event_id"] is None
    newer = records.evolve()
    assert int.from_bytes(records.value(8)[1:5], "big") == newer != records.first_id
    assert decode(records.value(8), context) == {**decode(records.value(8), context), "event_id": "s8", "note_5": ""}
    # A resumed campaign's records: the newest version of the subject.
    assert int.from_bytes(AvroRecords(client, "t").value(9)[1:5], "big") == newer


def test_protobuf_records_decode_with_confluent_s_deserializer_and_bad_ones_carry_their_reason():
    """The Protobuf campaign's records, against confluent-kafka's in-process registry: good ones decode to the values
    the final check expects, each bad kind has its reason, and a new version registered mid-way writes the records
    after it (a resumed campaign's too)."""
    from confluent_kafka.serialization import MessageField, SerializationContext

    from kafka_ledger.config.services import SchemaRegistry
    from kafka_ledger.formats.framing import NOT_FRAMED
    from tools.fault_campaign.producer import BAD_EVERY, ProtobufRecords

    client = SchemaRegistry("mock://protobuf-campaign").client()
    records = ProtobufRecords(client, "t")
    first = records.first_id
    assert records.value(7)[:6] == b"\x00" + first.to_bytes(4, "big") + b"\x00" and records.reason(7) is None
    reasons = {records.reason(seq) for seq in range(0, 6 * BAD_EVERY, BAD_EVERY)}
    assert reasons >= {NOT_FRAMED, "schema id 2147483647 is not a version of the topic's subject",
                       f"bad message index [3]: schema id {first} has no such message",
                       "required field 'event_id' is missing or null", "null value (tombstone)"}
    assert len(reasons) == 6
    newer = records.evolve()
    assert int.from_bytes(records.value(8)[1:5], "big") == newer != first
    resumed = ProtobufRecords(client, "t")
    assert (resumed.first_id, int.from_bytes(resumed.value(9)[1:5], "big")) == (first, newer)
    assert SerializationContext("t", MessageField.VALUE)


@pytest.mark.parametrize("failed", [0, 2])
def test_the_doorbell_campaign_sees_a_carrier_s_failed_cycle_in_the_line_the_carrier_logs(failed, monkeypatch):
    from kafka_ledger.runtimes.connect import carrier as carrier_module
    from tools.fault_campaign.doorbell import FAILED_CYCLE

    def begin(pipelines, cycle, **_):
        cycle.failures.update({f"member_{i}": TimeoutError("timeout expired") for i in range(failed)})
        cycle.caught_up.append("member_caught_up")
        return []

    logged = []
    monkeypatch.setattr(carrier_module, "log", type("Log", (), {"info": lambda self, msg, *args: logged.append(
        msg % args)})())
    carrier = carrier_module.Carrier("campaign", services=None)
    monkeypatch.setattr(carrier, "begin", begin)
    monkeypatch.setattr(carrier, "publish", lambda members, cycle: None)
    carrier.carry([])
    assert logged and bool(FAILED_CYCLE.search(logged[-1])) == (failed > 0)
