"""spark-submit application of the `submit` runtime: read one ledger batch's exact Kafka ranges and stage them.

Launched by the pipeline DAG's Spark task (or `kafka-ledger replay`):

    spark-submit ... spark_jobs/ingest_batch.py --pipeline impressions --batch-id 42

The ledger is the only source of truth for what to read: the job takes a batch id, never offsets.
It needs KAFKA_LEDGER_DB_URL and KAFKA_LEDGER_BOOTSTRAP_SERVERS in its environment (runtimes/submit/spark_submit.py
spark_job_environment). The work itself is
kafka_ledger.runtimes.submit.job.run_job.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys

from kafka_ledger.config.settings import deployment_services
from kafka_ledger.ledger.db import EXIT_FENCED, AttemptFenced
from kafka_ledger.model.refusals import EXIT_REFUSED, Refusal
from kafka_ledger.runtimes.submit.job import run_job


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Read one kafka-ledger batch and stage its rows.")
    parser.add_argument("--pipeline", required=True, help="pipeline name, as declared in the pipelines file")
    parser.add_argument("--batch-id", required=True, type=int, help="ledger batch id to read")
    parser.add_argument("--config", help="pipelines file (default: $KAFKA_LEDGER_PIPELINES, as everywhere)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stdout)
    try:
        print(json.dumps(run_job(args.pipeline, args.batch_id, args.config, deployment_services())))
    except Refusal as exc:
        # A distinct exit code: the Airflow task fails at once instead of retrying what no retry can change.
        print(f"refused, not retried: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    except AttemptFenced as exc:
        # Another driver of the same batch carries it (a resubmission, a zombie): this one stops, having published
        # nothing; whoever launched it sees why by the exit code and this line.
        print(f"fenced: {exc}", file=sys.stderr)
        return EXIT_FENCED
    return 0


if __name__ == "__main__":
    sys.exit(main())
