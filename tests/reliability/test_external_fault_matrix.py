"""The external service's fault matrix on real PySpark (local mode) and real daemons:
{kill -9, SIGTERM, restart} x {a worker, one of two coordinators, the only coordinator} x
{during the map stage's pushes, during the reduce stage's fetches}. In every cell the action
returns Spark's result with no call of the user's, and once the application is done (and what
was stopped is back) no file is left on any worker.

The workers: three, replication factor 2 (a partition outlives one worker; Spark cannot be told
that a worker lost a map output, so without a replica a reduce reading it fails). A fault
takes down the first worker or coordinator. "kill-9" and "sigterm" leave a worker, or one of two
coordinators, down for the rest of the action; the only coordinator comes back 3 s later, as a
supervisor (Kubernetes) restarts it. "restart" is kill -9 and back at once.

``python benchmarks/fault_matrix.py`` runs every cell and prints the table.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from external_shuffle.local_cluster import LocalCluster
from pyspark_shuffle import SparkShuffle
from tests.integration.pausing import WAIT, paused, pausing, wait_for
from tests.integration.spark_rows import multiset
from tests.reliability.external_cluster import partition_files

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

FAULTS = ("kill-9", "sigterm", "restart")
TARGETS = ("worker", "one-of-two-coordinators", "only-coordinator")
PHASES = ("map", "reduce")
ROWS = 6_000
SUPERVISOR_DELAY = 3.0


@dataclass(frozen=True, slots=True)
class Cell:
    fault: str
    target: str
    phase: str

    def __str__(self) -> str:
        return f"{self.fault} {self.target} during {self.phase}"


@dataclass(frozen=True, slots=True)
class Outcome:
    cell: str
    result: str  # "exact", or what went wrong
    seconds: float
    files_left: int


CELLS = [Cell(*values) for values in itertools.product(FAULTS, TARGETS, PHASES)]
_LOG = logging.getLogger(__name__)


class _Fault:
    """Applies a cell's fault to its cluster, and brings back what it took down."""

    def __init__(self, cluster: LocalCluster, cell: Cell) -> None:
        self._cluster = cluster
        self._cell = cell
        self._supervisor: threading.Timer | None = None

    def _down(self) -> None:
        cluster, worker = self._cluster, self._cell.target == "worker"
        if self._cell.fault == "sigterm":
            assert (cluster.stop_worker(0) if worker else cluster.stop_coordinator(0)) == 0
        elif worker:
            cluster.kill_worker(0)
        else:
            cluster.kill_coordinator(0)

    def _up(self) -> None:
        if self._cell.target == "worker":
            self._cluster.start_worker(0)
        else:
            self._cluster.start_coordinator(0)

    def apply(self) -> None:
        self._down()
        if self._cell.fault == "restart":
            self._up()
        elif self._cell.target == "only-coordinator":
            self._supervisor = threading.Timer(SUPERVISOR_DELAY, self._up)
            self._supervisor.start()

    def heal(self) -> None:
        """Everything taken down is running again."""
        if self._supervisor is not None:
            self._supervisor.join()
        elif self._cell.fault != "restart":
            self._up()


def _stored_files(cluster: LocalCluster) -> list[Path]:
    return [
        path
        for index in range(len(cluster.worker_ports))
        for path in partition_files(cluster, index)
    ]


def _files_left(cluster: LocalCluster) -> int:
    deadline = time.monotonic() + 30
    while _stored_files(cluster) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = _stored_files(cluster)
    if left:  # which partitions, and on which worker, for whoever reads the failure
        _LOG.warning("files left: %s", [str(path) for path in left])
    return len(left)


def _action(
    shuffle: SparkShuffle, data: DataFrame, cell: Cell, ready: Path, go: Path
) -> list[object]:
    """The action of the cell's job: a repartition whose map task 3, or reduce task 1, waits
    for the fault."""
    if cell.phase == "map":
        return [multiset(shuffle.repartition(paused(data, ready, go, 3), "k", num_partitions=3))]
    result = shuffle.repartition_map(
        data, "k", pausing(ready, go, 1), data.schema, num_partitions=3
    )
    return [multiset(result)]


def run_cell(spark: SparkSession, cell: Cell, directory: Path) -> Outcome:
    coordinators = 2 if cell.target == "one-of-two-coordinators" else 1
    settings = {
        "external-shuffle.worker.heartbeat-interval": 0.25,
        "external-shuffle.coordinator.worker-timeout": 3.0,
    }
    data = spark.range(0, ROWS, 1, 4).selectExpr("id", "id % 41 as k", "concat('v', id) as s")
    expected = multiset(data)
    ready, go = directory / "ready", directory / "go"
    started = time.monotonic()
    with LocalCluster(
        directory / "cluster", workers=3, coordinators=coordinators, settings=settings
    ) as cluster:
        config = cluster.client_config(
            **{
                "external-shuffle.replication-factor": 2,
                "external-shuffle.client.read-from-store": False,
                "external-shuffle.client.heartbeat-interval": 0.5,
            }
        )
        fault = _Fault(cluster, cell)
        outcome: list[object] = []
        with SparkShuffle(spark, config=config) as shuffle:

            def act() -> None:
                try:
                    outcome.extend(_action(shuffle, data, cell, ready, go))
                except Exception as error:
                    outcome.append(error)

            acting = threading.Thread(target=act)
            acting.start()
            wait_for(ready)
            fault.apply()
            go.touch()
            acting.join(timeout=WAIT)
            fault.heal()
        seconds = time.monotonic() - started
        files_left = _files_left(cluster)
    if not outcome:
        result = "no answer"
    elif isinstance(outcome[0], Exception):
        result = f"{type(outcome[0]).__name__}: {str(outcome[0])[:300]}"
    else:
        result = "exact" if outcome[0] == expected else "wrong rows"
    return Outcome(str(cell), result, round(seconds, 1), files_left)


@pytest.mark.parametrize("cell", CELLS, ids=str)
def test_fault_matrix_cell(spark: SparkSession, cell: Cell, tmp_path: Path) -> None:
    outcome = run_cell(spark, cell, tmp_path)
    assert outcome.result == "exact"
    assert outcome.files_left == 0
