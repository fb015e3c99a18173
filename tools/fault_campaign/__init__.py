"""Fault-injection campaign: sequence-numbered records flow into Kafka while pipeline runs repeat, one fault each.

    bash scripts/fault_campaign.sh --faults 200 --seed 20261121      # sets up the stack, then runs this package

Each iteration runs the pipeline as Airflow runs its DAG, in the Spark runtime under test (`--runtime`):
every task in its own process, task retries, and a Spark task that fails for good marking its batch failed
(the DAG's on_failure_callback). With `connect` the tasks are plan, then read_and_commit (a Spark Connect
client of the warm server that publishes and commits in one transaction); with `submit` they are plan,
the Spark task through the Spark provider's SparkSubmitHook, then commit. One fault, drawn from the seed,
is injected into the iteration's run. The pipeline then recovers by its normal means only (a task
retry, or the next run), and the harness checks, from the ledger and the published tables:

- output ∪ dead letters == the records produced below the positions, as sets of (topic, partition, offset);
- no record twice;
- the committed ranges tile every partition from its start to its position, without gap or overlap;
- no position ever moved back.

At the end the producer stops, runs drain the backlog, every record produced is looked up by its sequence
number (good ones in the output with their content, bad ones in the dead letters with their reason), and
`kafka-ledger verify` reads Kafka back independently. The seed fixes the fault sequence, the variants and
the delays; where a timed kill lands depends on the machine, so the phase each fault hit is reported.
A checkpoint after every iteration lets an interrupted campaign go on with `--resume DIR`.

The package, by role: producer.py (the records and their producer), strikes.py (the faults: how each one is
injected and timed), runner.py (the Campaign: its runs, checks and checkpoints; the `task` sub-command),
report.py (the reliability docs written with --write-docs) and main.py (the command line). Run from the
project root: `python -m tools.fault_campaign --help` (scripts/fault_campaign.sh sets up the stack first).
"""

from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[2]


class CampaignFailure(AssertionError):
    """A check failed: a record lost or doubled, a ledger gap or overlap, or a position moving back."""
