"""A worker daemon killed (SIGKILL) in the middle of a PySpark job on the external service: the
job still returns Spark's result (the replica is read by default; with one replica the
producers rerun), and once the job is released and the dead worker is back, no partition file
is left on any store. The coordinator lists the Spark application; a driver holding a team's
client credential shuffles with its application's own."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from external_shuffle.local_cluster import LocalCluster
from external_shuffle.wire.credentials import Role, operator_token
from external_shuffle.wire.stubs import pb
from pyspark_shuffle import SparkShuffle
from shuffle_runtime.format.manifest import MANIFEST_FILE
from tests.integration.pausing import WAIT, paused, pausing, wait_for
from tests.integration.services import ShuffleService, external_service
from tests.integration.spark_rows import multiset

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

ROWS = 8_000
ONE_REPLICA = {"external-shuffle.replication-factor": 1}


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ShuffleService]:
    # Reads go to the workers, not their stores: a killed worker's data is then really gone.
    with LocalCluster(tmp_path_factory.mktemp("cluster"), workers=2) as cluster:
        made = external_service(cluster)
        made.settings["external-shuffle.client.read-from-store"] = False
        yield made


@pytest.fixture(scope="module")
def data(spark: SparkSession) -> DataFrame:
    frame: DataFrame = spark.range(0, ROWS, 1, 4).selectExpr(
        "id", "id % 41 as k", "concat('v', id) as s"
    )
    return frame.cache()


@pytest.fixture(autouse=True)
def _workers_back(service: ShuffleService) -> Iterator[None]:
    """A test that fails with a worker down does not take the next tests down with it."""
    yield
    assert service.cluster is not None
    for index in range(len(service.stores)):
        if not service.cluster.worker_running(index):
            service.cluster.start_worker(index)


def _partition_files(service: ShuffleService) -> set[str]:
    return {path for path in service.stored_paths() if Path(path).is_file()}


def _restart_and_check_clean(service: ShuffleService, worker: int) -> None:
    """The dead worker comes back; it deletes what nobody tracks any more."""
    assert service.cluster is not None
    service.cluster.start_worker(worker)
    deadline = time.monotonic() + WAIT
    while _partition_files(service) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _partition_files(service) == set()


def _worker_with_committed_maps(service: ShuffleService, maps: int) -> int:
    """Once ``maps`` map outputs are committed (each on one worker), a worker holding one."""
    deadline = time.monotonic() + WAIT
    while True:  # service.stores[i] is worker i's store
        committed = [len(list(store.rglob(MANIFEST_FILE))) for store in service.stores]
        if sum(committed) >= maps:
            return next(index for index, count in enumerate(committed) if count)
        if time.monotonic() > deadline:
            raise TimeoutError(f"{maps} map outputs never committed: {committed}")
        time.sleep(0.05)


def test_worker_killed_during_the_map_stage(
    spark: SparkSession, service: ShuffleService, data: DataFrame, tmp_path: Path
) -> None:
    assert service.cluster is not None
    ready, go = tmp_path / "ready", tmp_path / "go"
    with SparkShuffle(spark, config=service.config(**ONE_REPLICA)) as shuffle:
        made: dict[str, DataFrame] = {}
        mapping = threading.Thread(
            target=lambda: made.setdefault(
                "result", shuffle.repartition(paused(data, ready, go, 3), "k", num_partitions=3)
            )
        )
        mapping.start()
        wait_for(ready)  # map 3 waits
        victim = _worker_with_committed_maps(service, 3)
        service.cluster.kill_worker(victim)
        go.touch()
        mapping.join(timeout=300)
        result = made["result"]
        assert multiset(result) == multiset(data)
        [exchange] = shuffle.exchanges(result)
        assert sum(exchange.runs.per_map.values()) > 4  # producers on the victim reran
    _restart_and_check_clean(service, victim)


def test_worker_killed_during_the_reduce_stage_reruns_its_producers(
    spark: SparkSession, service: ShuffleService, data: DataFrame, tmp_path: Path
) -> None:
    assert service.cluster is not None
    ready, go = tmp_path / "ready", tmp_path / "go"
    with SparkShuffle(spark, config=service.config(**ONE_REPLICA)) as shuffle:
        # Reducer 1 waits before its input gate reads anything.
        result = shuffle.repartition_map(
            data, "k", pausing(ready, go, 1), data.schema, num_partitions=3
        )
        failure: list[BaseException] = []

        def collect() -> None:
            try:
                result.collect()
            except Exception as error:
                failure.append(error)

        reducing = threading.Thread(target=collect)
        reducing.start()
        wait_for(ready)
        service.cluster.kill_worker(1)
        go.touch()
        reducing.join(timeout=300)
        assert failure, "reading from a killed worker without a replica cannot succeed"
        assert "PartitionNotFoundError" in str(failure[0])
        recovered = shuffle.recover(result)
        assert multiset(recovered) == multiset(data)
    _restart_and_check_clean(service, 1)


def test_worker_killed_during_the_reduce_stage_reads_the_replica_by_default(
    spark: SparkSession, service: ShuffleService, data: DataFrame, tmp_path: Path
) -> None:
    assert service.cluster is not None
    ready, go = tmp_path / "ready", tmp_path / "go"
    with SparkShuffle(spark, config=service.config()) as shuffle:
        result = shuffle.repartition(data, "k", num_partitions=3)
        held = paused(result, ready, go, 1)
        counting: dict[str, object] = {}
        collecting = threading.Thread(target=lambda: counting.setdefault("rows", multiset(held)))
        collecting.start()
        wait_for(ready)
        service.cluster.kill_worker(0)
        go.touch()
        collecting.join(timeout=300)
        assert counting["rows"] == multiset(data)  # every partition read from its replica
        [exchange] = shuffle.exchanges(result)
        assert sum(exchange.runs.per_map.values()) == 4  # nothing reran
    _restart_and_check_clean(service, 0)


def test_the_coordinator_lists_the_spark_application_it_serves(
    spark: SparkSession, service: ShuffleService
) -> None:
    """An operator sees whose application it is: Spark's id, name and user."""
    assert service.cluster is not None
    context = spark.sparkContext
    with SparkShuffle(spark, config=service.config()):
        answer = service.cluster.coordinator_stub().ListApplications(
            pb.ListApplicationsRequest(), timeout=10
        )
    listed = {(e.identity.engine_id, e.identity.name, e.identity.user) for e in answer.applications}
    assert (context.applicationId, context.appName, context.sparkUser()) in listed
    assert context.applicationId and context.sparkUser()


def test_a_team_holding_a_client_credential_shuffles_as_its_own_application(
    spark: SparkSession, service: ShuffleService, data: DataFrame, tmp_path: Path
) -> None:
    """A driver given a client's credential, not the cluster's secret: its executors push and
    fetch with the application's credential the coordinator issued (the client's may not)."""
    assert service.cluster is not None
    secret = service.cluster.token_file.read_text().strip()
    credential_file = tmp_path / "team-credential"
    credential_file.write_text(operator_token(secret, Role.CLIENT, "team", int(time.time()) + 600))
    config = {**service.config(), "external-shuffle.auth.token-file": str(credential_file)}
    with SparkShuffle(spark, config=config) as shuffle:
        assert multiset(shuffle.repartition(data, "k")) == multiset(data)
