"""A short fault campaign per Spark runtime: every kind of fault once, with the full campaign's checks.

The full campaign is `bash scripts/fault_campaign.sh --faults 200 ...` (see docs/reliability.md); this
runs the same harness with one fault of each kind, seeded by KAFKA_LEDGER_CAMPAIGN_SEED (default 4).
"""

from __future__ import annotations

import json
import os

import pytest
from integration_support import SECURED_SERVERS, secured_kafka_settings, spark_connect_on_cluster, stack

from kafka_ledger.config.services import KAFKA_CONFIG_ENV
from tools.fault_campaign.runner import Campaign
from tools.fault_campaign.strikes import FAULT_KINDS, NETWORK_FAULTS, fault_kinds

# They restart Kafka, Postgres and the Spark Connect server: on a stack of their own (scripts/test.sh).
pytestmark = [pytest.mark.integration, pytest.mark.own_stack]


@pytest.mark.parametrize("runtime", ["connect", "submit"])
def test_every_kind_of_fault_loses_and_doubles_nothing(dsn, servers, pipeline_factory, tmp_path, runtime):
    pipeline = pipeline_factory(f"campaign_{runtime}", partitions=4)
    kinds = FAULT_KINDS[runtime]
    seed = int(os.environ.get("KAFKA_LEDGER_CAMPAIGN_SEED", "4"))
    campaign = Campaign(pipeline, dsn, servers, seed=seed, faults=len(kinds), records_per_fault=1000,
                        workdir=tmp_path)
    assert campaign.runtime == runtime
    report = campaign.run_all()  # raises CampaignFailure, with the seed to reproduce, on the first failed check

    assert report["faults_by_kind"] == dict.fromkeys(kinds, 1)
    assert report["records_produced"] == len(kinds) * 1000
    assert (report["lost"], report["duplicated"], report["unexpected"], report["wrong_content"]) == (0, 0, 0, 0)
    assert report["output_rows"] + report["dead_letters"] == report["records_produced"]
    assert report["verify_ok"]
    missed = [it for it in report["iterations"] if "missed" in it["landed"]]
    assert not missed, f"faults that did not land: {missed}"


# Faults that strike the task and the ledger only (its commit, a second run, a retry, the plan task): the same on the
# production shape as in the connect runtime's own short campaign, which strikes them over the same verified TLS to
# the ledger; the production shape's short campaign spends its minutes where the shape changes the batch (the
# executors on the cluster, the Spark Connect server, Kafka over SASL_SSL). Its full campaign has every kind.
TASK_AND_LEDGER_FAULTS = ("kill_commit", "restart_postgres_in_commit", "racing_runs", "retry_after_success",
                          "crash_after_plan")


def test_every_kind_of_fault_on_the_production_shape_loses_and_doubles_nothing(
    dsn, pipeline_factory, tmp_path, monkeypatch
):
    """The connect runtime with its executors on the local standalone cluster (a lost worker among the faults),
    every Kafka client over SASL_SSL and the ledger over verified TLS (the stack's default): every fault where the
    shape has a part (TASK_AND_LEDGER_FAULTS aside)."""
    if os.environ.get("KL_LOCAL_SPARK_CONNECT", "1") != "1":
        pytest.skip("the local stack's Spark is not in use")
    pipeline = pipeline_factory("campaign_connect_cluster", partitions=4)
    try:
        with spark_connect_on_cluster() as master:
            monkeypatch.setenv("KAFKA_LEDGER_SPARK_MASTER", master)
            monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps({"conn_type": "spark", "host": master}))
            monkeypatch.setenv("KAFKA_LEDGER_BOOTSTRAP_SERVERS", SECURED_SERVERS)
            monkeypatch.setenv(KAFKA_CONFIG_ENV, json.dumps(secured_kafka_settings()))
            every_kind = fault_kinds("connect-cluster-secure")
            assert set(TASK_AND_LEDGER_FAULTS) < set(every_kind)
            kinds = tuple(kind for kind in every_kind if kind not in TASK_AND_LEDGER_FAULTS)
            seed = int(os.environ.get("KAFKA_LEDGER_CAMPAIGN_SEED", "4"))
            campaign = Campaign(pipeline, dsn, SECURED_SERVERS, seed=seed, faults=len(kinds), records_per_fault=1000,
                                workdir=tmp_path, kinds=kinds)
            assert campaign.shape == "connect-cluster-secure"
            report = campaign.run_all()
    finally:
        stack("stop-cluster")

    assert report["faults_by_kind"] == dict.fromkeys(kinds, 1)
    assert (report["lost"], report["duplicated"], report["unexpected"], report["wrong_content"]) == (0, 0, 0, 0)
    assert report["output_rows"] + report["dead_letters"] == report["records_produced"]
    assert report["verify_ok"]
    missed = [it for it in report["iterations"] if "missed" in it["landed"]]
    assert not missed, f"faults that did not land: {missed}"


def test_every_kind_of_network_fault_loses_and_doubles_nothing(dsn, servers, pipeline_factory, tmp_path):
    """The connect runtime's task reaching Kafka, the ledger and the Spark Connect server through Toxiproxy: added
    latency, a slow link and connections reset mid-stream on each, and the broker restarted while a read streams."""
    stack("proxies")
    pipeline = pipeline_factory("campaign_network", partitions=4)
    seed = int(os.environ.get("KAFKA_LEDGER_CAMPAIGN_SEED", "4"))
    campaign = Campaign(pipeline, dsn, servers, seed=seed, faults=len(NETWORK_FAULTS), records_per_fault=1000,
                        workdir=tmp_path, network=True, kinds=NETWORK_FAULTS)
    assert campaign.shape == "connect-network"
    report = campaign.run_all()

    assert report["faults_by_kind"] == dict.fromkeys(NETWORK_FAULTS, 1)
    assert (report["lost"], report["duplicated"], report["unexpected"], report["wrong_content"]) == (0, 0, 0, 0)
    assert report["output_rows"] + report["dead_letters"] == report["records_produced"]
    assert report["verify_ok"]
    missed = [it for it in report["iterations"] if "missed" in it["landed"]]
    assert not missed, f"faults that did not land: {missed}"


# Faults that strike before the sink has any part in the batch (its plan, Kafka under its read): the runtime's own
# short campaign covers them; a sink's short campaign spends its minutes where the sink changes the batch.
BEFORE_THE_SINK = ("restart_kafka_in_read", "crash_after_plan")


# spark-submit's twin in the long lane: in either runtime the Spark work commits an Iceberg sink's batch, and the
# default run strikes spark-submit's own faults on a Postgres sink.
@pytest.mark.parametrize("runtime", ["connect", pytest.param("submit", marks=pytest.mark.long)])
def test_every_kind_of_fault_on_an_iceberg_sink_loses_and_doubles_nothing(dsn, servers, pipeline_factory, tmp_path,
                                                                          runtime):
    """Each runtime publishing into the lake: its every fault where the sink has a part (the Spark work, which
    commits an Iceberg sink's batch, killed between its snapshot and the ledger's commit among the commit's fail
    points) and Postgres, the lake's catalog too, restarted while the snapshot is written; the table read back
    without Spark. The full campaign (docs/reliability.md) has every kind."""
    pipeline = pipeline_factory("campaign_iceberg" if runtime == "connect" else "campaign_iceberg_submit",
                                partitions=4)
    seed = int(os.environ.get("KAFKA_LEDGER_CAMPAIGN_SEED", "4"))
    kinds = tuple(kind for kind in fault_kinds(f"{runtime}-iceberg") if kind not in BEFORE_THE_SINK)
    campaign = Campaign(pipeline, dsn, servers, seed=seed, faults=len(kinds), records_per_fault=1000,
                        workdir=tmp_path, kinds=kinds)
    assert campaign.shape == f"{runtime}-iceberg"
    report = campaign.run_all()

    assert report["faults_by_kind"] == dict.fromkeys(kinds, 1)
    assert (report["lost"], report["duplicated"], report["unexpected"], report["wrong_content"]) == (0, 0, 0, 0)
    assert report["output_rows"] + report["dead_letters"] == report["records_produced"]
    assert report["verify_ok"]
    missed = [it for it in report["iterations"] if "missed" in it["landed"]]
    assert not missed, f"faults that did not land: {missed}"


# Faults that strike an entity table's merge (rows streaming into it, the commit's transaction, racing and repeated
# attempts); the connect runtime's own short campaign covers the rest on the same publish path.
ENTITY_MERGE_FAULTS = ("kill_task_in_read", "racing_attempts", "kill_commit", "restart_postgres_in_commit",
                       "racing_runs", "retry_after_success")


def test_every_kind_of_fault_on_an_entity_table_loses_and_doubles_nothing(dsn, servers, pipeline_factory, tmp_path):
    """An entity table (write: upsert) in the connect runtime: after each fault that strikes its merge, the table holds
    each entity's newest version (or its tombstone) of the records below the positions, exactly."""
    pipeline = pipeline_factory("campaign_entity", partitions=4)
    seed = int(os.environ.get("KAFKA_LEDGER_CAMPAIGN_SEED", "4"))
    campaign = Campaign(pipeline, dsn, servers, seed=seed, faults=len(ENTITY_MERGE_FAULTS), records_per_fault=1000,
                        workdir=tmp_path, kinds=ENTITY_MERGE_FAULTS)
    kinds = ENTITY_MERGE_FAULTS
    assert campaign.entity
    report = campaign.run_all()

    assert report["faults_by_kind"] == dict.fromkeys(kinds, 1)
    assert (report["lost"], report["duplicated"], report["unexpected"], report["wrong_content"]) == (0, 0, 0, 0)
    assert report["entities"] == report["output_rows"] > 0 and report["tombstones"] > 0
    assert report["verify_ok"]
    missed = [it for it in report["iterations"] if "missed" in it["landed"]]
    assert not missed, f"faults that did not land: {missed}"


def test_every_kind_of_fault_on_debeziums_change_events_loses_and_doubles_nothing(
        dsn, servers, pipeline_factory, tmp_path):
    """Debezium's change events into an entity table (envelope: debezium): after each fault that strikes its merge,
    the table holds each entity's newest row image, a deleted entity none (its delete in the tombstones), the Kafka
    tombstones after deletes change nothing, and the events not applied are dead letters with their reasons."""
    pipeline = pipeline_factory("campaign_change_events", partitions=4)
    seed = int(os.environ.get("KAFKA_LEDGER_CAMPAIGN_SEED", "5"))
    campaign = Campaign(pipeline, dsn, servers, seed=seed, faults=len(ENTITY_MERGE_FAULTS), records_per_fault=1000,
                        workdir=tmp_path, kinds=ENTITY_MERGE_FAULTS)
    assert campaign.entity and campaign.change_events
    report = campaign.run_all()

    assert report["faults_by_kind"] == dict.fromkeys(ENTITY_MERGE_FAULTS, 1)
    assert (report["lost"], report["duplicated"], report["unexpected"], report["wrong_content"]) == (0, 0, 0, 0)
    assert report["entities"] == report["output_rows"] > 0 and report["tombstones"] > 0
    assert report["dead_letters"] > 0
    assert report["verify_ok"]
    missed = [it for it in report["iterations"] if "missed" in it["landed"]]
    assert not missed, f"faults that did not land: {missed}"
