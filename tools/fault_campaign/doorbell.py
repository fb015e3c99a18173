"""The doorbell's faults: a pipeline run by its doorbell under a real Airflow, its triggerer, scheduler and carrying
task killed, the Spark Connect server restarted.

    bash scripts/fault_campaign.sh --doorbell --faults 20      # starts a dedicated Airflow (tools/airflow_server.py)

Nothing here runs a task: Airflow's scheduler and triggerer do, as in production, and scripts/airflow.sh starts a
killed component again. Each iteration lets the producer write its records and strikes once:

- kill_triggerer_mid_poll: SIGKILL to the triggerer (and its trigger runner) at a random moment while the records
  arrive, before or after its ring, or after it was frozen (SIGSTOP) as they began, so that its ring for them is
  lost; its successor takes the doorbell over once the dead one's heartbeat is
  `[triggerer] triggerer_health_check_threshold` old and rings again: a lost or a second ring.
- kill_scheduler_with_run_queued: SIGKILL to the scheduler (its executor and task processes with it) with a
  doorbell run queued: either the ring waits in the asset queue while the scheduler is frozen and then killed
  (the new scheduler must create the run), or the run exists, queued or just started, when it dies (its task
  instances are reset as orphans, the batch resumed with the same ranges).
- kill_task_mid_carry: SIGKILL to the Spark task of a run carrying batch after batch (batch/carry.py) while the
  records keep coming, in a batch after its first (its attempt begun) or between two; Airflow retries the task,
  which resumes the open batch with its ranges and carries on, or the run fails and, its lease run out, the doorbell
  starts one that does.
- restart_spark_connect_mid_carry: the Spark Connect server stopped and started while a carrying run's batch (after
  its first) is being read; the attempt fails, publishing nothing, and the task's retry or the next run resumes it.
- with `--network` (Airflow's tasks and triggerer reach Kafka, the ledger and the Spark Connect server through
  Toxiproxy), every network fault of strikes.NETWORK_FAULTS, struck in a carried batch: a latency or a slow link held
  HOLD_SECONDS while the run carries on through it, connections reset for a second, a blackhole held until the
  carrying task has failed by its own bounds (a carrier's task outlives its failing cycles, whose members' batches
  stay open for the next: until one of its cycles has failed by those bounds), the broker restarted while reads are
  slowed to 8 KB/s.

While a strike waits for its moment and holds, the records keep coming at the campaign's rate (`--rate`), so that
the run it strikes carries batch after batch as it would under a steady load; a triggerer or a scheduler is killed
with the records still coming too.

Then the doorbell's runs must publish every record produced so far, with no run left active, and the campaign's
checks hold (runner.Campaign.check: output and dead letters are exactly the records below the positions, the
ledger tiles each partition, no position moved back); at the end, the full record-by-record check and verify.
"""

from __future__ import annotations

import os
import re
import signal
import time
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime
from importlib.metadata import version
from pathlib import Path
from typing import Any

from kafka_ledger.airflow.dags import SPARK_TASK, carrier_doorbell_asset, doorbell_asset
from kafka_ledger.config.pipeline import read_pipelines
from kafka_ledger.ledger import sql
from kafka_ledger.runtimes.connect import CARRY_TASK
from tools.airflow_server import AirflowClient, component_processes, kill_component, task_process
from tools.fault_campaign import CampaignFailure
from tools.fault_campaign.producer import SequenceProducer
from tools.fault_campaign.runner import Campaign, IterationReport
from tools.fault_campaign.strikes import BLACKHOLE_LIMIT, NETWORK_FAULTS, SERVICES

# Every (fault, variant) once per round, in an order drawn from the seed: a 7-fault campaign strikes each.
STRIKES = (("kill_triggerer_mid_poll", "mid-poll"),
           ("kill_triggerer_mid_poll", "frozen as the records began"),
           ("kill_scheduler_with_run_queued", "ring queued while the scheduler was frozen"),
           ("kill_scheduler_with_run_queued", "run created"),
           ("kill_task_mid_carry", "in a carried batch"),
           ("kill_task_mid_carry", "between batches"),
           ("restart_spark_connect_mid_carry", "in a carried batch"))
# The strikes that leave the stack's services alone: a campaign beside other work on the same stack (the tests'
# shared lane) strikes only these.
AIRFLOW_STRIKES = tuple(strike for strike in STRIKES if strike[0] != "restart_spark_connect_mid_carry")
# How long the doorbell may take to publish an iteration's records after its fault: a killed triggerer's doorbell
# waits for its successor until the dead one's heartbeat is 30 s old; a killed scheduler's task instances wait as
# long for their scheduler to count as dead, then for the orphaned-task check (every 15 s in the test Airflow).
CATCH_UP_SECONDS = 300
# How long a ring may take once records wait (the doorbell looks every second in the campaign's pipeline).
RING_SECONDS = 60
# How long a carrying strike waits for its moment (in a carried batch, between two) before striking as things are.
MOMENT_SECONDS = 5.0
# With --network: every network fault, struck in a carried batch; a latency or a slow link is held this long.
NETWORK_STRIKES = tuple((kind, "in a carried batch") for kind in NETWORK_FAULTS)
HOLD_SECONDS = 10.0
# A carrier's cycle that failed, as its task logs it (runtimes/connect/carrier.py, Carrier.carry).
FAILED_CYCLE = re.compile(r"carrier \S+: \d+ pipeline\(s\) committed .*, [1-9]\d* failed")


class DoorbellCampaign(Campaign):
    """A campaign whose runs Airflow starts by the pipeline's doorbell; `airflow`: the client of the Airflow that
    runs them, started by this process (its components are found by the session id)."""

    def __init__(self, pipeline: Any, dsn: str, servers: str, seed: int, faults: int, records_per_fault: int,
                 workdir: Any, airflow: AirflowClient, strikes: tuple[tuple[str, str], ...] = STRIKES,
                 network: bool = False, rate: float | None = None):
        if pipeline.doorbell is None:
            raise CampaignFailure(f"pipeline {pipeline.name} has no doorbell (`trigger: doorbell`)")
        if airflow.session_id is None:
            raise CampaignFailure("the doorbell campaign kills Airflow's components: start it with running_airflow()")
        strikes = strikes + (NETWORK_STRIKES if network else ())
        kinds = tuple(dict.fromkeys(kind for kind, _ in strikes))
        super().__init__(pipeline, dsn, servers, seed, faults, records_per_fault, workdir, rate=rate,
                         network=network, kinds=kinds)
        self.airflow = airflow
        rounds = -(-faults // len(strikes))
        self.strikes = [strike for _ in range(rounds) for strike in self.rng.sample(strikes, len(strikes))][:faults]
        self.schedule = [kind for kind, _ in self.strikes]
        self.shape = f"{self.shape}-doorbell"
        # A carried pipeline's doorbell runs are its carrier's (runtimes/connect/carrier.py).
        self.carrier = read_pipelines().carrier(pipeline.carrier) if pipeline.carrier else None
        if self.carrier is not None:
            self.shape = f"{self.shape}-carrier"
        self.dag_id = self.carrier.dag_id if self.carrier else pipeline.dag_id
        self.spark_task = CARRY_TASK if self.carrier else SPARK_TASK[self.runtime]
        self._asset_id: int | None = None

    @classmethod
    def resume_under(cls, airflow: AirflowClient, pipeline: Any, dsn: str, servers: str,
                     workdir: Path) -> DoorbellCampaign:
        """The doorbell campaign saved in `workdir`, its runs now started by `airflow`, ready to go on after its
        last completed iteration."""
        state = cls.saved_state(workdir)
        campaign = cls(pipeline, dsn, servers, state["seed"], state["faults"], state["records_per_fault"], workdir,
                       airflow, network="network" in state["shape"].split("-"), rate=state["rate"])
        # The strikes drawn when it began (a campaign of some strikes only draws from fewer).
        campaign.strikes = [(kind, variant) for kind, variant in state["strikes"]]
        campaign.schedule = [kind for kind, _ in campaign.strikes]
        campaign.kinds = tuple(kind for kind in campaign.kinds if kind in campaign.schedule)
        campaign.restore(state)
        return campaign

    def saved_extra(self) -> dict[str, Any]:
        return {"strikes": self.strikes}

    # --- what Airflow shows -------------------------------------------------------------------------------
    def rings(self) -> int:
        """How many times the doorbell has rung: the asset events of its asset."""
        if self._asset_id is None:
            name = (carrier_doorbell_asset(self.carrier) if self.carrier else doorbell_asset(self.pipeline)).name
            assets = self.airflow.request("GET", "/api/v2/assets", params={"name_pattern": name}).json()["assets"]
            ids = [asset["id"] for asset in assets if asset["name"] == name]
            if not ids:
                return 0
            self._asset_id = ids[0]
        return self.airflow.request("GET", "/api/v2/assets/events", params={
            "asset_id": self._asset_id, "limit": 1}).json()["total_entries"]

    def _committed(self) -> int:
        rows = self._query("SELECT coalesce(sum(position - coalesce(start_offset, 0)), 0) FROM kafka_ledger.positions "
                           "WHERE pipeline = %(p)s", {"p": self.pipeline.name})
        return int(rows[0][0])

    def _poll(self, what: str, done: Callable[[], Any], timeout: float, interval: float = 0.2) -> Any:
        deadline = time.monotonic() + timeout
        while not (result := done()):
            if time.monotonic() > deadline:
                raise CampaignFailure(f"{what} did not happen within {timeout:.0f} s\n"
                                      + self.airflow.describe_runs(self.dag_id, self.airflow.runs(self.dag_id)[-3:]))
            time.sleep(interval)
        return result

    def catch_up(self, when: str) -> int:
        """Wait until every record produced so far is published and no run is active; returns the runs so far."""
        self.journal_landed()
        produced = sum(self.producer.delivered.values())
        self._poll(f"{when}: the doorbell's runs publishing all {produced} records",
                   lambda: self._committed() >= produced, CATCH_UP_SECONDS, interval=1.0)
        return len(self.airflow.wait_until_idle(self.dag_id, timeout=CATCH_UP_SECONDS, settle=3))

    def _carrying_run(self) -> str | None:
        rows = self._query(sql.SELECT_CARRYING_RUN, {"pipeline": self.pipeline.name})
        return rows[0][0] if rows else None

    def _run_batches(self, run_id: str) -> tuple[int, int]:
        """(batches the run committed, its unfinished batches whose attempt has begun)."""
        rows = self._query(
            "SELECT count(*) FILTER (WHERE status = 'committed'), "
            "count(*) FILTER (WHERE status NOT IN ('committed', 'abandoned') AND attempts > 0) "
            "FROM kafka_ledger.batches WHERE pipeline = %(p)s AND run_id = %(r)s",
            {"p": self.pipeline.name, "r": run_id})
        return int(rows[0][0]), int(rows[0][1])

    def _keep_flowing(self) -> None:
        """Let the producer go on at its rate for about a second more (called while a strike waits or holds)."""
        waiting = self.producer.quota - self.producer.next_seq
        if waiting < self.rate:
            self.producer.allow(int(self.rate) - max(waiting, 0))

    def _flow_for(self, seconds: float, until: Callable[[], bool] = lambda: False) -> bool:
        """Keep the records coming for `seconds`, or until `until()`; whether `until()` came first."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if until():
                return True
            self._keep_flowing()
            time.sleep(0.05)
        return until()

    def _carried_batch(self, variant: str) -> tuple[str, str]:
        """While the records keep coming, wait for a run carrying batches, then for it to be in a batch after its
        first or between two (`variant`); (the run's id, where the strike lands in words)."""
        self.producer.allow(self.records_per_fault)
        self.producer.wait_delivered_some(1, timeout=30)
        run_id = self._poll("a run carrying batches", lambda: self._keep_flowing() or self._carrying_run(),
                            RING_SECONDS, interval=0.05)

        def moment() -> bool:
            committed, reading = self._run_batches(run_id)
            # After the run's first batch (the plan task's): in, or between, the batches it carries on its own.
            return committed > 0 and (reading > 0) == (variant == "in a carried batch")

        # A loaded machine may leave no gap between two batches (each takes longer than the pace): after a while
        # the strike lands as things are, and says so.
        missed = "" if self._flow_for(MOMENT_SECONDS, moment) else \
            f", not seen within {MOMENT_SECONDS:.0f} s: struck as it was"
        committed, reading = self._run_batches(run_id)
        return run_id, f"{variant}{missed} (the run had carried {committed} batch(es), {reading} open)"

    def _spark_task(self, run_id: str) -> dict[str, Any] | None:
        spark = [ti for ti in self.airflow.task_instances(self.dag_id, run_id) if ti["task_id"] == self.spark_task]
        return spark[0] if spark else None

    def _spark_task_process(self, run_id: str) -> int | None:
        task = self._spark_task(run_id)
        return task_process(task["id"]) if task else None

    def _failed_cycles(self, run_id: str, try_number: int) -> int:
        """The carrier's cycles that failed in the run's carrying task's try, by its log."""
        lines = self.airflow.task_log(self.dag_id, run_id, self.spark_task, try_number)
        return sum(1 for line in lines if FAILED_CYCLE.search(line))

    def _bounded(self, run_id: str) -> Callable[[], bool]:
        """Whether the carrying task has since failed by its bounds: its process ended, or (a carrier, whose task
        goes on) a cycle of its failed."""
        task = self._spark_task(run_id)
        pid = task_process(task["id"]) if task else None
        if pid is None:
            return lambda: True
        if self.carrier is None:
            return lambda: not os.path.exists(f"/proc/{pid}")
        failed_before, looked = self._failed_cycles(run_id, task["try_number"]), time.monotonic()

        def bounded() -> bool:
            nonlocal looked
            if not os.path.exists(f"/proc/{pid}"):
                return True
            if time.monotonic() - looked < 1.0:  # the log is fetched whole: once a second
                return False
            looked = time.monotonic()
            return self._failed_cycles(run_id, task["try_number"]) > failed_before

        return bounded

    def strike_carrying(self, kind: str, variant: str) -> str:
        """Kill a carrying run's Spark task, in a batch or between two, or restart the Spark Connect server in one."""
        run_id, where = self._carried_batch(variant)
        if kind == "restart_spark_connect_mid_carry":
            self._stack("restart-spark-connect")
            return f"Spark Connect server restarted {where}"
        pid = self._spark_task_process(run_id)
        if pid is None:  # the run ended meanwhile (it caught up): the iteration says the strike missed
            return f"missed: the carrying run {run_id} had ended ({where})"
        os.kill(pid, signal.SIGKILL)
        return f"task killed {where}"

    def strike_network(self, kind: str, variant: str) -> str:
        """A network fault on the proxy in front of one service while a run carries a batch (see the module)."""
        fault = self.network_fault(kind)
        run_id, where = self._carried_batch(variant)
        name = f"campaign-{kind}"
        try:
            if fault.effect == "restart":
                self.network.add(fault.proxy, f"{name}-downstream", *fault.toxic)
                self._stack("restart-kafka")
                return f"Kafka broker restarted {where}, its reads slowed to 8 KB/s"
            # Its failed cycles counted before the blackhole: the next to fail is the one the blackhole's bounds end.
            bounded = self._bounded(run_id) if fault.effect == "blackhole" else None
            for stream in fault.streams:
                self.network.add(fault.proxy, f"{name}-{stream}", *fault.toxic, stream=stream)
            if fault.effect == "reset":
                self._flow_for(1.0)  # every connection that carries data meanwhile is reset
            elif fault.effect == "blackhole":
                # Until the carrying task has failed: its bounds (docs/how-it-works.md#every-wait-is-bounded) end it.
                if not self._flow_for(BLACKHOLE_LIMIT, bounded):
                    raise CampaignFailure(f"{fault.what} on {SERVICES[fault.service]} {where}: the task still waited "
                                          f"after {BLACKHOLE_LIMIT} s")
            else:
                self._flow_for(HOLD_SECONDS)
            return f"{fault.what} on {SERVICES[fault.service]} {where}"
        finally:
            for stream in fault.streams:
                self.network.remove(fault.proxy, f"{name}-{stream}")

    # --- the faults ---------------------------------------------------------------------------------------
    def strike(self, kind: str, variant: str, runs_before: int) -> str:
        """Let the iteration's records come and strike; returns where the fault landed."""
        if kind in ("kill_task_mid_carry", "restart_spark_connect_mid_carry"):
            return self.strike_carrying(kind, variant)
        if kind in NETWORK_FAULTS:
            return self.strike_network(kind, variant)
        sid = self.airflow.session_id
        delay = self.rng.uniform(0.0, 3.0)
        rings_before = self.rings()
        if variant == "frozen as the records began":
            # Its poll cannot see them: the ring for them is lost with it, its successor's must come.
            for pid in component_processes(sid, "triggerer"):
                os.kill(pid, signal.SIGSTOP)
        elif variant == "ring queued while the scheduler was frozen":
            os.kill(component_processes(sid, "scheduler")[0], signal.SIGSTOP)
        # The records keep coming at the campaign's rate until the kill, as they would under a steady load.
        self.producer.allow(self.records_per_fault)
        if kind == "kill_triggerer_mid_poll":
            self.producer.wait_delivered_some(1, timeout=30)
            self._flow_for(delay)
            rung = self.rings() > rings_before
            kill_component(sid, "triggerer")  # SIGKILL ends a stopped process too
            return f"{'after' if rung else 'before'} its ring (killed {delay:.1f} s after the records began)"
        if variant == "ring queued while the scheduler was frozen":
            try:
                self._poll("a ring while the scheduler was frozen",
                           lambda: self._keep_flowing() or self.rings() > rings_before, RING_SECONDS)
            finally:
                kill_component(sid, "scheduler")  # SIGKILL ends a stopped process too
            return "frozen, then killed with the ring waiting in the asset queue"
        run = self._poll("a doorbell run", lambda: self._keep_flowing() or (
            self.airflow.runs(self.dag_id)[runs_before:] or [None])[0], RING_SECONDS, interval=0.1)
        self._flow_for(min(delay, 1.0))
        state = self.airflow.run(self.dag_id, run["dag_run_id"])["state"]
        kill_component(sid, "scheduler")
        return f"killed with the doorbell run {state}"

    def run_iteration(self, index: int, kind: str) -> IterationReport:
        started = time.monotonic()
        variant = self.strikes[index - 1][1]
        runs_before = len(self.airflow.runs(self.dag_id))
        landed = self.strike(kind, variant, runs_before)
        runs = self.catch_up(f"after iteration {index} ({kind})")
        report = IterationReport(index, kind, variant, retries=0, outcome=f"{runs - runs_before} doorbell run(s)",
                                 landed=landed, recovery_runs=runs - runs_before, recovered_by="the doorbell's runs")
        self.check(f"after iteration {index} ({kind}, {variant})")
        report.produced_so_far = self.producer.next_seq
        report.committed_offsets = sum(self.positions.values())
        report.seconds = round(time.monotonic() - started, 1)
        self.variants[kind][variant] += 1
        return report

    def run_all(self, progress: Callable[[str], None] = print) -> dict[str, Any]:
        self.session_started = time.monotonic()
        self.sessions += 1
        self.started_at = self.started_at or datetime.now(UTC).isoformat(timespec="seconds")
        self.producer = SequenceProducer(self.servers, self.topic, self.rate, landed=self.resumed_landed)
        self.airflow.wait_for_dag(self.dag_id, timeout=180)
        self.airflow.set_paused(self.dag_id, False)
        try:
            # A first ring before any fault: the doorbell's watcher is registered once the unpaused DAG is parsed.
            # Resumed, the same ring's runs also recover what the interruption left (a run killed mid-batch, its
            # batch open), like any fault, checked before the campaign goes on.
            self.producer.allow(10)
            if not self.iterations:
                self.catch_up("the first ring")
            else:
                runs_before = len(self.airflow.runs(self.dag_id))
                runs = self.catch_up(f"after resuming in session {self.sessions}")
                self.check(f"after resuming in session {self.sessions}")
                note = (f"session {self.sessions} resumed after iteration {len(self.iterations)}: "
                        f"{runs - runs_before} doorbell run(s), checks OK")
                self.interruptions.append(note)
                progress(note)
            for index, kind in enumerate(self.schedule, start=1):
                if index <= len(self.iterations):
                    continue  # done in an earlier session
                report = self.run_iteration(index, kind)
                self.iterations.append(report)
                self.checkpoint()
                progress(f"[{index}/{self.faults}] {kind} ({report.variant}): {report.landed}; {report.outcome}; "
                         f"checks OK; {report.produced_so_far} produced, {report.committed_offsets} committed, "
                         f"{report.seconds}s")
        finally:
            self.producer.stop()
            self.airflow.set_paused(self.dag_id, True)
        figures = self.final_check()
        progress(f"final check OK: {figures}")
        runs = self.airflow.runs(self.dag_id)
        return {
            "seed": self.seed,
            "faults_injected": len(self.iterations),
            "faults_by_kind": dict(Counter(it.fault for it in self.iterations)),
            "fault_variants": {k: dict(v) for k, v in self.variants.items()},
            "fault_landings": {k: dict(Counter(it.landed.split(" (")[0] for it in self.iterations if it.fault == k))
                               for k in self.kinds},
            **figures,
            "records_per_fault": self.records_per_fault,
            "rate": self.rate,
            "airflow": version("apache-airflow"),
            "partitions": len(self.positions),
            "pipeline_runs": len(runs),
            "runs_by_state": dict(Counter(r["state"] for r in runs)),
            "runtime": self.runtime,
            "shape": self.shape,
            "started_at": self.started_at,
            "elapsed_seconds": self.elapsed(),
            "sessions": self.sessions,
            "interruptions": self.interruptions,
            "iterations": [it.__dict__ for it in self.iterations],
        }
