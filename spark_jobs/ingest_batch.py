"""spark-submit application of the `submit` runtime: read one ledger batch's exact Kafka ranges and stage them.

Launched by the pipeline DAG's Spark task (or `kafka-ledger replay`):

    spark-submit ... spark_jobs/ingest_batch.py --pipeline impressions --batch-id 42

The ledger is the only source of truth for what to read: the job takes a batch id, never offsets.
It needs KAFKA_LEDGER_DB_URL and KAFKA_LEDGER_BOOTSTRAP_SERVERS in its environment. The work itself is
kafka_ledger.ingest, shared with the Spark Connect runtime.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys

from kafka_ledger import ingest
from kafka_ledger.config import get_pipeline
from kafka_ledger.settings import bootstrap_servers, ledger_dsn


def run(pipeline_name: str, batch_id: int, config_path: str | None) -> int:
    pipeline = get_pipeline(pipeline_name, config_path)
    dsn, servers = ledger_dsn(), bootstrap_servers()
    attempt = ingest.begin(dsn, servers, pipeline, batch_id)
    if attempt is None:
        return 0
    if not attempt.readable:
        ingest.mark_nothing_to_read(dsn, attempt)
        return 0

    # A Spark Connect client in the launching process (the connect runtime's task, a test) marks its
    # environment for Spark Connect, and spark-submit passes the mark on: this job's session is a classic one.
    os.environ.pop("SPARK_CONNECT_MODE_ENABLED", None)
    from pyspark.sql import SparkSession  # heavy: only once we know there is work

    spark = SparkSession.builder.appName(f"kafka-ledger {pipeline.name} batch {batch_id}").getOrCreate()
    print(json.dumps(ingest.stage(spark, pipeline, attempt, dsn, servers)))
    spark.stop()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Read one kafka-ledger batch and stage its rows.")
    parser.add_argument("--pipeline", required=True, help="pipeline name, as declared in the pipelines file")
    parser.add_argument("--batch-id", required=True, type=int, help="ledger batch id to read")
    parser.add_argument("--config", default=os.environ.get("KAFKA_LEDGER_PIPELINES"), help="pipelines file")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stdout)
    return run(args.pipeline, args.batch_id, args.config)


if __name__ == "__main__":
    sys.exit(main())
