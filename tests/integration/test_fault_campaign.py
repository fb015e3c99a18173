"""A short fault campaign per Spark runtime: every kind of fault once, with the full campaign's checks.

The full campaign is `bash scripts/fault_campaign.sh --faults 200 ...` (see docs/reliability.md); this
runs the same harness with one fault of each kind, seeded by KAFKA_LEDGER_CAMPAIGN_SEED (default 4).
"""

from __future__ import annotations

import os

import pytest
from fault_campaign import FAULT_KINDS, Campaign

pytestmark = pytest.mark.integration


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
