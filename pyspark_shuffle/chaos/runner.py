"""Carrying out chaos runs on a ``local-cluster`` Spark application: each run's job through
pyshuffle on its service, its faults fired from a thread at their moments, the result compared
with Spark's own, the stores checked empty once the job's shuffle is closed, and every daemon
that went down without being taken down counted as a crash."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Final

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as sf

from pyspark_shuffle.chaos.connections import abort_connections
from pyspark_shuffle.chaos.disks import SmallDisk
from pyspark_shuffle.chaos.plans import (
    CONNECTION_FAULT,
    EXECUTOR_FAULTS,
    STORE_FAULT,
    FaultPlan,
    FaultRecord,
    RunOutcome,
    RunPlan,
)
from pyspark_shuffle.driver.session import SparkShuffle
from pyspark_shuffle.spark.compat import collected_arrow
from pyspark_shuffle.spark.local import executor_pids, python_worker_pids, wait_for_two_executors
from shuffle_api.testing import LocalDeployment

__all__ = ["SESSION_SETTINGS", "ChaosRunner", "stored_files"]

_LOG = logging.getLogger(__name__)

SESSION_SETTINGS: Final = {
    # Speculative copies of slow tasks: a straggler's copy must never duplicate rows.
    "spark.speculation": "true",
    "spark.speculation.interval": "200ms",
    "spark.speculation.multiplier": "2",
    "spark.speculation.quantile": "0.5",
    # Up to three faults a run may fail a task that often.
    "spark.task.maxFailures": "8",
}
"""The chaos application's Spark settings, over ``local_cluster_session``'s."""
_STRAGGLER_SECONDS: Final = 2.0
_EMPTY_WAIT_SECONDS: Final = 30.0
_EXECUTORS_WAIT_SECONDS: Final = 120.0
_KEYS: Final = 97
_RESTART_ATTEMPTS: Final = 3


def stored_files(local_directory: Path) -> list[str]:
    """Files under the default service's stores below a Spark local directory (each
    executor's ``pyshuffle`` directory). Spark deletes directories there at any moment:
    ``os.walk`` passes over one that goes during the walk (``Path.glob`` raises)."""
    return sorted(
        os.path.join(directory, name)
        for directory, _, names in os.walk(local_directory)
        if "pyshuffle" in Path(directory).parts
        for name in names
        if not name.startswith(".")
    )


def _canonical_rows(table: pa.Table) -> Counter[Hashable]:
    return Counter(tuple(row.values()) for row in table.to_pylist())


def _per_group(table: pa.Table) -> pa.Table:
    """A Python function per group: its key, rows and total (exact: x holds whole numbers)."""
    return pa.table(
        {
            "k": table.column("k").slice(0, 1),
            "n": pa.array([table.num_rows], pa.int64()),
            "total": pa.array([pa.compute.sum(table.column("x")).as_py() or 0.0], pa.float64()),
        }
    )


def _straggling(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Map task 0's first attempt sleeps: Spark's speculation starts a copy of it."""
    from pyspark import TaskContext  # noqa: PLC0415 (in the Python worker)

    task = TaskContext.get()
    if task is not None and task.partitionId() == 0 and task.attemptNumber() == 0:
        time.sleep(_STRAGGLER_SECONDS)
    yield from batches


class _Faults(threading.Thread):
    """Fires a run's faults at their moments; after the job, those left at once. A fault that
    lasts is ended by a timer (:meth:`wait_for_endings` waits for them all)."""

    def __init__(self, runner: ChaosRunner, plan: RunPlan) -> None:
        super().__init__(name=f"chaos-faults-{plan.seed}", daemon=True)
        self._runner = runner
        self._plan = plan
        self.phase = "map"
        self.records: list[FaultRecord] = []
        self.taken_down: set[str] = set()
        self.unclean_stops: list[str] = []
        self._endings: list[threading.Timer] = []
        self._job_done = threading.Event()
        self._begun = time.monotonic()

    def run(self) -> None:
        for fault in self._plan.faults:
            self._job_done.wait(max(0.0, self._begun + fault.at - time.monotonic()))
            phase = "after" if self._job_done.is_set() else self.phase
            try:
                target = self._fire(fault)
            except Exception as error:  # a fault that cannot be fired is logged, not fatal
                _LOG.warning("fault %s of run %d not fired: %s", fault, self._plan.seed, error)
                target = ""
            self.records.append(FaultRecord(fault.kind, phase, target))

    def job_done(self) -> None:
        self._job_done.set()

    def _fire(self, fault: FaultPlan) -> str:
        if fault.kind in EXECUTOR_FAULTS:
            return self._executor_fault(fault)
        if fault.kind == STORE_FAULT:
            return self._fill_store(fault)
        return self._daemon_fault(fault)

    def _executor_fault(self, fault: FaultPlan) -> str:
        if fault.kind == "python-worker-kill":
            workers = python_worker_pids()
            if not workers:
                return ""
            pid = workers[fault.target % len(workers)]
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            return f"python worker {pid}"
        pids = executor_pids(self._runner.spark.sparkContext.applicationId)
        if not pids:
            return ""
        executor = sorted(pids)[fault.target % len(pids)]
        if fault.kind == "executor-stall":
            self._stop_for(pids[executor], fault.down_for)
        else:
            os.kill(
                pids[executor], signal.SIGKILL if fault.kind == "executor-kill" else signal.SIGTERM
            )
        return f"executor {executor}"

    def _fill_store(self, fault: FaultPlan) -> str:
        disks = self._runner.small_disks.get(self._plan.service, ())
        if not disks:
            return ""
        disk = disks[fault.target % len(disks)]
        disk.fill()
        self._end_later(fault.down_for, disk.free)
        return f"store {disk.directory.name}"

    def _daemon_fault(self, fault: FaultPlan) -> str:
        deployment = self._runner.deployments[self._plan.service]
        running = [name for name in deployment.daemons if deployment.running(name)]
        if not running:
            return ""
        daemon = running[fault.target % len(running)]
        if fault.kind == CONNECTION_FAULT:
            return f"{daemon} ({abort_connections(deployment.ports(daemon))} sockets)"
        if fault.kind == "daemon-stall":
            pid = deployment.process_id(daemon)
            if pid is None:
                return ""
            self._stop_for(pid, fault.down_for)
            return daemon
        self.taken_down.add(daemon)
        if fault.kind == "daemon-term":
            status = deployment.terminate(daemon)
            if status != 0:
                self.unclean_stops.append(f"{daemon} (exit {status} on SIGTERM)")
        else:
            deployment.kill(daemon)
        if fault.kind == "daemon-restart":
            deployment.restart(daemon)
        else:
            self._end_later(fault.down_for, self._supervise, deployment, daemon)
        return daemon

    def _stop_for(self, pid: int, seconds: float) -> None:
        """``pid`` stopped (SIGSTOP) and, ``seconds`` later, going on."""
        os.kill(pid, signal.SIGSTOP)
        self._end_later(seconds, _resume, pid)

    def _end_later(self, seconds: float, ending: Callable[..., None], *arguments: object) -> None:
        timer = threading.Timer(seconds, ending, arguments)
        self._endings.append(timer)
        timer.start()

    @staticmethod
    def _supervise(deployment: LocalDeployment, daemon: str) -> None:
        """A supervisor's restart; one that fails is left to the run's healing."""
        try:
            deployment.restart(daemon)
        except Exception as error:
            _LOG.warning("the supervisor could not start %s again: %s", daemon, error)

    def wait_for_endings(self) -> None:
        for ending in self._endings:
            ending.join()


def _resume(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGCONT)


class ChaosRunner:
    """Runs plans one after another on ``spark`` (a ``local-cluster`` session, its local
    directory under ``work``), with ``deployments`` (by service) for the services with
    daemons, started already, and ``small_disks`` (by service): the small filesystems its
    stores are on, which the store-full fault fills."""

    def __init__(
        self,
        spark: SparkSession,
        work: Path,
        deployments: Mapping[str, LocalDeployment],
        small_disks: Mapping[str, Sequence[SmallDisk]],
        settings: Mapping[str, object] | None = None,
    ) -> None:
        self.spark = spark
        self._local = work / "local"
        self.deployments = deployments
        self.small_disks = small_disks
        self._settings = {"pyspark-shuffle.progress.interval": "0", **(settings or {})}

    def run(self, plan: RunPlan) -> RunOutcome:
        """``plan`` carried out; a run the harness itself could not carry out (a daemon or
        an executor that would not come back) is a failed one, named so."""
        started = time.monotonic()
        try:
            return self._run(plan, started)
        except Exception as error:
            _LOG.exception("run %d could not be carried out", plan.seed)
            seconds = round(time.monotonic() - started, 1)
            return RunOutcome(plan, f"failed: harness: {_first_line(error)}", seconds, 0, (), ())

    def _run(self, plan: RunPlan, started: float) -> RunOutcome:
        self._heal(plan.service)
        frame = self._input(plan)
        dimension = self.spark.range(0, _KEYS + 10, 1, 2).selectExpr("id as k", "id * 10 as w")
        expected = self._expected(plan, frame, dimension)
        faults = _Faults(self, plan)
        crashed: list[str] = []
        with SparkShuffle(self.spark, config=self._config(plan)) as shuffle:
            faults.start()
            try:
                result = self._through_pyshuffle(plan, shuffle, frame, dimension, faults)
            finally:
                faults.job_done()
                faults.join()
                faults.wait_for_endings()
                crashed = self._crashed(plan.service, faults)
                self._heal(plan.service)
        files = self._files_left(plan.service)
        outcome = RunOutcome(
            plan,
            result if isinstance(result, str) else ("exact" if result == expected else "wrong"),
            round(time.monotonic() - started, 1),
            len(files),
            tuple(crashed),
            tuple(faults.records),
        )
        if not outcome.sound:
            _LOG.warning("run %d: %s; files left %s", plan.seed, outcome.result, files[:10])
        return outcome

    # --- the job ------------------------------------------------------------------------------

    def _input(self, plan: RunPlan) -> DataFrame:
        frame = self.spark.range(0, plan.rows, 1, plan.map_tasks).selectExpr(
            "id",
            f"case when id % 11 = 0 then null else id % {_KEYS} end as k",
            "cast(id % 13 as double) * (case when id % 2 = 0 then -1.0 else 1.0 end) as x",
            "concat('v', id) as s",
        )
        if plan.straggler:
            frame = frame.mapInArrow(_straggling, frame.schema)
        return frame

    def _expected(
        self, plan: RunPlan, frame: DataFrame, dimension: DataFrame
    ) -> Counter[Hashable] | list[tuple[object, ...]]:
        """Spark's own answer, before any fault."""
        if plan.operation == "sort":
            return [
                tuple(row.values()) for row in collected_arrow(frame.orderBy("x", "id")).to_pylist()
            ]
        spark_result = {
            "repartition": lambda: frame,
            "group_apply": lambda: frame.groupBy("k").agg(
                sf.count(sf.lit(1)).alias("n"), sf.coalesce(sf.sum("x"), sf.lit(0.0)).alias("total")
            ),
            "join": lambda: frame.join(dimension, "k", "inner"),
        }[plan.operation]()
        return _canonical_rows(collected_arrow(spark_result))

    def _through_pyshuffle(
        self,
        plan: RunPlan,
        shuffle: SparkShuffle,
        frame: DataFrame,
        dimension: DataFrame,
        faults: _Faults,
    ) -> Counter[Hashable] | list[tuple[object, ...]] | str:
        """pyshuffle's answer, or "failed: ..." if the job failed and so did ``recover``."""
        operations: dict[str, Callable[[], DataFrame]] = {
            "repartition": lambda: shuffle.repartition(frame, "k", num_partitions=plan.reducers),
            "group_apply": lambda: shuffle.group_apply(
                frame, "k", _per_group, "k long, n long, total double"
            ),
            "join": lambda: shuffle.join(frame, dimension, "k", "inner", broadcast="none"),
            "sort": lambda: shuffle.sort(frame, ["x", "id"]),
        }
        try:
            result = operations[plan.operation]()  # runs the map stage
        except Exception as error:
            return f"failed: {_first_line(error)}"
        faults.phase = "reduce"
        try:
            return self._answer(plan, shuffle, result)
        except Exception as error:  # the user's remedy: recover, then the action again
            _LOG.info("run %d: the action failed (%s); recovering", plan.seed, _first_line(error))
        try:
            return self._answer(plan, shuffle, shuffle.recover(result))
        except Exception as error:
            return f"failed: {_first_line(error)}"

    @staticmethod
    def _answer(
        plan: RunPlan, shuffle: SparkShuffle, result: DataFrame
    ) -> Counter[Hashable] | list[tuple[object, ...]]:
        if plan.operation == "sort":
            return [tuple(row.values()) for row in shuffle.to_arrow(result).to_pylist()]
        return _canonical_rows(collected_arrow(result))

    def _config(self, plan: RunPlan) -> dict[str, object]:
        if plan.service not in self.deployments:
            return {**self._settings, "shuffle-service-factory.class": plan.service}
        return self.deployments[plan.service].client_config(
            **self._settings,
            **{
                "external-shuffle.replication-factor": plan.replicas,
                # As on separate hosts: reads go to the workers, never to their stores' files.
                "external-shuffle.client.read-from-store": False,
                "external-shuffle.client.heartbeat-interval": 0.5,
            },
        )

    # --- after the job ------------------------------------------------------------------------

    def _crashed(self, service: str, faults: _Faults) -> list[str]:
        """Daemons down that no fault took down, and daemons that stopped uncleanly."""
        deployment = self.deployments.get(service)
        if deployment is None:
            return list(faults.unclean_stops)
        down = [
            name
            for name in deployment.daemons
            if name not in faults.taken_down and not deployment.running(name)
        ]
        return down + faults.unclean_stops

    def _heal(self, service: str) -> None:
        """Every daemon of the service running, and two executors."""
        deployment = self.deployments.get(service)
        if deployment is not None:
            for name in deployment.daemons:
                for attempt in range(_RESTART_ATTEMPTS):
                    if deployment.running(name):
                        break
                    try:
                        deployment.restart(name)
                    except Exception as error:  # a port the killed one held, not yet free
                        if attempt == _RESTART_ATTEMPTS - 1:
                            raise
                        _LOG.warning("%s did not start again (%s); retrying", name, error)
        wait_for_two_executors(self.spark, _EXECUTORS_WAIT_SECONDS)

    def _stored(self, service: str) -> list[str]:
        deployment = self.deployments.get(service)
        return stored_files(self._local) + ([] if deployment is None else deployment.stored_files())

    def _files_left(self, service: str) -> list[str]:
        deadline = time.monotonic() + _EMPTY_WAIT_SECONDS
        while (left := self._stored(service)) and time.monotonic() < deadline:
            time.sleep(0.2)
        return left


def _first_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0][:300] if lines else ''}"
