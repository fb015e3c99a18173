"""A run that carries batch after batch: plan, read and commit the next one while data keeps coming, up to a budget.

A doorbell pipeline's run pays Airflow's cost of a run (scheduling it, starting its tasks) once for many batches:
after its first batch its Spark task plans the next catch-up batch, reads and commits it, and so on, at most one
batch every `poll_seconds`, until `carry_seconds` are spent, a plan finds nothing to read, or the task is stopped.
Each batch is planned in the ledger before it is read and committed in its own transaction, exactly as a batch of
its own run: a batch the run dies in is resumed, with the same ranges, by the task's retry or the next run.
While it carries, the run holds a lease in the ledger that keeps the doorbell quiet (renewed every
LEASE_RENEW_SECONDS by a thread of the task, so that a killed task's lease runs out within LEASE_SECONDS); the
doorbell rings again once the run has ended with data waiting.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from kafka_ledger.batch import commit
from kafka_ledger.batch import plan as planner
from kafka_ledger.batch.commit import CommitResult
from kafka_ledger.config.pipeline import PipelineConfig
from kafka_ledger.config.services import Services
from kafka_ledger.ledger import db as ledger

log = logging.getLogger(__name__)

# Who asked for the batches of a run the doorbell started, as the ledger records it.
REQUESTED_BY_DOORBELL = "doorbell"
# The lease runs out this long after its last renewal, and is renewed this often while the task lives.
LEASE_SECONDS = 30.0
LEASE_RENEW_SECONDS = 10.0


@dataclass
class Carried:
    """The batches a run carried after its first one, and why it stopped."""

    results: list[CommitResult] = field(default_factory=list)
    ended: str = "budget spent"


class CarryingLease:
    """The lease in the ledger by which a DAG run carries some pipelines' batches (one pipeline's, or a carrier's
    members'): their doorbells keep quiet while it is held. Renewed every LEASE_RENEW_SECONDS by a thread of this
    process, so that a killed task's lease runs out within LEASE_SECONDS."""

    def __init__(self, services: Services, pipelines: list[str], dag_id: str, run_id: str):
        self.services, self.pipelines, self.dag_id, self.run_id = services, pipelines, dag_id, run_id
        self._released = threading.Event()
        self._renewing: threading.Thread | None = None

    def _renew(self) -> None:
        with ledger.transaction(self.services.ledger) as cur:
            for pipeline in self.pipelines:
                ledger.hold_carrying_lease(cur, pipeline, self.dag_id, self.run_id, LEASE_SECONDS)

    def _keep_renewing(self) -> None:
        trouble = ""
        while not self._released.wait(LEASE_RENEW_SECONDS):
            try:
                self._renew()
                trouble = ""
            except Exception as exc:  # noqa: BLE001 - the ledger away a while: the lease may run out, nothing more
                if str(exc) != trouble:
                    log.warning("could not renew the carrying lease of run %s (%s): its doorbell may ring "
                                "meanwhile, which costs at most one empty run", self.run_id, exc)
                trouble = str(exc)

    def hold(self) -> None:
        """Take the lease, and keep renewing it from a thread of this process until `release()`."""
        self._renew()
        self._released.clear()
        self._renewing = threading.Thread(target=self._keep_renewing, name="carrying-lease", daemon=True)
        self._renewing.start()

    def release(self) -> None:
        self._released.set()
        if self._renewing is not None:
            self._renewing.join(timeout=LEASE_RENEW_SECONDS)
        with ledger.transaction(self.services.ledger) as cur:
            for pipeline in self.pipelines:
                ledger.release_carrying_lease(cur, pipeline, self.dag_id, self.run_id)


class CarryingRun:
    """The lease and loop of one DAG run carrying a pipeline's batches (see the module).

    `run_batch(batch_id)` reads and commits one planned batch here and now (the runtime's); `stop()`, from another
    thread (Airflow's on_kill), ends the loop before its next batch.
    """

    def __init__(self, services: Services, pipeline: PipelineConfig, dag_id: str, run_id: str,
                 run_batch: Callable[[int], CommitResult], *, seconds: float, pace_seconds: float):
        self.services, self.pipeline, self.dag_id, self.run_id = services, pipeline, dag_id, run_id
        self.run_batch = run_batch
        self.seconds, self.pace_seconds = seconds, pace_seconds
        # The budget counts from here: the task's start, just before its first batch.
        self.started = time.monotonic()
        self._stopped = threading.Event()
        self.lease = CarryingLease(services, [pipeline.name], dag_id, run_id)

    def hold(self) -> None:
        self.lease.hold()

    def release(self) -> None:
        self.lease.release()

    def stop(self) -> None:
        self._stopped.set()

    def carry_on(self) -> Carried:
        """The batches after the first one (started with the task), until the run should end."""
        carried = Carried()
        batch_started = self.started
        while True:
            # At most one batch every pace_seconds: the doorbell's own pace, so a carrying run looks for new data
            # as often as its doorbell would.
            next_start = batch_started + self.pace_seconds
            if next_start >= self.started + self.seconds:
                return carried
            if self._stopped.wait(max(0.0, next_start - time.monotonic())):
                carried.ended = "stopped"
                return carried
            batch_started = time.monotonic()
            planned = planner.plan_batch(self.services, self.pipeline, dag_id=self.dag_id, run_id=self.run_id,
                                         requested_by=REQUESTED_BY_DOORBELL, carrying=True)
            if planned.batch_id is None:
                carried.ended = "caught up"
                return carried
            carried.results.append(self.run_batch(planned.batch_id))
            # The mirror consumer group (if any) follows every batch, not only the run's last one.
            commit.mirror_positions(self.services, self.pipeline)
